"""Sub-envs in worker processes (``remote_envs=True``, one env worker per sub-env): hangs,
crashes and odd exceptions.

- A worker that hangs past ``sub_env_timeout_s`` gives an ``EnvTimeoutError`` (a
  ``TimeoutError``) naming the sub-env, within the timeout plus slack; with restarts its
  worker process is killed and replaced, its episode dropped, the others' kept.
- An exception in a worker (no args, an odd constructor, unpicklable) reaches the parent
  as itself (or as an ``rc.EnvError`` with its type, message and traceback) and names
  the sub-env; with restarts the sub-env is rebuilt in its worker, and every transition
  is the one in-process sub-envs produce.
- A sub-env that fails in every episode (after good steps) uses up the restart budget
  and raises ``EnvError`` in workers as in-process.
- No worker process is left behind: after ``stop()`` the children are gone.

The envs write to a file-backed ledger (they live in other processes).
"""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest
from faults import (
    EVERY_EPISODE_KIND,
    RAISE_KINDS,
    RESET_KINDS,
    EveryEpisode,
    Fault,
    FaultSchedule,
    InjectedFault,
    Ledger,
    OddFault,
    OneFault,
)
from invariants import (
    Figures,
    Run,
    check_conservation,
    check_drops,
    check_truth,
    make_runner,
)

import rlconnect as rc
from machine_speed import scaled
from rlconnect.errors import EnvTimeoutError, RunnerStateError

pytestmark = pytest.mark.reliability

FIGURES = Figures()
TIMEOUT = 1.5  # generous: a healthy worker on a loaded CI machine must never hit it


class OneHangAmong(FaultSchedule):
    """``base``'s faults, plus a hang in episode ``episode`` of sub-env ``env`` at step 2."""

    def __init__(self, base: FaultSchedule, env: int, episode: int) -> None:
        super().__init__(base.seed, base.kinds, envs=base.envs)
        self.base, self.hang = base, Fault(env, episode, 2, "hang")

    def at(self, env: int, episode: int) -> Fault | None:
        return self.hang if (env, episode) == self.hang[:2] else self.base.at(env, episode)


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_remote_faults")


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


def _workers(before: set[int]) -> dict[str, int]:
    """The worker processes started since ``before``, by process name (one per sub-env)."""
    return {p.name: p.pid for p in multiprocessing.active_children() if p.pid not in before}


def test_a_hung_worker_is_a_named_timeout_within_the_deadline(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(
        OneFault("hang", env=1, episode=1, t=2),
        ledger,
        num_envs=3,
        frag=10,
        remote_envs=True,
        sub_env_timeout_s=TIMEOUT,
    )
    run = Run(runner, ledger)
    try:
        start = time.monotonic()
        with pytest.raises(
            EnvTimeoutError, match=r"sub-env 1 did not finish a step within 1\.5 s"
        ) as e:
            run.sample(10)
        ((_, fired),) = ledger.refresh().faults
        waited = time.monotonic_ns() - fired
        assert waited / 1e9 < TIMEOUT + scaled(2.0)  # the deadline, plus slack for the load
        FIGURES.counts["hang_detection_ms"] = waited // 1_000_000  # vs the 1500 ms timeout
        assert time.monotonic() - start < scaled(10)
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, rc.EnvError)
        assert "worker process" in str(e.value) and "was killed" in str(e.value)
        with pytest.raises(RunnerStateError):
            runner.sample()
    finally:
        runner.stop()
    assert _children() <= before  # the hung worker was killed, the others closed
    FIGURES.faults_injected.update(ledger.injected())
    FIGURES.counts["hangs_detected"] += 1


