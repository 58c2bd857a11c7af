"""The parallel paths (env workers, EnvPool, threads) where an outside check found them
worse than the runner's own process; each must now behave as in-process:

- an info that cannot be pickled (a lock) replaces only its own row's info, with one
  warning per sub-env; every row stays true to the ledger and equal to an in-process run;
- a sub-env that raised and whose rebuild raises too reports both causes, in a worker as
  in the runner's process;
- env creators slower than any wait of the workers' own build; only
  ``env_build_timeout_s`` bounds them, and its error names it;
- a worker that fails at start-up is the only one heard from, and nothing is left behind;
- EnvPool: an episode that ends by the env's rules exactly at the horizon stays terminated;
- the policy, connector and lambda registries, used from many threads at once.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from typing import Any

import numpy as np
import pytest
from faults import (
    INFO_KINDS,
    FaultSchedule,
    FaultyEnvCreator,
    KeyedPolicy,
    Ledger,
    OneFault,
)
from invariants import Figures, Run, check_truth, make_runner

import rlconnect as rc
from rlconnect.errors import EnvTimeoutError

pytestmark = pytest.mark.reliability

FIGURES = Figures()
SEED = 0  # make_runner's: sub-env i is first built with seed SEED + i


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_parallel_paths")


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


def _restore_keys(run: Run) -> list[tuple[int, int, int]]:
    """Give rows whose info was replaced their ledger key back (read from the info's
    repr), so ``check_truth`` traces them too; returns those keys."""
    replaced = []
    for batch, _ in run.batches:
        infos = batch["infos"]
        for r, info in enumerate(infos):
            if "unpicklable_info" in info:
                found = re.search(r"'key': \((\d+), (\d+), (\d+)\)", info["unpicklable_info"])
                assert found is not None, info
                key = tuple(int(x) for x in found.groups())
                infos[r] = {"key": key}
                replaced.append(key)
    return replaced


def test_an_unpicklable_info_replaces_only_its_own_rows_info(tmp_path):
    schedule = FaultSchedule(11, INFO_KINDS, envs=(0, 3), p=0.7)
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(schedule, ledger, num_envs=4, frag=25, num_env_workers=2)
    try:
        with pytest.warns(RuntimeWarning, match="cannot be pickled") as record:
            run = Run(runner, ledger).sample(3)
    finally:
        runner.stop()
    replaced = _restore_keys(run)
    check_truth(run, FIGURES)
    faults = ledger.refresh().faults
    lock_steps = {(f.env, f.episode, f.t - 1) for f, _ in faults}  # a step's key: t before
    handed_out = {tuple(i["key"]) for b, _ in run.batches for i in b["infos"] if "key" in i}
    assert set(replaced) == lock_steps & handed_out and replaced  # those rows, no others
    warned = sorted(int(re.match(r"sub-env (\d+):", str(w.message))[1]) for w in record)
    assert warned == sorted({f.env for f, _ in faults})  # once per sub-env
    # in the runner's process: the very same rows, the locks kept in their infos
    local = Ledger()
    reference = Run(make_runner(schedule, local, num_envs=4, frag=25), local).sample(3)
    reference.runner.stop()
    for (ours, _), (theirs, _) in zip(run.batches, reference.batches, strict=True):
        for col in ours:
            if col != "infos":
                np.testing.assert_array_equal(ours[col], theirs[col], err_msg=col)
        kept = [tuple(i["key"]) for i in theirs["infos"] if "handle" in i]
        assert set(kept) <= set(replaced)
    FIGURES.faults_injected.update(ledger.injected())
    FIGURES.counts["rows_with_an_unpicklable_info"] += len(replaced)
    FIGURES.counts["neighbour_infos_replaced"] += len(set(replaced) - lock_steps)
    FIGURES.counts["unpicklable_info_warnings"] += len(warned)


class Unrebuildable(FaultyEnvCreator):
    """Builds a sub-env once; rebuilding it raises (a simulator licence server is gone)."""

    def __call__(self, ctx: rc.EnvContext) -> Any:
        if ctx.seed != SEED + ctx.vector_index:  # a rebuild: its seed is derived
            raise OSError("injected rebuild failure: licence server unreachable")
        return super().__call__(ctx)


def test_a_failed_rebuild_keeps_both_causes_in_a_worker_as_in_process(tmp_path):
    said = {}
    for workers in (0, 2):
        ledger = Ledger(tmp_path / f"ledger{workers}") if workers else Ledger()
        creator = Unrebuildable(OneFault("step_raise", env=2, episode=1, t=3), ledger)
        space, actions = creator.base.observation_space, creator.base.action_space
        config = rc.RunnerConfig(
            num_envs=3,
            rollout_fragment_length=10,
            seed=SEED,
            restart_failed_sub_environments=True,
            num_env_workers=workers,
        )
        runner = rc.EnvRunner(creator, KeyedPolicy(space, actions), config=config)
        try:
            with pytest.raises(rc.EnvError) as info:
                Run(runner, ledger).sample(10)
        finally:
            runner.stop()
        assert type(info.value.__cause__).__name__ == "InjectedFault"
        said[workers] = str(info.value).splitlines()[0]
        FIGURES.faults_injected.update(ledger.refresh().injected())
        FIGURES.faults_injected["rebuild_raise"] += 1
    assert said[2] == said[0], said
    assert said[0] == (
        "sub-env 2 could not be rebuilt after it raised InjectedFault: injected step failure "
        "in sub-env 2; injected rebuild failure: licence server unreachable"
    )
    FIGURES.counts["rebuild_errors_with_both_causes"] += 2


class SlowCreator(FaultyEnvCreator):
    """A simulator that takes ``build_s`` to start."""

    build_s = 1.0

    def __call__(self, ctx: rc.EnvContext) -> Any:
        time.sleep(self.build_s)
        return super().__call__(ctx)


@pytest.mark.slow
def test_slow_env_creators_build_in_workers_bounded_only_by_their_setting(monkeypatch):
    """Any wait of the workers' own, shrunk to 0.3 s, must not matter; only
    ``env_build_timeout_s`` bounds the creator, and its error names that setting."""
    import rlconnect.envs.workers.handle as handle

    monkeypatch.setattr(handle, "BUILD_WAIT_S", 0.3, raising=False)
    before = _children()
    ledger = Ledger()
    creator = SlowCreator(FaultSchedule(0, ()), ledger)
    space, actions = creator.base.observation_space, creator.base.action_space

    def runner(**cfg: Any) -> rc.EnvRunner:
        config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, num_env_workers=2, **cfg)
        return rc.EnvRunner(creator, KeyedPolicy(space, actions), config=config)

    built = runner()
    try:
        assert len(built.sample()) == 10
    finally:
        built.stop()
    with pytest.raises(EnvTimeoutError, match=r"env_build_timeout_s") as info:
        runner(env_build_timeout_s=0.3)
    assert "sub_env_timeout_s" not in str(info.value)
    assert _children() <= before
    FIGURES.faults_injected["slow_build"] += 2
    FIGURES.counts["slow_builds_completed"] += 1
    FIGURES.counts["slow_builds_timed_out_naming_their_setting"] += 1


class FailsAtStart(FaultyEnvCreator):
    def __call__(self, ctx: rc.EnvContext) -> Any:
        if ctx.vector_index == 3:
            raise RuntimeError("injected start-up failure in sub-env 3")
        return super().__call__(ctx)


def test_a_worker_failing_at_start_up_is_the_only_one_heard_from(capfd):
    before = _children()
    creator = FailsAtStart(FaultSchedule(0, ()), Ledger())
    space, actions = creator.base.observation_space, creator.base.action_space
    config = rc.RunnerConfig(num_envs=4, num_env_workers=4)
    with pytest.raises(RuntimeError, match="injected start-up failure in sub-env 3"):
        rc.EnvRunner(creator, KeyedPolicy(space, actions), config=config)
    assert _children() <= before
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    FIGURES.faults_injected["start_up_raise"] += 1
    FIGURES.counts["tracebacks_from_healthy_workers"] += err.count("Traceback")


@pytest.mark.parametrize("poll", [None, 2])
def test_envpool_keeps_a_terminal_step_at_the_horizon(poll):
    pytest.importorskip("envpool")
    from tests.envs.env_cases import episode_ends

    natural = episode_ends("envpool:CartPole-v1", None, n=4, env_poll_size=poll)
    h = sorted(length for length, _, _ in natural.values())[len(natural) // 2]
    cut = episode_ends("envpool:CartPole-v1", h, n=4, env_poll_size=poll)
    common = set(natural) & set(cut)
    at_h = [k for k in common if natural[k][0] == h]
    assert at_h and len(common) >= 20
    for key in common:
        length = natural[key][0]
        assert cut[key] == (min(length, h), length <= h, length >= h), (key, natural[key])
    FIGURES.counts["envpool_episodes_compared_with_and_without_a_horizon"] += len(common)
    FIGURES.counts["envpool_terminal_steps_at_the_horizon_kept"] += len(at_h)


def test_registries_used_from_many_threads_at_once(tmp_path, monkeypatch):
    """First lookups of a lazy policy kind (a slow import), and registrations beside
    listings of connectors and lambdas, from 8 threads at once: no error, every thread
    sees the same class."""
    from rlconnect.connectors.action.clip_actions import ClipActions
    from rlconnect.connectors.registry import registered_lambdas
    from rlconnect.policy.registry import get_policy_class, policy_kind, register_lazy_policy

    module = "_slow_policy_module_for_reliability"
    (tmp_path / f"{module}.py").write_text(
        "import time\n"
        "from rlconnect.policy import RandomPolicy\n"
        "time.sleep(0.3)  # imports slowly, as torch does\n"
        "class SlowPolicy(RandomPolicy):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    register_lazy_policy("_ReliabilitySlowPolicy", f"{module}:SlowPolicy")
    barrier = threading.Barrier(8)
    got: list[Any] = []

    def work(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            got.append(get_policy_class("_ReliabilitySlowPolicy").__name__)
            rc.register_lambda(f"_reliability_fn_{i}", abs)
            rc.register_connector(f"_ReliabilityClip_{i}", type(f"Clip{i}", (ClipActions,), {}))
            rc.registered_connectors()
            policy_kind(rc.RandomPolicy(*_spaces()))
        except Exception as exc:  # what the test reports
            got.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert got == ["SlowPolicy"] * 8, got
    assert {f"_reliability_fn_{i}" for i in range(8)} <= set(registered_lambdas())
    FIGURES.counts["registry_calls_from_threads"] += 8 * 5


def _spaces() -> tuple[Any, Any]:
    import gymnasium as gym

    return gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2)
