"""Named test environments: each one an edge case the runner must get right (and
``EpisodeLog``, the callbacks that record what episodes went through)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import rlconnect as rc


class EpisodeLog(rc.Callbacks):
    """Records each episode's start and its end (length and total reward), in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_episode_start(self, *, episode, env_index, **kwargs) -> None:
        self.events.append(("start", env_index, episode.episode_id))

    def on_episode_end(self, *, episode, env_index, **kwargs) -> None:
        self.events.append(
            ("end", env_index, episode.episode_id, episode.length, episode.total_reward)
        )


class CounterEnv(gym.Env):
    """obs = [episode_no, t, last_action]; reward = 1 + action; ends after ``length`` steps.

    Every transition can be checked in closed form: ``new_obs == [ep, t + 1, action]``.
    ``fail_at`` makes ``step`` raise at that global step count (a flaky simulator).
    """

    def __init__(
        self, length: int = 5, truncate: bool = False, fail_at: int | None = None, n_actions=3
    ) -> None:
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(n_actions)
        self.length = length
        self.truncate = truncate
        self.fail_at = fail_at
        self.steps = 0
        self.episode = -1
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return np.array([self.episode, 0, -1], np.float32), {"reset": True}

    def step(self, action):
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            raise RuntimeError(f"simulated crash at step {self.steps}")
        assert self.action_space.contains(action)
        self.t += 1
        done = self.t >= self.length
        obs = np.array([self.episode, self.t, action], np.float32)
        term, trunc = (False, done) if self.truncate else (done, False)
        return obs, 1.0 + float(action), term, trunc, {"t": self.t}


class TurnTakingEnv(rc.MultiAgentEnv):
    """Three agents: ``a`` acts every step, ``b`` every second step, ``c`` joins at t=2
    and leaves (terminated) at t=4; ``b`` is rewarded every step, also while not acting;
    the episode ends (``__all__`` terminated) at t=6 with only ``a`` given a final obs.
    """

    possible_agents = ["a", "b", "c"]

    def __init__(self) -> None:
        box = gym.spaces.Box(-100, 100, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.t = 0

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([ord(agent) - ord("a"), self.t], np.float32)

    def _acting(self) -> list[str]:
        agents = ["a"]
        if self.t % 2 == 0:
            agents.append("b")
        if 2 <= self.t < 4:
            agents.append("c")
        return agents

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {a: self._obs(a) for a in self._acting()}, {}

    def step(self, actions: dict):
        self.t += 1
        rewards = {"a": 1.0, "b": 0.5}
        if "c" in actions:
            rewards["c"] = 2.0
        term: dict[str, Any] = {"__all__": self.t >= 6}
        if self.t == 4:
            obs = {a: self._obs(a) for a in self._acting()}
            obs["c"] = self._obs("c")
            term["c"] = True
            return obs, rewards, term, {"__all__": False}, {}
        if self.t >= 6:
            return {"a": self._obs("a")}, rewards, term, {"__all__": False}, {}
        return {a: self._obs(a) for a in self._acting()}, rewards, term, {"__all__": False}, {}


def trajectories(batch: rc.SampleBatch) -> list[rc.SampleBatch]:
    """Split a batch at every change of (eps_id, agent_index): trajectories are contiguous."""
    key = batch["eps_id"] * 1000 + batch["agent_index"]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    stops = np.r_[starts[1:], len(key)]
    return [batch[a:b] for a, b in zip(starts, stops)]