def test_with_restarts_a_hung_worker_is_replaced_and_only_its_episode_dropped(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    schedule = OneHangAmong(FaultSchedule(4, ("step_raise",), envs=(2,), p=0.5), 2, 2)
    runner = make_runner(
        schedule,
        ledger,
        num_envs=3,
        frag=20,
        remote_envs=True,
        sub_env_timeout_s=TIMEOUT,
        restart_failed_sub_environments=True,
    )
    pids = _workers(before)
    assert len(pids) == 3
    try:
        run = Run(runner, ledger).sample(3)
        identity = check_truth(run, FIGURES)
        check_drops(run, FIGURES)
        check_conservation(run, identity)
        injected = ledger.injected()
        assert injected["hang"] == 1 and injected["step_raise"] >= 1
        now = _workers(before)
        assert now.keys() == pids.keys()  # one live worker per sub-env, no zombie or leftover
        replaced = {name for name in pids if now[name] != pids[name]}
        assert replaced == {"rlconnect-env-worker-2"}  # only the hung sub-env's worker
    finally:
        runner.stop()
    assert _children() <= before
    FIGURES.faults_injected.update(injected)
    FIGURES.counts["hangs_detected"] += injected["hang"]


@pytest.mark.parametrize("kind", ["noargs_raise", "odd_raise", "unpicklable_raise"])
def test_odd_exceptions_in_a_worker_are_reported_not_a_broken_error_path(kind, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(OneFault(kind, env=0, episode=1, t=2), ledger, frag=10, remote_envs=True)
    try:
        with pytest.raises(rc.EnvError, match=r"sub-env 0 raised ") as info:
            Run(runner, ledger).sample(10)
    finally:
        runner.stop()
    cause = info.value.__cause__
    if kind == "unpicklable_raise":  # cannot travel as itself: type, message and traceback
        assert isinstance(cause, rc.EnvError)
        assert "UnpicklableFault: injected failure" in str(cause) and "Traceback" in str(cause)
        assert "worker process of sub-env 0" in str(cause)
    else:
        assert (
            type(cause).__name__ == {"noargs_raise": "NoArgsFault", "odd_raise": "OddFault"}[kind]
        )
        if kind == "odd_raise":
            assert isinstance(cause, OddFault) and cause.code == 7
    FIGURES.faults_injected.update(ledger.refresh().injected())


def test_with_restarts_raising_workers_are_rebuilt_in_place(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    schedule = FaultSchedule(8, RAISE_KINDS + RESET_KINDS, envs=(0, 2), p=0.6)
    runner = make_runner(
        schedule,
        ledger,
        num_envs=3,
        frag=25,
        remote_envs=True,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=100,
    )
    pids = _workers(before)
    assert len(pids) == 3
    try:
        run = Run(runner, ledger).sample(3)
        assert all(len(b) == 75 for b, _ in run.batches)
        identity = check_truth(run, FIGURES)
        check_drops(run, FIGURES)  # includes: the sub-env was built once more per fault
        check_conservation(run, identity)
        assert _workers(before) == pids  # the same worker processes
    finally:
        runner.stop()
    assert _children() <= before
    # the same schedule in-process: every transition, after restarts too, is the same
    local = Ledger()
    local_runner = make_runner(
        schedule,
        local,
        num_envs=3,
        frag=25,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=100,
    )
    Run(local_runner, local).sample(3)
    assert set(ledger.steps) == set(local.steps)  # synchronous: the very same steps
    differ = [k for k in ledger.steps if not _equal(ledger.steps[k], local.steps[k])]
    assert not differ, differ[:5]
    FIGURES.counts["remote_transitions_equal_to_in_process"] += len(ledger.steps)
    injected = ledger.injected()
    assert sum(injected.values()) >= 10
    FIGURES.faults_injected.update(injected)


def test_a_worker_sub_env_failing_in_every_episode_gives_up_after_the_restart_limit(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(
        EveryEpisode(env=1, t=3, episodes=50),
        ledger,
        num_envs=2,
        frag=10,
        remote_envs=True,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=2,
    )
    run = Run(runner, ledger)
    try:
        with pytest.raises(
            rc.EnvError, match=r"sub-env 1 failed 3 times in a row without completing an episode"
        ) as info:
            run.sample(50)
        assert isinstance(info.value.__cause__, InjectedFault)
    finally:
        runner.stop()
    assert _children() <= before
    injected = ledger.refresh().injected()
    assert injected == {EVERY_EPISODE_KIND: 3} and ledger.builds[1] == 3  # 2 restarts
    faulty = [m for m in run.metrics + runner.get_metrics() if m["episode_faulty"]]
    assert [(m["env_id"], m["episode_length"]) for m in faulty] == [(1, 2)] * 2
    check_truth(run, FIGURES)
    FIGURES.faults_injected.update(injected)
    FIGURES.episodes_dropped[EVERY_EPISODE_KIND] += len(faulty)
