"""GymEnvs edge cases: env instances, rebuilding after failures, failing first resets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from env_cases import StepCountEnv, check_count_truth, make_short

import rlconnect as rc


class FlakyEnv(StepCountEnv):
    """StepCountEnv whose ``reset`` raises on its first ``reset_failures`` calls and whose
    ``step`` raises at global step ``fail_at``."""

    def __init__(self, reset_failures: int = 0, fail_at: int | None = None) -> None:
        super().__init__()
        self.reset_failures, self.fail_at, self.steps = reset_failures, fail_at, 0

    def reset(self, *, seed=None, options=None):
        if self.reset_failures:
            self.reset_failures -= 1
            raise ConnectionError("simulator not ready")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"crash at step {self.steps}")
        obs, r, te, _, info = super().step(action)
        return obs, r, te, self.t >= 5, info


def runner(env, n=1, frag=10, **cfg):
    policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=3, **cfg)
    return rc.EnvRunner(env, policy, config=config)


def test_an_instance_with_several_sub_envs_is_a_clear_error():
    with pytest.raises(ValueError, match=r"one env instance but num_envs=2: pass an env creator"):
        runner(make_short(), n=2)
    assert len(runner(make_short(), n=1).sample()) == 10  # one is fine


def test_restarting_an_instance_env_is_a_clear_error():
    r = runner(FlakyEnv(fail_at=3), restart_failed_sub_environments=True)
    with pytest.raises(rc.EnvError, match=r"sub-env 0 could not be rebuilt") as info:
        r.sample()
    msg = str(info.value)
    assert "RuntimeError: crash at step 3" in msg  # what failed in the first place
    assert "passed as an instance" in msg and "env creator" in msg  # what to do
    assert isinstance(info.value.__cause__, RuntimeError)


def first_reset_fails():
    """A creator whose very first env (sub-env 0) raises in its first reset."""
    built: list[FlakyEnv] = []

    def make(ctx):
        built.append(FlakyEnv(reset_failures=1 if ctx.vector_index == 0 and not built else 0))
        return gym.wrappers.TimeLimit(built[-1], max_episode_steps=50)

    return make, built


def test_an_env_whose_first_reset_raises_is_restarted():
    make, built = first_reset_fails()
    r = runner(make, n=2, restart_failed_sub_environments=True)
    batch = r.sample()
    assert len(batch) == 20
    check_count_truth(batch)
    assert len(built) == 3  # sub-env 0 was rebuilt once
    env0 = batch.take(np.flatnonzero(batch["env_id"] == 0))
    assert env0["t"][0] == 0 and env0["obs"][0][0] == 0  # the new env's first episode

    # the env layer reports the failure of that sub-env, with no rows of it
    make, _ = first_reset_fails()
    envs = rc.envs.make_base_env(make, num_envs=2, seed=3)
    rows = envs.poll()
    assert list(rows.errors) == [0] and isinstance(rows.errors[0], ConnectionError)
    assert rows.env_ids.tolist() == [1]
    envs.try_restart(0)
    assert envs.poll().env_ids.tolist() == [0]


def test_a_failed_reset_is_reported_in_metrics():
    make, _ = first_reset_fails()
    r = runner(make, restart_failed_sub_environments=True)
    r.sample()
    assert [m["env_id"] for m in r.get_metrics() if m["episode_faulty"]] == [0]


def test_a_failing_first_reset_without_restart_names_the_env():
    def make(ctx):
        return FlakyEnv(reset_failures=1 if ctx.vector_index == 1 else 0)

    with pytest.raises(rc.EnvError, match=r"sub-env 1 raised ConnectionError: simulator"):
        runner(make, n=2).sample()


def test_a_rebuilt_env_gets_a_fresh_seed():
    def make(ctx):
        return FlakyEnv(fail_at=4 if ctx.seed == 3 else None)  # only the first build fails

    r = runner(make, frag=20, restart_failed_sub_environments=True)
    batch = r.sample()
    assert len(batch) == 20
    check_count_truth(batch)
    starts = batch["obs"][batch["t"] == 0][:, 3]
    first = make(rc.EnvContext(seed=3)).reset(seed=3)[0][3]
    assert first not in starts  # the crashed episode is gone, the new env is seeded anew


def test_a_dense_poll_as_columns_holds_the_rows_poll_gives():
    """``poll_columns`` (what env workers copy into shared memory) and ``poll`` give the
    same rows; a poll that is not dense comes as ``EnvRows`` (one that went wrong does too:
    ``test_reward_shapes`` and ``test_env_checks`` run bad sub-envs in workers)."""
    from rlconnect.envs.gym_envs import DenseColumns, GymEnvs

    def make(ctx: rc.EnvContext) -> gym.Env:
        return gym.make("CartPole-v1")

    envs = [GymEnvs(make, 3, seed=5) for _ in range(2)]
    ids, agents = np.arange(3), ("agent0",) * 3
    ended: list[int] = []
    for k in range(30):
        for env in envs:
            for i in ended:
                env.try_reset(i)
            if k:
                keep = np.array([i for i in range(3) if i not in ended], np.int64)
                env.send_actions(keep, agents[: len(keep)], np.ones(len(keep), np.int64))
        columns, last = envs[0].poll_columns(), envs[1].poll()
        ended = np.flatnonzero(last.terminateds | last.truncateds).tolist()
        assert isinstance(columns, DenseColumns)
        np.testing.assert_array_equal(columns.obs, last.obs)
        np.testing.assert_array_equal(columns.rewards, last.rewards)
        np.testing.assert_array_equal(columns.terminateds, last.terminateds)
        first = np.zeros(3, bool) if columns.first is None else columns.first
        np.testing.assert_array_equal(first, last.is_first)
        assert k or first.all()
    env = envs[0]
    env.send_actions(ids[:2], agents[:2], np.ones(2, np.int64))  # sub-env 2 has no action
    assert not isinstance(env.poll_columns(), DenseColumns)
