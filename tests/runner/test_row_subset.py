"""RowSubset: the policy inputs of the rows that go on, taken column by column when read."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
from cases import CounterEnv

import rlconnect as rc
from rlconnect.runner.acting import RowSubset


def test_row_subset_is_the_columns_at_the_rows_without_infos():
    cols = {
        "obs": np.arange(12.0).reshape(4, 3),
        "t": np.arange(4),
        "nest": {"a": np.arange(4) * 10},
        "infos": [{}, {"x": 1}, {}, {}],
    }
    sub = RowSubset(cols, np.array([1, 3]))
    assert list(sub) == ["obs", "t", "nest"] and len(sub) == 3
    assert "infos" not in sub and "missing" not in sub and "t" in sub
    np.testing.assert_array_equal(sub["obs"], cols["obs"][[1, 3]])
    np.testing.assert_array_equal(sub["nest"]["a"], [10, 30])
    assert sub["t"] is sub["t"]  # taken once
    assert dict(sub).keys() == {"obs", "t", "nest"}


class Recording(rc.RandomPolicy):
    """Records the columns and row counts of every call."""

    calls: ClassVar[list[tuple[list[str], int, int]]] = []

    def compute_actions(self, input_batch, explore=True):
        n = len(input_batch["obs"])
        Recording.calls.append((sorted(input_batch), n, len(input_batch["t"])))
        return super().compute_actions(input_batch, explore)


def test_policy_sees_only_the_rows_that_go_on_with_every_column():
    env = CounterEnv(length=3)
    Recording.calls.clear()
    runner = rc.EnvRunner(
        lambda ctx: CounterEnv(length=2 + ctx.vector_index),  # episodes end apart
        Recording(env.observation_space, env.action_space, seed=0),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=6, seed=0),
    )
    batch = runner.sample()
    assert len(batch) == 12
    sizes = [n for _, n, _ in Recording.calls]
    assert 0 not in sizes and set(sizes) == {1, 2}  # 1: the other sub-env's episode ended
    assert all(n == t for _, n, t in Recording.calls)
    # every column but infos (a poll where every row goes on hands over its AgentData whole)
    assert {tuple(k for k in keys if k != "infos") for keys, _, _ in Recording.calls} == {
        ("obs", "rewards", "t", "terminateds", "truncateds")
    }


def test_row_count_is_known_without_taking_a_column():
    cols = {"obs": np.arange(12.0).reshape(4, 3), "t": np.arange(4)}
    sub = RowSubset(cols, np.array([0, 2, 3]))
    assert sub.num_rows == 3
    policy = rc.RandomPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), seed=0)
    actions, _, _ = policy.compute_actions(sub)
    assert actions.shape == (3,)
    assert sub._taken == {}  # RandomPolicy only needs the count: no column was copied
