"""``DeployedPolicy.compute_actions`` on several rows against one ``compute_action`` per
row: discrete actions equal, continuous ones within the bound docs/deploying.md states."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

#: docs/deploying.md: |batched - single| <= BOUND * max(1, |single|)
BOUND = 1e-5


def _deployed(env_id: str, tmp_path) -> rc.DeployedPolicy:
    env = gym.make(env_id)
    config = rc.RunnerConfig(num_envs=2, seed=0, observation_filter="MeanStdFilter")
    runner = rc.EnvRunner(
        env_id, rc.MLPPolicy(env.observation_space, env.action_space, seed=0), config=config
    )
    runner.sample()
    rc.export_policy(runner, tmp_path / "p")
    runner.stop()
    return rc.load_policy(tmp_path / "p")


@pytest.mark.parametrize("rows", [2, 64, 5_000])
def test_continuous_actions_are_within_the_documented_bound(tmp_path, rows: int) -> None:
    policy = _deployed("Pendulum-v1", tmp_path)
    obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 3)).astype(np.float32)
    batched = np.asarray(policy.compute_actions(obs), np.float64).reshape(rows, -1)
    single = np.stack([np.asarray(policy.compute_action(o), np.float64) for o in obs])
    single = single.reshape(rows, -1)
    assert np.all(np.abs(batched - single) <= BOUND * np.maximum(1.0, np.abs(single)))


def test_discrete_actions_are_equal(tmp_path) -> None:
    policy = _deployed("CartPole-v1", tmp_path)
    obs = np.random.default_rng(0).normal(0, 0.5, (500, 4)).astype(np.float32)
    assert policy.compute_actions(obs) == [policy.compute_action(o) for o in obs]
