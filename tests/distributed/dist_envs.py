"""Envs and helpers for the RunnerGroup tests, at module level so Ray actors can import them.

``CountingEnv`` observes ``[seed, episode, t, last_action]``: every transition can be
checked in closed form (``new_obs == [seed, episode, t + 1, action]``), and ``seed`` tells
which sub-env of which runner produced a row. Every observation it returns is logged, so a
test can compute by hand what one filter fed all the data would hold.

Faults follow a fixed schedule from ``env_config`` (no probabilities):
``crash_worker`` (runner index), ``crash_at`` (its sub-env 0's step count), ``crash_mode``
("exit": the process dies, as a segfault would; "raise": step raises; "hang": step sleeps
``hang_s``), ``marker`` (a file path: crash only while it does not exist, and create it,
so a restarted runner runs clean).
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

import rlconnect as rc

DISCRETE3 = gym.spaces.Discrete(3)


class CountingEnv(gym.Env):
    def __init__(self, ctx: Any = None) -> None:
        ctx = ctx or rc.EnvContext()
        self.observation_space = gym.spaces.Box(-1e12, 1e12, (4,), np.float64)
        self.action_space = gym.spaces.Discrete(3)
        self.ctx = ctx
        cfg = dict(ctx.config)
        self.length = cfg.get("length", 6)
        self.sleep = cfg.get("sleep", 0.0)
        self.crash = (
            cfg.get("crash_worker") == ctx.worker_index
            and ctx.vector_index == 0
            and cfg.get("crash_at") is not None
        )
        self.crash_at = cfg.get("crash_at")
        self.crash_mode = cfg.get("crash_mode", "exit")
        self.marker = cfg.get("marker")
        #: runner 1 writes this file when it steps and the file is not there: a test
        #: removes it, starts sampling, and waits for it to know a sample is under way
        self.stepping = cfg.get("stepping") if ctx.worker_index == 1 else None
        self.hang_s = cfg.get("hang_s", 30.0)
        self.tag = -1.0
        self.episode = -1
        self.t = 0
        self.steps = 0
        self.log: list[np.ndarray] = []

    def _obs(self, action: int) -> np.ndarray:
        obs = np.array([self.tag, self.episode, self.t, action], np.float64)
        self.log.append(obs)
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.tag = float(seed)
        self.episode += 1
        self.t = 0
        return self._obs(-1), {}

    def step(self, action):
        self.steps += 1
        if self.stepping is not None and not os.path.exists(self.stepping):
            with open(self.stepping, "w") as f:
                f.write("stepping\n")
        if self.sleep:
            time.sleep(self.sleep)
        if self.crash and self.steps == self.crash_at:
            self._fault()
        self.t += 1
        return self._obs(int(action)), 1.0, self.t >= self.length, False, {}

    def _fault(self) -> None:
        if self.marker is not None:
            if os.path.exists(self.marker):
                return
            with open(self.marker, "w") as f:
                f.write("crashed once\n")
        if self.crash_mode == "exit":
            os._exit(1)
        if self.crash_mode == "hang":
            time.sleep(self.hang_s)
            return
        raise RuntimeError(f"simulated crash at step {self.steps}")


def make_env(ctx: Any) -> CountingEnv:
    return CountingEnv(ctx)


def env_logs(runner: Any) -> list[np.ndarray]:
    """Every observation the runner's sub-envs returned, one array per sub-env."""
    return [np.array(e.log).reshape(-1, 4) for e in runner.env.envs]


def reference_filter(logs: list[np.ndarray]) -> Any:
    """One MeanStdFilter fed every observation in ``logs`` (what a group's filters saw, each
    once, e.g. ``env_logs`` of every runner): the reference for filter sync tests."""
    obs = np.concatenate(logs) if logs else np.zeros((0, 4))
    ref = rc.MeanStdFilter(rc.ConnectorContext(CountingEnv().observation_space, DISCRETE3))
    ref(rc.AgentData(np.zeros(len(obs), int), [0] * len(obs), {"obs": obs}))
    return ref


def first_of_each_sub_env(rows: Any) -> np.ndarray:
    """Rows whose obs the env returned in the runner's previous sample() call: the first row
    of each sub-env (in truncate_episodes mode the step that ended the previous batch polled
    it; rows come ordered by episode, oldest first)."""
    first = np.zeros(len(rows), bool)
    first[np.unique(rows["env_id"], return_index=True)[1]] = True
    return first


def worker_index(runner: Any) -> int:
    return runner.config.worker_index


class TwoAgentEnv(rc.MultiAgentEnv):
    """Agents ``a`` and ``b`` both act every step; each observes
    ``[agent, seed, episode, t, own last action]``, so every transition can be checked."""

    possible_agents = ["a", "b"]

    def __init__(self, ctx: Any = None) -> None:
        box = gym.spaces.Box(-1e12, 1e12, (5,), np.float64)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(3))
        self.length = dict((ctx or rc.EnvContext()).config).get("length", 4)
        self.tag, self.episode, self.t = -1.0, -1, 0

    def _obs(self, actions: dict) -> dict:
        return {
            a: np.array([i, self.tag, self.episode, self.t, actions.get(a, -1)], np.float64)
            for i, a in enumerate(self.possible_agents)
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.tag = float(seed)
        self.episode += 1
        self.t = 0
        return self._obs({}), {}

    def step(self, actions: dict):
        self.t += 1
        done = self.t >= self.length
        rewards = dict.fromkeys(actions, 1.0)
        return self._obs(actions), rewards, {"__all__": done}, {"__all__": False}, {}


def make_two_agent_env(ctx: Any) -> TwoAgentEnv:
    return TwoAgentEnv(ctx)


def map_agent(agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
    """Agent ``a`` -> policy ``pa``, ``b`` -> ``pb``."""
    return f"p{agent_id}"


class ConstantAction(rc.ColumnActionConnector):
    """Replaces every action by 2 (so the env's logged action shows the pipeline ran)."""

    def transform(self, value: Any) -> Any:
        return np.full_like(np.asarray(value), 2)


def half_reward_pipeline(ctx: Any) -> Any:
    """Agent pipeline ``ctx -> pipeline``: rewards clipped to 0.5."""
    return rc.AgentConnectorPipeline(ctx, [rc.ClipReward(ctx, limit=0.5)])


def constant_action_pipeline(ctx: Any) -> Any:
    """Action pipeline ``ctx -> pipeline``: the env always gets action 2."""
    return rc.ActionConnectorPipeline(ctx, [ConstantAction(ctx)])


def gae_pipeline(ctx: Any) -> Any:
    """A learner pipeline each runner builds for itself (module level: it pickles)."""
    return [rc.GAE(ctx, gamma=0.9, lambda_=0.8)]


def make_tensor_env(ctx: Any) -> Any:
    """A batched tensor simulator, built on the device of the process that calls it (CPU
    here): every runner, local or remote, takes the tensor path with its own."""
    from rlconnect.envs import BatchedCartPole

    return BatchedCartPole(4, device="cpu", autoreset_mode="same_step")
