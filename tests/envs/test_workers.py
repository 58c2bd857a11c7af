"""num_env_workers: sub-envs in worker processes sample exactly what in-process ones do."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from env_cases import (
    StepCountEnv,
    TwoAgents,
    assert_same_batches,
    check_count_truth,
    make_cartpole,
    make_indexed,
    make_short,
    runner_for,
    spaces,
)

import rlconnect as rc
from rlconnect.envs.workers import WorkerEnvs, split_evenly


def draw(env, make, *, k=3, n=5, frag=30, **cfg) -> list[rc.SampleBatch]:
    runner = runner_for(env, make, n=n, frag=frag, seed=21, **cfg)
    try:
        return [runner.sample() for _ in range(k)]
    finally:
        runner.stop()


def test_split_evenly():
    assert split_evenly(5, 2) == [(0, 3), (3, 2)]
    assert split_evenly(4, 4) == [(0, 1), (1, 1), (2, 1), (3, 1)]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("env", "make"), [("CartPole-v1", make_cartpole), (make_indexed, make_indexed)]
)
def test_workers_sample_the_batches_of_in_process_envs(env, make, workers):
    local = draw(env, make)
    remote = draw(env, make, num_env_workers=workers)
    assert_same_batches(local, remote)
    if make is make_indexed:  # creators got the global context: index and seed show in obs
        b = remote[0]
        offsets = b["obs"][:, 3] - b["obs"][:, 3] % 1000
        np.testing.assert_array_equal(offsets, 10_000 * b["env_id"] + 100_000 * (21 + b["env_id"]))


def test_workers_with_lambdas_and_closures_and_a_horizon():
    limit = 4
    local = draw(lambda ctx: make_short(ctx), make_short, horizon=limit)
    remote = draw(lambda ctx: make_short(ctx), make_short, horizon=limit, num_env_workers=2)
    assert_same_batches(local, remote)
    for b in remote:
        check_count_truth(b)
        assert b["t"].max() < limit


def test_dict_observations_go_through_the_shared_block():
    def make(ctx=None):
        env = gym.make("CartPole-v1")
        return gym.wrappers.TransformObservation(
            env,
            lambda o: {"x": o[:2], "v": o[2:]},
            gym.spaces.Dict(
                {"x": gym.spaces.Box(-10, 10, (2,), np.float32), "v": gym.spaces.Box(-10, 10, (2,))}
            ),
        )

    env = WorkerEnvs(make, 3, num_workers=2, seed=1)
    try:
        assert env._a.obs is not None
        rows = env.poll()
        assert rows.dense and set(rows.obs) == {"x", "v"} and rows.obs["x"].shape == (3, 2)
    finally:
        env.close()

    def sample(**cfg):
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=20, seed=2, **cfg)
        policy = rc.RandomPolicy(gym.spaces.Box(-10, 10, (4,), np.float32), gym.spaces.Discrete(2))
        runner = rc.EnvRunner(make, policy, config=config)
        try:
            return [runner.sample()]
        finally:
            runner.stop()

    assert_same_batches(sample(), sample(num_env_workers=2))


def test_stop_ends_every_worker_process():
    """Seen from outside: the runner's child processes named as env workers."""
    import multiprocessing

    def workers() -> list:
        return [
            c
            for c in multiprocessing.active_children()
            if c.name.startswith("rlconnect-env-worker-")
        ]

    assert not workers()
    runner = runner_for("CartPole-v1", make_cartpole, n=4, frag=5, num_env_workers=2)
    procs = workers()
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    assert len(runner.sample()) == 20
    runner.stop()
    for p in procs:
        p.join(timeout=5)
    assert not any(p.is_alive() for p in procs)
    assert not workers()
    runner.stop()  # idempotent


