"""env_poll_size: asynchronous polls keep every trajectory exact and batch sizes promised."""

from __future__ import annotations

import multiprocessing
import time

import gymnasium as gym
import numpy as np
import pytest
from env_cases import StepCountEnv, check_count_truth, make_indexed, runner_for

import rlconnect as rc
from rlconnect.envs.workers import WorkerEnvs


class SlowCount(StepCountEnv):
    """StepCountEnv whose steps take longer in some sub-envs: polls interleave them."""

    def __init__(self, offset: float = 0.0, delay: float = 0.0) -> None:
        super().__init__(offset)
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)


def make_slow(ctx: rc.EnvContext) -> gym.Env:
    offset = 10_000 * ctx.vector_index + (0 if ctx.seed is None else 100_000 * ctx.seed)
    env = SlowCount(offset, delay=0.004 if ctx.vector_index % 2 else 0.0)
    return gym.wrappers.TimeLimit(env, max_episode_steps=6)


def check_episodes(batch: rc.SampleBatch) -> None:
    """Per episode, rows in t order: obs[t + 1] == new_obs[t]; only the last row ends."""
    for eps in np.unique(batch["eps_id"]).tolist():
        rows = np.flatnonzero(batch["eps_id"] == eps)
        rows = rows[np.argsort(batch["t"][rows], kind="stable")]
        assert np.all(np.diff(batch["t"][rows]) == 1)
        np.testing.assert_array_equal(batch["new_obs"][rows[:-1]], batch["obs"][rows[1:]])
        ends = batch["terminateds"][rows] | batch["truncateds"][rows]
        assert not ends[:-1].any()


@pytest.mark.parametrize(("workers", "poll"), [(4, 1), (4, 2), (2, 1)])
def test_async_polls_keep_trajectories_exact(workers, poll):
    runner = runner_for(
        make_slow, make_indexed, n=4, frag=15, seed=3, num_env_workers=workers, env_poll_size=poll
    )
    try:
        batches = [runner.sample() for _ in range(3)]
        metrics = runner.get_metrics()
    finally:
        runner.stop()
    for b in batches:
        assert len(b) == 60  # truncate_episodes: exactly rollout_fragment_length * num_envs
        check_count_truth(b)  # no reset step recorded, every transition the env's own
        check_episodes(b)
        # sub-env i was built and seeded as sub-env i: its offset shows in every obs
        offsets = b["obs"][:, 3] - b["obs"][:, 3] % 1000
        np.testing.assert_array_equal(offsets, 10_000 * b["env_id"] + 100_000 * (3 + b["env_id"]))
    assert metrics and all(m["episode_length"] == 6 for m in metrics)


def test_async_polls_return_at_least_poll_size_sub_envs_while_others_step():
    env = WorkerEnvs(make_slow, 4, num_workers=4, seed=0, poll_size=2)
    try:
        rows = env.poll()
        assert len(rows) >= 2 and np.all(np.diff(rows.env_ids) > 0)
        seen = {}
        for _ in range(30):
            env.send_actions(rows.env_ids, rows.agent_ids, np.zeros(len(rows), np.int64))
            rows = env.poll()
            assert len(rows) >= 2 and np.all(np.diff(rows.env_ids) > 0)
            for e in rows.env_ids.tolist():
                seen[e] = seen.get(e, 0) + 1
        # the fast (even) sub-envs came back more often than the slow (odd) ones
        assert seen.get(0, 0) > seen.get(1, 0) and seen.get(2, 0) > seen.get(3, 0)
    finally:
        env.close()


def test_async_polls_in_complete_episodes_mode():
    runner = runner_for(
        make_slow,
        make_indexed,
        n=4,
        frag=5,
        seed=3,
        num_env_workers=4,
        env_poll_size=2,
        batch_mode="complete_episodes",
    )
    try:
        batch = runner.sample()
    finally:
        runner.stop()
    assert len(batch) >= 20
    check_count_truth(batch)
    check_episodes(batch)
    ends = batch["terminateds"] | batch["truncateds"]
    assert ends.sum() == len(np.unique(batch["eps_id"]))  # whole episodes only


def test_remote_envs_with_a_poll_size_run_one_worker_per_sub_env():
    before = {p.pid for p in multiprocessing.active_children()}
    runner = runner_for(make_slow, make_indexed, n=3, frag=6, remote_envs=True, env_poll_size=1)
    try:
        started = {p.pid for p in multiprocessing.active_children()} - before
        assert len(started) == 3
        batch = runner.sample()
    finally:
        runner.stop()
    assert not {p.pid for p in multiprocessing.active_children()} & started
    assert len(batch) == 18
    check_count_truth(batch)
