"""Column roles (rlconnect.batches.columns) as the collectors and readers use them."""

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.batches.columns import (
    EMPTY_INFO,
    NEXT_OBS_OF,
    NEXT_ROW_COLUMNS,
    ROW_ID_COLUMNS,
    STORE_COLUMNS,
    trajectory_keys,
)


def _cartpole_batch(fragment: int) -> rc.SampleBatch:
    """One batch of 2 CartPole sub-envs under a random policy."""
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=fragment, seed=0)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    batch = runner.sample()
    runner.stop()
    return batch


def test_trajectory_keys_separate_agents_and_episodes():
    b = rc.SampleBatch({"eps_id": np.array([3, 3, 3, 4]), "agent_index": np.array([0, 1, 0, 1])})
    keys = trajectory_keys(b)
    assert keys.dtype == np.int64
    assert keys[0] == keys[2] and len({keys[0], keys[1], keys[3]}) == 3
    single = rc.SampleBatch({"eps_id": np.array([3, 3, 4])})
    np.testing.assert_array_equal(trajectory_keys(single), [3, 3, 4])


def test_runner_batches_follow_the_declared_roles():
    batch = _cartpole_batch(fragment=30)
    names = set(batch.keys())
    assert set(ROW_ID_COLUMNS) <= names and set(NEXT_ROW_COLUMNS) <= names
    assert not names & set(STORE_COLUMNS)  # store bookkeeping never leaves the collector
    keys = trajectory_keys(batch)
    for name, following in NEXT_OBS_OF.items():
        same = keys[1:] == keys[:-1]
        np.testing.assert_array_equal(batch[following][:-1][same], batch[name][1:][same])


def test_trajectory_order_is_a_stable_argsort_whatever_the_id_range():
    from rlconnect.collectors.policy_collector import trajectory_order

    rng = np.random.default_rng(0)
    close = rng.integers(10**12, 10**12 + 300, size=3000)  # radix path: offsets fit 16 bits
    wide = np.concatenate([close, [10**12 + 70_000, 5]])  # too wide: numpy's stable sort
    for ids in (close, wide, close[:1], close[:0], np.full(50, 7)):
        order = trajectory_order(ids.astype(np.int64))
        np.testing.assert_array_equal(order, np.argsort(ids, kind="stable"))


def test_empty_infos_are_one_shared_dict_that_pickles_and_copies_as_itself():
    """Rows whose env gave an empty info share ``EMPTY_INFO``: a batch holding it pickles
    (to another process, to a file of the user's) and deep-copies, and comes back holding
    the same shared object; changing it is refused, since every such row would change."""
    batch = _cartpole_batch(fragment=5)
    assert all(info is EMPTY_INFO for info in batch["infos"])
    for again in (pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch)):
        assert all(info is EMPTY_INFO for info in again["infos"])
        np.testing.assert_array_equal(again["obs"], batch["obs"])
    assert EMPTY_INFO == {} and not EMPTY_INFO and isinstance(EMPTY_INFO, dict)
    with pytest.raises(TypeError, match="cannot be changed"):
        EMPTY_INFO["score"] = 1  # type: ignore[index]
    with pytest.raises(TypeError, match="cannot be changed"):
        EMPTY_INFO.update(score=1)  # type: ignore[attr-defined]
    assert EMPTY_INFO == {}
