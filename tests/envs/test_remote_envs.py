"""remote_envs=True: one env worker per sub-env, sampling exactly what in-process envs do."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from env_cases import (
    StepCountEnv,
    TwoAgents,
    assert_same_batches,
    make_cartpole,
    make_indexed,
    runner_for,
    spaces,
)

import rlconnect as rc
from rlconnect.envs import GymEnvs


def draw(env, make, remote, k=3, **kw):
    runner = runner_for(env, make, n=3, frag=40, seed=21, remote_envs=remote, **kw)
    try:
        return [runner.sample() for _ in range(k)]
    finally:
        runner.stop()


def children() -> set[int]:
    """The pids of this process's live child processes."""
    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.parametrize(
    ("env", "make"), [("CartPole-v1", make_cartpole), (make_indexed, make_indexed)]
)
def test_remote_envs_sample_what_local_envs_sample(env, make):
    local, remote = draw(env, make, False), draw(env, make, True)
    assert [len(b) for b in remote] == [120] * 3
    assert_same_batches(local, remote)
    if make is make_indexed:  # creators got the same context: index and seed show in obs
        b = remote[0]
        offsets = b["obs"][:, 3] - b["obs"][:, 3] % 1000
        expected = 10_000 * b["env_id"] + 100_000 * (21 + b["env_id"])
        np.testing.assert_array_equal(offsets, expected)


def test_remote_envs_with_a_horizon_stay_true():
    def sample(remote):
        runner = runner_for(make_indexed, make_indexed, n=2, frag=10, remote_envs=remote, horizon=3)
        try:
            return [runner.sample()]
        finally:
            runner.stop()

    (batch,) = remote = sample(True)
    assert len(batch) == 20
    np.testing.assert_array_equal(batch["new_obs"][:, 1], batch["obs"][:, 1] + 1)
    assert np.all(batch["t"] == batch["obs"][:, 1])  # reset at the horizon: t is the env's
    assert_same_batches(sample(False), remote)


def test_remote_envs_start_one_worker_per_sub_env_and_stop_ends_them():
    before = children()
    runner = runner_for("CartPole-v1", make_cartpole, n=3, frag=5, remote_envs=True)
    started = children() - before
    assert len(started) == 3  # one per sub-env
    assert len(runner.sample()) == 15
    runner.stop()
    assert not children() & started
    runner.stop()  # idempotent


def test_remote_envs_run_multi_agent_envs_as_in_process():
    def run(remote):
        space = StepCountEnv.observation_space, StepCountEnv.action_space
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=12, seed=4, remote_envs=remote)
        runner = rc.EnvRunner(
            TwoAgents, {"p": rc.RandomPolicy(*space)}, lambda *a, **k: "p", config=config
        )
        try:
            return [runner.sample().policy_batches["p"] for _ in range(2)]
        finally:
            runner.stop()

    local, remote = run(False), run(True)
    assert all(len(b) >= 36 for b in remote)
    assert_same_batches(local, remote)


def _builds_a_base_env(ctx):
    return GymEnvs(make_cartpole, 2)


def test_remote_envs_name_what_they_cannot_run():
    policy = rc.RandomPolicy(*spaces(make_cartpole))
    before = children()
    with pytest.raises(TypeError, match=r"remote_envs=True\) step .* returned GymEnvs"):
        rc.EnvRunner(
            _builds_a_base_env, policy, config=rc.RunnerConfig(num_envs=2, remote_envs=True)
        )
    assert children() <= before  # the workers that started were ended