def test_config_validates_the_new_fields():
    with pytest.raises(ValueError, match="num_env_workers=3"):
        rc.RunnerConfig(num_envs=2, num_env_workers=3)
    with pytest.raises(ValueError, match="num_env_workers=-1"):
        rc.RunnerConfig(num_envs=2, num_env_workers=-1)
    with pytest.raises(TypeError, match="num_env_workers"):
        rc.RunnerConfig(num_envs=2, num_env_workers=1.5)
    with pytest.raises(ValueError, match="env_poll_size=0"):
        rc.RunnerConfig(num_envs=2, env_poll_size=0)
    with pytest.raises(ValueError, match="env_poll_size=3"):
        rc.RunnerConfig(num_envs=2, env_poll_size=3)
    rc.RunnerConfig(num_envs=2, num_env_workers=2, env_poll_size=1, sub_env_timeout_s=5)


def test_poll_size_needs_workers_or_envpool():
    with pytest.raises(ValueError, match=r"env_poll_size=1 .*\(num_env_workers"):
        runner_for("CartPole-v1", make_cartpole, n=2, env_poll_size=1)
    runner_for("CartPole-v1", make_cartpole, n=2, env_poll_size=2).stop()  # all: synchronous


@pytest.mark.parametrize(
    ("asked", "match"),
    [({"num_env_workers": 1}, "num_env_workers=1"), ({"remote_envs": True}, "remote_envs=True")],
)
def test_workers_need_an_id_or_a_creator(asked: dict, match: str):
    """An env built already cannot be moved into a worker process: said, never ignored."""
    policy = rc.RandomPolicy(*spaces())
    cfg = rc.RunnerConfig(num_envs=1, **asked)
    with pytest.raises(ValueError, match=rf"{match} .*gymnasium\.Env instance"):
        rc.EnvRunner(gym.make("CartPole-v1"), policy, config=cfg)
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    with pytest.raises(ValueError, match=rf"{match} .*VectorEnv"):
        rc.EnvRunner(vector, policy, config=cfg)


def test_multi_agent_envs_in_workers_sample_what_in_process_ones_do():
    def run(**cfg):
        space = StepCountEnv.observation_space, StepCountEnv.action_space
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=12, seed=4, **cfg)
        runner = rc.EnvRunner(
            TwoAgents,
            {"p": rc.RandomPolicy(*space)},
            policy_mapping_fn=lambda *a, **k: "p",
            config=config,
        )
        try:
            return [runner.sample() for _ in range(2)]
        finally:
            runner.stop()

    local, remote = run(), run(num_env_workers=2)
    for x, y in zip(local, remote, strict=True):
        assert len(y.policy_batches["p"]) >= 36
        assert_same_batches([x.policy_batches["p"]], [y.policy_batches["p"]])


def _rps(ctx):
    from pettingzoo.classic import rps_v2

    return rps_v2.parallel_env(max_cycles=5)


def test_pettingzoo_parallel_envs_in_workers_sample_what_in_process_ones_do():
    pytest.importorskip("pettingzoo")
    pytest.importorskip("pygame")
    from rlconnect.spaces import flatten_space

    probe = _rps(None)
    agent = probe.possible_agents[0]
    obs_space = flatten_space(probe.observation_space(agent))
    policy = rc.RandomPolicy(obs_space, probe.action_space(agent))

    def run(**cfg):
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=10, seed=8, **cfg)
        runner = rc.EnvRunner(_rps, {"p": policy}, lambda *a, **k: "p", config=config)
        try:
            return [runner.sample().policy_batches["p"] for _ in range(2)]
        finally:
            runner.stop()

    assert_same_batches(run(), run(num_env_workers=3))


def test_evaluate_and_a_local_runner_group_with_workers():
    runner = runner_for("CartPole-v1", make_cartpole, n=4, frag=5, num_env_workers=2)
    try:
        records = runner.evaluate(num_episodes=3)
        assert len(records) == 3 and all(r["episode_length"] > 0 for r in records)
    finally:
        runner.stop()
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=5, seed=0, num_env_workers=2)
    group = rc.RunnerGroup("CartPole-v1", rc.RandomPolicy(*spaces()), config=config)
    try:
        assert len(group.sample()) == 20
    finally:
        group.stop()


