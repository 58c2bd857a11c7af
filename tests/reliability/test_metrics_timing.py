"""When ``get_metrics()`` reports an episode, relative to the batch holding its last row
(documented in docs/metrics.md, "When an episode is reported")."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

pytestmark = pytest.mark.reliability

CARTPOLE = gym.make("CartPole-v1")


def report_lag(num_envs: int, mode: str, samples: int = 60) -> tuple[list[int], int]:
    """Per reported episode: (sample of its last row) - (sample of its record)."""
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.RandomPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, seed=0),
        config=rc.RunnerConfig(
            num_envs=num_envs, rollout_fragment_length=7, seed=0, batch_mode=mode
        ),
    )
    last_row, reported = {}, {}
    for k in range(samples):
        batch = runner.sample()
        done = batch["terminateds"] | batch["truncateds"]
        for e in np.asarray(batch["eps_id"])[done].tolist():
            last_row[e] = k
        for m in runner.get_metrics():
            reported[m["episode_id"]] = k
    # one more sample() hands out the rows still buffered (the last records' last rows)
    batch = runner.sample()
    done = batch["terminateds"] | batch["truncateds"]
    for e in np.asarray(batch["eps_id"])[done].tolist():
        last_row.setdefault(e, samples)
    lags = [last_row[e] - k for e, k in reported.items() if e in last_row]
    return lags, len(reported)


@pytest.mark.parametrize(("num_envs", "mode"), [(1, "truncate_episodes"), (4, "complete_episodes")])
def test_a_record_comes_with_its_last_row(num_envs, mode):
    lags, reported = report_lag(num_envs, mode)
    assert reported > 20 and len(lags) == reported
    assert set(lags) == {0}


def test_with_several_sub_envs_a_record_can_come_one_sample_early_never_more():
    lags, reported = report_lag(4, "truncate_episodes")
    assert reported > 50 and len(lags) == reported
    assert set(lags) == {0, 1}  # early by one sample() at most; never late
