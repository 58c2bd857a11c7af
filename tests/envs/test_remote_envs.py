"""remote_envs=True: sub-envs in worker processes sample what in-process sub-envs sample."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from env_cases import make_cartpole, make_indexed, row_tuples, runner_for, spaces

import rlconnect as rc


def draw(env, make, remote, k=3, **kw):
    runner = runner_for(env, make, n=3, frag=40, seed=21, remote_envs=remote, **kw)
    try:
        return [runner.sample() for _ in range(k)]
    finally:
        runner.stop()


@pytest.mark.parametrize(
    ("env", "make"), [("CartPole-v1", make_cartpole), (make_indexed, make_indexed)]
)
def test_remote_envs_sample_what_local_envs_sample(env, make):
    local, remote = draw(env, make, False), draw(env, make, True)
    for a, b in zip(local, remote, strict=True):
        assert len(b) == 120
        assert row_tuples(b) == row_tuples(a)
        assert b["infos"].tolist() == a["infos"].tolist() or make is make_cartpole
    if make is make_indexed:  # creators got the same context: index and seed show in obs
        b = remote[0]
        offsets = b["obs"][:, 3] - b["obs"][:, 3] % 1000
        expected = 10_000 * b["env_id"] + 100_000 * (21 + b["env_id"])
        np.testing.assert_array_equal(offsets, expected)


def test_remote_envs_with_a_horizon_stay_true():
    runner = runner_for(make_indexed, make_indexed, n=2, frag=10, remote_envs=True, horizon=3)
    try:
        batch = runner.sample()
    finally:
        runner.stop()
    assert len(batch) == 20
    np.testing.assert_array_equal(batch["new_obs"][:, 1], batch["obs"][:, 1] + 1)
    assert np.all(batch["t"] == batch["obs"][:, 1])  # reset at the horizon: t is the env's


def test_stop_closes_the_worker_processes():
    runner = runner_for("CartPole-v1", make_cartpole, n=2, frag=5, remote_envs=True)
    venv = runner.env.venv
    assert isinstance(venv, gym.vector.AsyncVectorEnv)
    procs = list(venv.processes)
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    assert len(runner.sample()) == 10
    runner.stop()
    for p in procs:
        p.join(timeout=5)
    assert not any(p.is_alive() for p in procs)
    assert venv.closed
    runner.stop()  # idempotent


def _multi_agent_creator(ctx):
    from env_cases import StepCountEnv

    class TwoAgents(rc.MultiAgentEnv):
        possible_agents = ["a", "b"]
        observation_spaces = dict.fromkeys("ab", StepCountEnv.observation_space)
        action_spaces = dict.fromkeys("ab", StepCountEnv.action_space)

    return TwoAgents()


def test_remote_envs_name_what_they_cannot_run():
    policy = rc.RandomPolicy(*spaces(make_cartpole))
    with pytest.raises(TypeError, match=r"remote_envs=True .* returned TwoAgents"):
        rc.EnvRunner(
            _multi_agent_creator,
            {"p": policy},
            policy_mapping_fn=lambda *a, **k: "p",
            config=rc.RunnerConfig(num_envs=2, remote_envs=True),
        )
