"""Env workers under faults: killed workers, raising sub-envs, hangs; nothing left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from env_cases import (
    StepCountEnv,
    assert_same_batches,
    check_count_truth,
    make_indexed,
    runner_for,
)

import rlconnect as rc
from machine_speed import scaled
from rlconnect.errors import EnvTimeoutError


class Flaky(StepCountEnv):
    """Raises at step ``fail_at`` of its second episode (first build only), or hangs there."""

    def __init__(self, offset: float, fail_at: int | None, hang: bool = False) -> None:
        super().__init__(offset)
        self.fail_at, self.hang = fail_at, hang

    def step(self, action):
        if self.fail_at is not None and self.episode == 1 and self.t + 1 == self.fail_at:
            if self.hang:
                time.sleep(60)
            raise RuntimeError("flaky env failed")
        return super().step(action)


def make_flaky(ctx: rc.EnvContext, hang: bool = False) -> gym.Env:
    first_build = ctx.seed == 21 + ctx.vector_index  # rebuilt sub-envs get a derived seed
    fail_at = 3 if ctx.vector_index == 1 and first_build else None
    env = Flaky(10_000 * ctx.vector_index, fail_at, hang)
    return gym.wrappers.TimeLimit(env, max_episode_steps=5)


def make_plain(ctx: rc.EnvContext) -> gym.Env:
    return gym.wrappers.TimeLimit(StepCountEnv(10_000 * ctx.vector_index), max_episode_steps=5)


def make_hanging(ctx: rc.EnvContext) -> gym.Env:
    return make_flaky(ctx, hang=True)


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


def sample_all(runner: rc.EnvRunner, k: int) -> tuple[list[rc.SampleBatch], list[dict]]:
    try:
        batches = [runner.sample() for _ in range(k)]
        return batches, runner.get_metrics()
    finally:
        runner.stop()


def test_a_raising_sub_env_is_rebuilt_in_its_worker_exactly_as_in_process():
    cfg = {"restart_failed_sub_environments": True, "seed": 21}
    local, local_m = sample_all(runner_for(make_flaky, make_indexed, n=3, frag=12, **cfg), 2)
    remote, remote_m = sample_all(
        runner_for(make_flaky, make_indexed, n=3, frag=12, num_env_workers=2, **cfg), 2
    )
    for a, b in zip(local, remote, strict=True):
        for key in ("obs", "new_obs", "actions", "rewards", "env_id", "t", "truncateds"):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        check_count_truth(b)
    faulty = [m for m in remote_m if m["episode_faulty"]]
    assert [(m["env_id"], m["episode_length"]) for m in faulty] == [(1, 2)]
    assert remote_m == local_m


def test_a_raising_sub_env_without_restarts_is_an_env_error_naming_it():
    runner = runner_for(make_flaky, make_indexed, n=3, frag=12, seed=21, num_env_workers=2)
    with pytest.raises(rc.EnvError, match=r"sub-env 1 raised RuntimeError: flaky env failed"):
        sample_all(runner, 2)


def workers(before: set[int]) -> dict[str, int]:
    """Worker processes started since ``before``, by name (``rlconnect-env-worker-<w>``)."""
    return {p.name: p.pid for p in multiprocessing.active_children() if p.pid not in before}


@pytest.mark.parametrize(
    ("cfg", "lost"), [({"num_env_workers": 2}, [2, 3]), ({"remote_envs": True}, [1])]
)
def test_a_killed_worker_is_replaced_and_only_its_episodes_dropped(cfg, lost):
    before = children()
    runner = runner_for(
        make_plain, make_indexed, n=4, frag=10, seed=21, restart_failed_sub_environments=True, **cfg
    )
    try:
        runner.sample()
        runner.get_metrics()
        old = workers(before)
        os.kill(old["rlconnect-env-worker-1"], signal.SIGKILL)
        batches = [runner.sample() for _ in range(2)]
        metrics = runner.get_metrics()
        new = workers(before)
        assert new.keys() == old.keys()  # as many live workers as before, no leftover
        assert {name for name in old if new[name] != old[name]} == {"rlconnect-env-worker-1"}
    finally:
        runner.stop()
    assert children() <= before  # no process left after stop()
    for b in batches:
        assert len(b) == 40
        check_count_truth(b)
    faulty = sorted(m["env_id"] for m in metrics if m["episode_faulty"])
    assert faulty == lost  # the killed worker's sub-envs, one open episode each
    assert all(not m["episode_faulty"] for m in metrics if m["env_id"] not in lost)


@pytest.mark.parametrize(
    ("cfg", "held"),
    [({"num_env_workers": 2}, r"sub-envs 0\.\.1"), ({"remote_envs": True}, "sub-env 0")],
)
def test_a_killed_worker_without_restarts_is_an_env_error_naming_its_sub_envs(cfg, held):
    before = children()
    runner = runner_for(make_plain, make_indexed, n=4, frag=10, seed=21, **cfg)
    try:
        runner.sample()
        os.kill(workers(before)["rlconnect-env-worker-0"], signal.SIGKILL)
        with pytest.raises(rc.EnvError, match=rf"worker process of {held} died") as info:
            runner.sample()
        assert "exit code -9" in str(info.value.__cause__ or info.value)
    finally:
        runner.stop()


@pytest.mark.slow
def test_a_hung_worker_is_killed_at_the_timeout_and_replaced():
    before = children()
    runner = runner_for(
        make_hanging,
        make_indexed,
        n=3,
        frag=12,
        seed=21,
        num_env_workers=3,
        sub_env_timeout_s=1.0,
        restart_failed_sub_environments=True,
    )
    start = time.monotonic()
    batches, metrics = sample_all(runner, 2)
    assert time.monotonic() - start < scaled(20)
    assert children() <= before
    for b in batches:
        check_count_truth(b)
    assert [m["env_id"] for m in metrics if m["episode_faulty"]] == [1]


@pytest.mark.slow
def test_a_hung_worker_without_restarts_is_a_timeout_error():
    runner = runner_for(
        make_hanging, make_indexed, n=2, frag=12, seed=21, num_env_workers=2, sub_env_timeout_s=1.0
    )
    with pytest.raises(EnvTimeoutError, match=r"sub-env 1 did not finish a step within 1\.0 s"):
        sample_all(runner, 2)


class FlakyPair(rc.MultiAgentEnv):
    """Agents ``a`` and ``b`` step one ``make_flaky`` env each: sub-env 1 raises in its
    second episode (first build only) and is rebuilt; its next reset shows its seed."""

    possible_agents = ["a", "b"]
    observation_spaces = dict.fromkeys("ab", StepCountEnv.observation_space)
    action_spaces = dict.fromkeys("ab", StepCountEnv.action_space)

    def __init__(self, ctx: rc.EnvContext) -> None:
        self.envs = {a: make_flaky(ctx) for a in "ab"}

    def reset(self, *, seed=None, options=None):
        obs, infos = {}, {}
        for k, (a, env) in enumerate(self.envs.items()):
            obs[a], infos[a] = env.reset(seed=None if seed is None else seed + k)
        return obs, infos

    def step(self, actions):
        out = {a: self.envs[a].step(act) for a, act in actions.items()}
        obs, rew, term, trunc, infos = ({a: o[k] for a, o in out.items()} for k in range(5))
        term["__all__"] = False
        trunc["__all__"] = any(trunc.values())
        return obs, rew, term, trunc, infos


def sample_pairs(**cfg) -> tuple[list[rc.SampleBatch], list[dict]]:
    space = StepCountEnv.observation_space, StepCountEnv.action_space
    config = rc.RunnerConfig(
        num_envs=3,
        rollout_fragment_length=12,
        seed=21,
        restart_failed_sub_environments=True,
        **cfg,
    )
    runner = rc.EnvRunner(
        FlakyPair, {"p": rc.RandomPolicy(*space)}, lambda *a, **k: "p", config=config
    )
    batches, metrics = sample_all(runner, 3)
    return [b.policy_batches["p"] for b in batches], metrics


@pytest.mark.parametrize("cfg", [{"remote_envs": True}, {"num_env_workers": 2}])
def test_a_restarted_multi_agent_sub_env_in_a_worker_samples_what_in_process_does(cfg):
    local, local_m = sample_pairs()
    remote, remote_m = sample_pairs(**cfg)
    faulty = [m for m in local_m if m["episode_faulty"]]
    assert [m["env_id"] for m in faulty] == [1]
    starts = {float(s) for b in local for s in b["obs"][b["env_id"] == 1][:, 3]}
    assert len(starts) >= 3  # the rebuilt sub-env's episodes start where its seed says
    assert_same_batches(local, remote)
    assert remote_m == local_m


def make_flaky_unrebuildable(ctx: rc.EnvContext) -> gym.Env:
    if ctx.seed != 21 + ctx.vector_index:  # a rebuild: its seed is derived
        raise OSError("simulator licence server unreachable")
    return make_flaky(ctx)


@pytest.mark.parametrize("cfg", [{}, {"num_env_workers": 2}, {"remote_envs": True}])
def test_a_failed_rebuild_names_both_causes_as_in_process(cfg):
    """Sub-env 1 raises, then its rebuild raises: the error says both, in the words of the
    runner's own process (the sub-env named globally, the step's exception as cause)."""
    runner = runner_for(
        make_flaky_unrebuildable,
        make_indexed,
        n=3,
        frag=12,
        seed=21,
        restart_failed_sub_environments=True,
        **cfg,
    )
    with pytest.raises(rc.EnvError) as info:
        sample_all(runner, 2)
    assert str(info.value).startswith(
        "sub-env 1 could not be rebuilt after it raised RuntimeError: flaky env failed; "
        "simulator licence server unreachable"
    ), str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, RuntimeError) and str(cause) == "flaky env failed"


class UnrebuildablePair(FlakyPair):
    def __init__(self, ctx: rc.EnvContext) -> None:
        if ctx.seed != 21 + ctx.vector_index:  # a rebuild: its seed is derived
            raise OSError("simulator licence server unreachable")
        super().__init__(ctx)


@pytest.mark.parametrize("cfg", [{}, {"remote_envs": True}])
def test_a_failed_multi_agent_rebuild_names_both_causes(cfg):
    space = StepCountEnv.observation_space, StepCountEnv.action_space
    config = rc.RunnerConfig(
        num_envs=3, rollout_fragment_length=12, seed=21, restart_failed_sub_environments=True, **cfg
    )
    runner = rc.EnvRunner(
        UnrebuildablePair, {"p": rc.RandomPolicy(*space)}, lambda *a, **k: "p", config=config
    )
    with pytest.raises(rc.EnvError) as info:
        sample_all(runner, 3)
    assert str(info.value).startswith(
        "sub-env 1 could not be rebuilt after it raised RuntimeError: flaky env failed; "
        "simulator licence server unreachable"
    ), str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
