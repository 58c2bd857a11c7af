"""Episodes a simulator abandons leave nothing behind once the episode timeout closes them."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.envs import EpisodeError, ExternalEnv

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
STACKED = gym.spaces.Box(-10, 10, (2, 3), np.float32)


class Abandoner(ExternalEnv):
    """Serves ``n`` eval episodes (two actions each) and abandons them, waits past the
    timeout, then plays one recorded episode to the end."""

    def __init__(self, n: int, **kw) -> None:
        super().__init__(ACT, OBS, episode_timeout_s=0.2, **kw)
        self.n = n

    def run(self) -> None:
        for k in range(self.n):
            eid = self.start_episode(f"eval{k}", training_enabled=False)
            for t in range(2):
                self.get_action(eid, np.full(3, t, np.float32))
        deadline = time.monotonic() + 30  # the runner's polls expire the eval episodes
        while len(self.timed_out_episodes) < self.n and time.monotonic() < deadline:
            time.sleep(0.01)
        eid = self.start_episode("train")
        for t in range(3):
            self.get_action(eid, np.full(3, t, np.float32))
            self.log_returns(eid, 1.0)
        self.end_episode(eid, np.zeros(3, np.float32))


def frame_table(runner: rc.EnvRunner):
    (stack,) = [
        c for c in runner.agent_pipeline("default_policy") if type(c).__name__ == "FrameStack"
    ]
    return stack._slots


def test_abandoned_eval_episodes_drop_their_connector_state():
    env = Abandoner(3)
    config = rc.RunnerConfig(
        framestack=2, batch_mode="complete_episodes", rollout_fragment_length=3
    )
    runner = rc.EnvRunner(lambda ctx: env, rc.MLPPolicy(STACKED, ACT, seed=0), config=config)
    batch = runner.sample()
    assert len(batch) == 3 and batch["terminateds"].tolist() == [False, False, True]
    assert env.timed_out_episodes == ["eval0", "eval1", "eval2"]
    table = frame_table(runner)
    eval_keys = [(-2 - k, rc.DEFAULT_AGENT_ID) for k in range(3)]
    assert not any(key in table for key in eval_keys)  # their frame stacks were freed
    assert len(table) <= 1  # at most the recorded episode's lane
    runner.stop()


def test_timed_out_ids_are_bounded(monkeypatch):
    monkeypatch.setattr("rlconnect.envs.external.hub._MAX_IDS", 2)  # the bound, made small
    env = ExternalEnv(ACT, OBS, episode_timeout_s=0.0)
    for k in range(4):
        env.start_episode(k)
        env.hub.expire(time.monotonic() + 1.0)
    assert env.timed_out_episodes == [2, 3]
    for k in (2, 3):  # remembered: their ids stay taken
        with pytest.raises(EpisodeError, match="already in use"):
            env.start_episode(k)
    assert env.start_episode(0) == 0  # forgotten: the id is free again
