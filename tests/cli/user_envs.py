"""Env creators a user keeps in their working folder (copied there by the tests)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


def cartpole():
    """Zero arguments, as ``lambda: gym.make(...)`` would be."""
    return gym.make("CartPole-v1")


def cartpole_ctx(ctx):
    """One argument, the env context."""
    return gym.make("CartPole-v1")


def two_args(a, b):
    return gym.make("CartPole-v1")


class Pixels(gym.Env):
    """Image observations (uint8 frames), so the CLI hints at ``--preset``."""

    observation_space = gym.spaces.Box(0, 255, (48, 48, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 10, False, {}


def pixels():
    return Pixels()


SPACES = {
    "scout_0": (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2)),
    "scout_1": (gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2)),
    "base": (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(3)),
}


class Mixed(ParallelEnv):
    """Two scouts share spaces; the base has its own: two default policies."""

    metadata = {"name": "mixed_v0"}
    possible_agents = ["scout_0", "scout_1", "base"]

    def __init__(self):
        self.agents = []

    def observation_space(self, agent):
        return SPACES[agent][0]

    def action_space(self, agent):
        return SPACES[agent][1]

    def _obs(self):
        return {a: np.zeros(self.observation_space(a).shape, np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= 5
        obs = self._obs()
        rewards = dict.fromkeys(self.agents, 1.0)
        flags = dict.fromkeys(self.agents, done)
        infos = {a: {} for a in self.agents}
        trunc = dict.fromkeys(self.agents, False)
        if done:
            self.agents = []
        return obs, rewards, flags, trunc, infos


def mixed():
    return Mixed()


class Slow(gym.Env):
    """20 ms a step: one batch of 150 steps takes 3 s."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        time.sleep(0.02)
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 50, False, {}


def slow():
    return Slow()


class Duel(ParallelEnv):
    """Zero-sum: ``winner`` gets +1 a step, ``loser`` -1, for 4 steps; returns sum to 0."""

    metadata = {"name": "duel_v0"}
    possible_agents = ["winner", "loser"]

    def __init__(self):
        self.agents = []

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _obs(self):
        return {a: np.zeros(2, np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        done = self.t >= 4
        obs, rewards = self._obs(), {"winner": 1.0, "loser": -1.0}
        flags = dict.fromkeys(self.agents, done)
        trunc = dict.fromkeys(self.agents, False)
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, trunc, infos


def duel():
    return Duel()


def no_env():
    """Returns something that is not an env (a usage error, as ``os:getcwd`` would be)."""
    return "not an env"
