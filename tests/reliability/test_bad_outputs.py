"""Bad values from envs after the ``check_env`` polls: what reaches filters and batches.

- A NaN or inf observation at a late step (global step ~70) never reaches MeanStdFilter's
  statistics: with restarts the sub-env fails and its episode is dropped before any
  connector runs; without, the filter raises ValueError naming env id and agent id and
  its statistics are exactly what they were before that call.
- A wrong shape or dtype at any step is an ``EnvCheckError`` naming env and agent, raised
  by rlconnect (no numpy traceback from deep inside the stack).
- Inside the ``check_env`` polls, out-of-bounds values and NaN rewards are named errors
  too (or failures of the sub-env, with restarts).
"""

from __future__ import annotations

import numpy as np
import pytest
from faults import FaultSchedule, Ledger, OneFault
from invariants import Figures, Run, check_conservation, check_drops, check_truth, make_runner

import rlconnect as rc
from rlconnect.connectors import MeanStdFilter

pytestmark = pytest.mark.reliability

FIGURES = Figures()


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_bad_outputs")


class SnapshotFilter(MeanStdFilter):
    """MeanStdFilter that records its statistics before every call."""

    registered_name = "MeanStdFilter"  # named as the filter it stands in for

    def __call__(self, data):
        self.snapshots.append(self.get_statistics())
        return super().__call__(data)


def spy_on_filter(runner: rc.EnvRunner) -> SnapshotFilter:
    f = runner.agent_pipeline()["MeanStdFilter"]
    f.__class__ = SnapshotFilter
    f.snapshots = []
    return f


def _equal_stats(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in ("count", "mean", "m2"))


@pytest.mark.parametrize("check_finite", [True, False])
@pytest.mark.parametrize("kind", ["nan_obs", "inf_obs"])
def test_a_late_non_finite_obs_never_reaches_the_filter_statistics(kind, check_finite):
    """The runner's own check names it first (``check_finite``, the default); without
    it, the filter still refuses the value and leaves its statistics as they were."""
    ledger = Ledger()
    fault = OneFault(kind, env=1, episode=6, t=5)
    runner = make_runner(
        fault,
        ledger,
        frag=10,
        observation_filter="MeanStdFilter",
        keep_raw_obs=True,
        check_finite=check_finite,
    )
    spy = spy_on_filter(runner)
    with pytest.raises(ValueError, match=r"non-finite observation") as info:
        Run(runner, ledger).sample(30)
    msg = str(info.value)
    if check_finite:
        assert isinstance(info.value, rc.EnvCheckError)
        assert "sub-env 1 / agent 'agent0'" in msg and "field 'obs'" in msg and "step 5" in msg
    else:
        assert "MeanStdFilter: non-finite observation" in msg
        assert "(env_id=1, agent_id='agent0')" in msg and "statistics were left unchanged" in msg
        assert _equal_stats(spy.get_statistics(), spy.snapshots[-1])  # untouched by that call
    assert all(np.isfinite(spy.get_statistics()[k]).all() for k in ("mean", "m2"))
    (step,) = [s for s in ledger.steps.values() if not s.clean]
    assert len(ledger.steps) > 50  # a late step, long after the check_env polls
    assert not np.isfinite(step.next_obs).all()
    FIGURES.faults_injected.update(ledger.injected())
    FIGURES.counts["non_finite_detected"] += 1


def test_with_restarts_non_finite_values_are_failures_and_statistics_stay_clean():
    ledger = Ledger()
    schedule = FaultSchedule(11, ("nan_obs", "inf_obs", "nan_reward"), envs=(0, 2), p=0.5)
    runner = make_runner(
        schedule,
        ledger,
        frag=25,
        observation_filter="MeanStdFilter",
        keep_raw_obs=True,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=100,
    )
    spy = spy_on_filter(runner)
    run = Run(runner, ledger).sample(4)
    check_drops(run, FIGURES)
    stats = spy.get_statistics()
    assert all(np.isfinite(stats[k]).all() for k in ("mean", "m2"))
    # the filter saw every reset observation and every clean step, and nothing else
    resets = sum(ledger._episodes.values())
    clean = sum(s.clean for s in ledger.steps.values())
    assert clean < len(ledger.steps)
    assert stats["count"] == resets + clean
    injected = ledger.injected()
    assert sum(injected.values()) >= 10
    FIGURES.faults_injected.update(injected)
    FIGURES.counts["non_finite_detected"] += sum(injected.values())
    FIGURES.counts["statistics_contaminated"] += int(not np.isfinite(stats["m2"]).all())


@pytest.mark.parametrize(("kind", "t"), [("bad_shape", 2), ("bad_dtype", 2), ("bad_shape", 9)])
def test_a_wrong_shape_or_dtype_at_any_step_is_a_named_error(kind, t):
    ledger = Ledger()
    runner = make_runner(OneFault(kind, env=3, episode=3, t=t), ledger, frag=10)
    with pytest.raises(rc.EnvCheckError) as info:
        Run(runner, ledger).sample(30)
    assert "env 3 / agent 'agent0'" in str(info.value)
    assert "wrong shape (6,)" in str(info.value) or "wrong dtype complex64" in str(info.value)
    assert info.value.__cause__ is None and info.value.__context__ is None  # raised by us
    FIGURES.faults_injected.update(ledger.injected())


@pytest.mark.parametrize("kind", ["out_of_space", "nan_reward"])
def test_inside_the_check_env_polls_bad_values_are_named(kind):
    """The first episode's first step is checked (``check_env``) in both modes."""
    ledger = Ledger()
    runner = make_runner(OneFault(kind, env=2, episode=0, t=1), ledger, frag=10)
    what = "values outside" if kind == "out_of_space" else "non-finite rewards"
    with pytest.raises(rc.EnvCheckError, match=rf"{what}.*env 2 / agent 'agent0'"):
        runner.sample()
    FIGURES.faults_injected.update(ledger.injected())

    ledger = Ledger()
    runner = make_runner(
        OneFault(kind, env=2, episode=0, t=1), ledger, frag=10, restart_failed_sub_environments=True
    )
    run = Run(runner, ledger).sample(3)
    identity = check_truth(run, FIGURES)
    check_drops(run, FIGURES, also_failing=(kind,))  # a failure while check_env checks
    check_conservation(run, identity)
    assert [m["env_id"] for m in run.metrics if m["episode_faulty"]] == [2]
    FIGURES.faults_injected.update(ledger.injected())


def test_with_check_env_off_even_the_first_steps_are_recorded_as_given():
    ledger = Ledger()
    runner = make_runner(OneFault("out_of_space", env=2, episode=0, t=1), ledger, check_env=False)
    run = Run(runner, ledger).sample(2)
    check_truth(run, FIGURES)
    assert sum(not s.clean for s in ledger.steps.values()) == 1
    FIGURES.faults_injected.update(ledger.injected())