def test_soft_horizons_and_box_actions_in_workers_are_exact():
    def pendulum(ctx=None):
        return gym.make("Pendulum-v1", max_episode_steps=7)

    soft = {"horizon": 3, "soft_horizon": True}
    assert_same_batches(
        draw(make_indexed, make_indexed, k=2, **soft),
        draw(make_indexed, make_indexed, k=2, num_env_workers=2, **soft),
    )
    local = draw(pendulum, pendulum, k=2, n=3, frag=10)
    remote = draw(pendulum, pendulum, k=2, n=3, frag=10, num_env_workers=3)
    assert_same_batches(local, remote)
    assert remote[0]["actions"].dtype == np.float32


def test_actions_of_another_dtype_reach_the_env_as_sent():
    """float32 actions go through the block, float64 ones through the pipe: both exact."""
    from rlconnect.envs.gym_envs import GymEnvs
    from rlconnect.envs.workers.layout import CMD_STEP, CMD_STEP_PIPED

    def pendulum(ctx=None):
        return gym.make("Pendulum-v1")

    local, remote = GymEnvs(pendulum, 2, seed=5), WorkerEnvs(pendulum, 2, num_workers=2, seed=5)
    try:
        a, b = local.poll(), remote.poll()
        rng = np.random.default_rng(0)
        for step in range(6):
            dtype = np.float32 if step % 2 else np.float64
            act = rng.uniform(-2, 2, (2, 1)).astype(dtype)
            local.send_actions(a.env_ids, a.agent_ids, act)
            remote.send_actions(b.env_ids, b.agent_ids, act)
            assert remote._a.cmd[0] == (CMD_STEP if dtype == np.float32 else CMD_STEP_PIPED)
            a, b = local.poll(), remote.poll()
            np.testing.assert_array_equal(a.obs, b.obs)
            np.testing.assert_array_equal(a.rewards, b.rewards)
    finally:
        local.close()
        remote.close()


class LockInInfo(gym.Wrapper):
    """Sub-env 0 of each worker's pair puts a lock (which cannot be pickled) in its infos."""

    def __init__(self, env: gym.Env, locked: bool) -> None:
        super().__init__(env)
        self.locked = locked

    def _info(self, info: dict) -> dict:
        return {**info, "handle": threading.Lock()} if self.locked else {**info, "score": 7}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._info(info)

    def step(self, action):
        *out, info = self.env.step(action)
        return (*out, self._info(info))


def make_lock_in_info(ctx: rc.EnvContext) -> gym.Env:
    return LockInInfo(make_indexed(ctx), locked=ctx.vector_index % 2 == 0)


