"""Sub-envs in env workers (``num_env_workers``): raises, odd exceptions and hangs.

The same fault schedules as ``test_remote_faults.py``, on groups of sub-envs per worker
process: a raising sub-env is rebuilt inside its worker and every transition (after
restarts too) is the one in-process sub-envs produce; a hung worker is killed at the
timeout and replaced, and only its sub-envs' episodes are dropped; nothing is left behind.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
from faults import (
    RAISE_KINDS,
    RESET_KINDS,
    EveryEpisode,
    FaultSchedule,
    Ledger,
    OneFault,
)
from invariants import Figures, Run, check_conservation, check_drops, check_truth, make_runner

import rlconnect as rc

pytestmark = pytest.mark.reliability

FIGURES = Figures()
TIMEOUT = 1.5  # generous: a healthy worker on a loaded CI machine must never hit it


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_worker_faults")


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


def _equal(a, b) -> bool:
    return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


def test_with_restarts_raising_sub_envs_are_rebuilt_in_their_workers(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    schedule = FaultSchedule(8, RAISE_KINDS + RESET_KINDS, envs=(0, 2), p=0.6)
    cfg = {"restart_failed_sub_environments": True, "sub_env_restart_limit": 100}
    runner = make_runner(schedule, ledger, num_envs=3, frag=25, num_env_workers=2, **cfg)
    pids = [w.proc.pid for w in runner.env.workers]
    try:
        run = Run(runner, ledger).sample(3)
        assert all(len(b) == 75 for b, _ in run.batches)
        identity = check_truth(run, FIGURES)
        check_drops(run, FIGURES)  # includes: the sub-env was built once more per fault
        check_conservation(run, identity)
        assert [w.proc.pid for w in runner.env.workers] == pids  # same worker processes
    finally:
        runner.stop()
    assert _children() <= before
    local = Ledger()
    Run(make_runner(schedule, local, num_envs=3, frag=25, **cfg), local).sample(3)
    assert set(ledger.steps) == set(local.steps)  # synchronous: the very same steps
    differ = [k for k in ledger.steps if not _equal(ledger.steps[k], local.steps[k])]
    assert not differ, differ[:5]
    FIGURES.counts["worker_transitions_equal_to_in_process"] += len(ledger.steps)
    injected = ledger.injected()
    assert sum(injected.values()) >= 10
    FIGURES.faults_injected.update(injected)


@pytest.mark.parametrize("kind", ["noargs_raise", "odd_raise", "unpicklable_raise"])
def test_odd_exceptions_in_a_worker_are_reported(kind, tmp_path):
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(OneFault(kind, env=2, episode=1, t=2), ledger, frag=10, num_env_workers=2)
    try:
        with pytest.raises(rc.EnvError, match=r"sub-env 2 raised ") as info:
            Run(runner, ledger).sample(10)
    finally:
        runner.stop()
    cause = info.value.__cause__
    if kind == "unpicklable_raise":  # cannot travel as itself: type, message and traceback
        assert isinstance(cause, rc.EnvError)
        assert "UnpicklableFault: injected failure" in str(cause) and "Traceback" in str(cause)
    else:
        names = {"noargs_raise": "NoArgsFault", "odd_raise": "OddFault"}
        assert type(cause).__name__ == names[kind]
    FIGURES.faults_injected.update(ledger.refresh().injected())


def test_with_restarts_a_hung_worker_is_replaced_and_only_its_episodes_dropped(tmp_path):
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(
        OneFault("hang", env=3, episode=1, t=2),
        ledger,
        num_envs=4,
        frag=20,
        num_env_workers=2,
        sub_env_timeout_s=TIMEOUT,
        restart_failed_sub_environments=True,
    )
    pids = [w.proc.pid for w in runner.env.workers]
    try:
        run = Run(runner, ledger).sample(2)
        now = [w.proc.pid for w in runner.env.workers]
        assert now[0] == pids[0] and now[1] != pids[1]  # only the hung worker was replaced
        assert len(_children() - before) == 2
        check_truth(run, FIGURES)
        # no conservation check here: the step sub-env 2 took before sub-env 3 hung in the
        # same worker never reached the runner; it belongs to the episode dropped with it
        faulty = sorted(m["env_id"] for m in run.metrics if m["episode_faulty"])
        assert faulty == [2, 3]  # the hung worker's two sub-envs, nothing else
    finally:
        runner.stop()
    assert _children() <= before
    FIGURES.faults_injected.update(ledger.injected())
    FIGURES.counts["hangs_detected"] += 1


def test_a_sub_env_failing_in_every_episode_gives_up_in_its_worker_too(tmp_path):
    """A sub-env failing in every episode, in a worker process: the restart budget
    counts failures until a completed episode there too, and ends with EnvError."""
    before = _children()
    ledger = Ledger(tmp_path / "ledger")
    runner = make_runner(
        EveryEpisode(env=1, t=3, episodes=50),
        ledger,
        num_envs=3,
        frag=10,
        num_env_workers=2,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=3,
    )
    try:
        with pytest.raises(
            rc.EnvError,
            match=r"sub-env 1 failed 4 times in a row without completing an episode "
            r"\(last: .*injected failure in episode 3 of 1\)",
        ) as info:
            Run(runner, ledger).sample(50)  # the schedule ends after 50 episodes: no hang
        assert info.value.__cause__ is not None  # the last exception, from the worker
    finally:
        runner.stop()
    assert _children() <= before
