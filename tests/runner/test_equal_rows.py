"""RunnerConfig(equal_rows=True) (issue 54): every sub-env gives exactly
rollout_fragment_length rows per batch, sub-env major, on every path; time_major folds it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, TurnTakingEnv
from tests.envs.env_cases import TwoAgents

import rlconnect as rc

T = 7


def _counter_runner(n: int = 3, **cfg) -> rc.EnvRunner:
    env = CounterEnv(length=5)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=T, seed=0, equal_rows=True, **cfg)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    return rc.EnvRunner(lambda ctx: CounterEnv(length=4 + ctx.vector_index), policy, config=config)


def _check_equal_sub_env_major(batches: list[rc.SampleBatch], n: int) -> None:
    """T rows a sub-env, sub-env major, each sub-env's rows continuing batch after batch."""
    last_new_obs: dict[int, np.ndarray] = {}
    for b in batches:
        assert len(b) == T * n and b.meta["rows_per_env"] == T
        assert b["env_id"].tolist() == np.repeat(np.arange(n), T).tolist()
        tm = b.time_major()
        assert tm["obs"].shape == (T, n, 3)
        assert np.shares_memory(tm["obs"], b["obs"])  # a view
        done = tm["terminateds"] | tm["truncateds"]
        for e in range(n):  # closed form of CounterEnv: new_obs = [ep, t + 1, action]
            obs, new = tm["obs"][:, e], tm["new_obs"][:, e]
            np.testing.assert_array_equal(new[:, 1], obs[:, 1] + 1)
            np.testing.assert_array_equal(new[:, 2], tm["actions"][:, e])
            follows = ~done[:-1, e]
            np.testing.assert_array_equal(obs[1:][follows], new[:-1][follows])
            if e in last_new_obs:  # the previous batch's last row is continued
                np.testing.assert_array_equal(obs[0], last_new_obs[e])
            last_new_obs[e] = new[-1] if not done[-1, e] else None
            if last_new_obs[e] is None:
                del last_new_obs[e]


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"sample_async": True},
        pytest.param({"num_env_workers": 2}, marks=pytest.mark.slow),
        pytest.param({"num_env_workers": 3, "env_poll_size": 1}, marks=pytest.mark.slow),
    ],
    ids=["in_process", "sample_async", "env_workers", "async_polls"],
)
def test_equal_rows_on_every_path(cfg: dict):
    runner = _counter_runner(3, **cfg)
    try:
        batches = [runner.sample() for _ in range(4)]
    finally:
        runner.stop()
    _check_equal_sub_env_major(batches, 3)


def test_without_equal_rows_time_major_refuses_and_names_it():
    """Sub-envs whose episodes end at different steps (lengths 4, 5, 6) give unequal rows."""
    plain = rc.RunnerConfig(num_envs=3, rollout_fragment_length=T, seed=0)
    env = CounterEnv()
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    runner = rc.EnvRunner(lambda ctx: CounterEnv(length=4 + ctx.vector_index), policy, config=plain)
    try:
        counts = [np.bincount(runner.sample()["env_id"]).tolist() for _ in range(3)]
        assert any(len(set(c)) > 1 for c in counts), counts
        while True:  # the next batch with unequal rows
            b = runner.sample()
            if len(set(np.bincount(b["env_id"]).tolist())) > 1:
                break
    finally:
        runner.stop()
    with pytest.raises(ValueError, match=r"RunnerConfig\(equal_rows=True\)"):
        b.time_major()


@pytest.mark.slow
def test_equal_rows_envpool_async():
    pytest.importorskip("envpool")
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(
        num_envs=4, rollout_fragment_length=9, seed=1, equal_rows=True, env_poll_size=2
    )
    runner = rc.EnvRunner(
        "envpool:CartPole-v1",
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=config,
    )
    try:
        for _ in range(3):
            b = runner.sample()
            assert np.bincount(b["env_id"]).tolist() == [9] * 4
            tm = b.time_major()
            assert tm["obs"].shape == (9, 4, 4)
            follows = ~(tm["terminateds"] | tm["truncateds"])[:-1]
            np.testing.assert_array_equal(tm["obs"][1:][follows], tm["new_obs"][:-1][follows])
    finally:
        runner.stop()


def test_equal_rows_multi_agent_agents_acting_every_step():
    env = TwoAgents()
    space_o, space_a = env.observation_spaces["a"], env.action_spaces["a"]
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=6, seed=0, equal_rows=True)
    runner = rc.EnvRunner(
        TwoAgents, {"shared": rc.RandomPolicy(space_o, space_a)}, lambda aid, *a, **k: "shared",
        config=config,
    )  # fmt: skip
    try:
        for _ in range(2):
            out = runner.sample()
            b = out.policy_batches["shared"]
            assert out.env_steps() == 12 and len(b) == 24 and b.meta["rows_per_env"] == 6
            tm = b.time_major()
            assert tm["obs"].shape[:2] == (6, 4)  # slots: agent-major (agent 0: envs 0, 1)
            assert tm["env_id"][0].tolist() == [0, 1, 0, 1]
            assert tm["agent_index"][0].tolist() == [0, 0, 1, 1]
    finally:
        runner.stop()


def test_equal_rows_turn_based_agents_are_refused():
    env = TurnTakingEnv()
    policy = rc.RandomPolicy(env.observation_spaces["a"], env.action_spaces["a"])
    config = rc.RunnerConfig(num_envs=1, rollout_fragment_length=4, seed=0, equal_rows=True)
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(), {"p": policy}, lambda *a, **k: "p", config=config
    )
    try:
        with pytest.raises(ValueError, match="equal_rows"):
            runner.sample()
    finally:
        runner.stop()


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        ({"batch_mode": "complete_episodes"}, "truncate_episodes"),
        ({"count_steps_by": "agent_steps"}, "env_steps"),
    ],
)
def test_equal_rows_bad_combinations(cfg: dict, says: str):
    with pytest.raises(ValueError, match=f"equal_rows.*{says}"):
        rc.RunnerConfig(num_envs=2, equal_rows=True, **cfg)


def test_equal_rows_refuses_an_external_env():
    class Sim(rc.ExternalEnv):
        def run(self) -> None:  # never asked for an action: the runner is refused first
            pass

    env = CounterEnv()
    sim = Sim(env.action_space, env.observation_space, max_concurrent=2)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    config = rc.RunnerConfig(rollout_fragment_length=4, equal_rows=True)
    with pytest.raises(ValueError, match="equal_rows=False"):
        rc.EnvRunner(lambda ctx: sim, policy, config=config)