class TwoAgentsLockInInfo(TwoAgents):
    """Agent ``a`` of sub-env 0 puts a lock in its infos."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.locked = ctx.vector_index == 0

    def step(self, actions):
        *out, infos = super().step(actions)
        if self.locked and "a" in infos:
            infos["a"] = {**infos["a"], "handle": threading.Lock()}
        return (*out, infos)


def infos_by_env(batches: list) -> dict[int, list]:
    out: dict[int, list] = {}
    for b in batches:
        for e, info in zip(b["env_id"].tolist(), b["infos"]):
            out.setdefault(e, []).append(info)
    return out


def test_an_unpicklable_info_replaces_only_its_own_rows_info_and_warns_once():
    """Sub-envs 0 and 2 (one per worker) return a lock in their infos, which cannot leave
    the worker: their rows' infos say so, their neighbours' infos arrive as they are, and
    one warning per such sub-env says what happened."""
    with pytest.warns(RuntimeWarning, match="sub-env") as record:
        batches = draw(make_lock_in_info, make_indexed, k=2, n=4, frag=6, num_env_workers=2)
    infos = infos_by_env(batches)
    for e in (1, 3):
        assert all(i.get("score") == 7 for i in infos[e]), infos[e][:2]
    for e in (0, 2):
        assert all(
            set(i) == {"unpicklable_info"} and "lock" in i["unpicklable_info"] for i in infos[e]
        )
    said = sorted(str(w.message).split(":")[0] for w in record if "pickle" in str(w.message))
    assert said == ["sub-env 0", "sub-env 2"], said


def _two_agents_in_a_worker(env_cls: type, **cfg) -> rc.EnvRunner:
    """Two sub-envs of ``env_cls`` in one env worker, both agents on policy ``p``."""
    space = StepCountEnv.observation_space, StepCountEnv.action_space
    config = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=6, seed=3, num_env_workers=1, **cfg
    )
    return rc.EnvRunner(env_cls, {"p": rc.RandomPolicy(*space)}, lambda *a, **k: "p", config=config)


def test_an_unpicklable_multi_agent_info_replaces_only_that_agents_info():
    runner = _two_agents_in_a_worker(TwoAgentsLockInInfo)
    try:
        with pytest.warns(RuntimeWarning, match="sub-env 0") as record:
            batch = runner.sample().policy_batches["p"]
    finally:
        runner.stop()
    assert len([w for w in record if "pickle" in str(w.message)]) == 1
    steps = [
        (e, a, i)
        for e, a, i in zip(batch["env_id"].tolist(), batch["agent_index"].tolist(), batch["infos"])
        if "t" in i or "unpicklable_info" in i
    ]
    assert steps
    for e, a, info in steps:
        if (e, a) == (0, 0):
            assert set(info) == {"unpicklable_info"}, info
        else:
            assert "t" in info and "unpicklable_info" not in info, (e, a, info)


class _UnpicklableObs(np.ndarray):
    def __reduce__(self):
        raise TypeError("this observation cannot be pickled")


class TwoAgentsBadObsOnce(TwoAgents):
    """Agent ``a`` of sub-env 0 returns, once per worker process, an observation that fits
    its space but cannot be pickled. (The agents' spaces differ, so the adapter keeps each
    observation as it is: stacked with the other's, its values would pickle.)"""

    fired = False
    observation_spaces = {
        "a": StepCountEnv.observation_space,
        "b": gym.spaces.Box(-1e8, 1e8, (4,), np.float32),
    }

    def __init__(self, ctx):
        super().__init__(ctx)
        self.bad = ctx.vector_index == 0

    def step(self, actions):
        obs, *rest = super().step(actions)
        if self.bad and "a" in obs and not type(self).fired:
            type(self).fired = True
            obs["a"] = np.asarray(obs["a"]).view(_UnpicklableObs)
        return (obs, *rest)


@pytest.mark.parametrize("restart", [False, True])
def test_an_unpicklable_multi_agent_observation_is_its_sub_envs_error(restart):
    """The observation cannot leave the worker: its sub-env fails with an error naming it
    and its agent (restarted when restarts are on); the worker and the other sub-env of
    its group go on, nothing of theirs lost."""
    runner = _two_agents_in_a_worker(TwoAgentsBadObsOnce, restart_failed_sub_environments=restart)
    try:
        if not restart:
            with pytest.raises(
                rc.EnvError, match=r"env 0 / agent 'a': its observation cannot be pickled"
            ):
                runner.sample()
            return
        batches = [runner.sample() for _ in range(3)]
        metrics = runner.get_metrics()
        pids = {w.proc.pid for w in runner.env.workers}
    finally:
        runner.stop()
    assert [b.env_steps() for b in batches] == [12, 12, 12]  # 2 sub-envs x 6
    faulty = [m for m in metrics if m["episode_faulty"]]
    assert [m["env_id"] for m in faulty] == [0]
    assert any(m["env_id"] == 1 and m["episode_length"] == 5 for m in metrics)
    assert len(pids) == 1  # the same worker process throughout
