"""Sub-envs that raise or return bad data at seeded steps: restart-and-drop or a named error.

The sweep runs seeded schedules of every kind of sub-env failure (``step``/``reset``
raising, exceptions with no args or an odd constructor, NaN/inf observations, NaN
rewards, wrong shapes and dtypes) with ``restart_failed_sub_environments=True`` and checks
every invariant of ``invariants.py`` on every run; without restarts each kind gives its
documented outcome. The last test asserts the sweep injected at least 1,000 faults.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from faults import (
    EVERY_EPISODE_KIND,
    FAILING_KINDS,
    RAISE_KINDS,
    RESET_KINDS,
    SHAPE_KINDS,
    VALUE_KINDS,
    EveryEpisode,
    FaultSchedule,
    InjectedFault,
    Ledger,
    NoArgsFault,
    OddFault,
    OneFault,
    UnpicklableFault,
)
from invariants import (
    Figures,
    Run,
    check_conservation,
    check_drops,
    check_equivalence,
    check_truth,
    make_runner,
    reference_ledger,
)

import rlconnect as rc
from machine_speed import scaled
from rlconnect.errors import RunnerStateError

pytestmark = pytest.mark.reliability

FIGURES = Figures()
NUM_ENVS, FRAG, SAMPLES = 4, 25, 4

#: the sweep: kinds of failure -> seeds; every run injects 10-30 faults
SWEEP = {
    "raises": (RAISE_KINDS + RESET_KINDS, range(16)),
    "values": (VALUE_KINDS, range(100, 114)),
    "shapes": (SHAPE_KINDS, range(200, 212)),
}
_swept: set[str] = set()


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_env_faults")


def sweep_one(kinds: tuple[str, ...], seed: int) -> int:
    """One seeded run with restarts; checks every invariant; returns faults injected."""
    complete = seed % 3 == 2
    mode = "complete_episodes" if complete else "truncate_episodes"
    schedule = FaultSchedule(seed, kinds, envs=(1, 3), p=0.6)
    ledger = Ledger()
    runner = make_runner(
        schedule,
        ledger,
        num_envs=NUM_ENVS,
        frag=FRAG,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=100,  # the limit has its own test
        batch_mode=mode,
    )
    run = Run(runner, ledger).sample(SAMPLES)
    for batch, _ in run.batches:
        if complete:  # at least the size, and only whole episodes
            assert len(batch) >= NUM_ENVS * FRAG
            for episode in batch.split_by_episode():
                assert episode["terminateds"][-1] or episode["truncateds"][-1]
                assert episode["t"][0] == 0
        else:
            assert len(batch) == NUM_ENVS * FRAG  # the exact size, faults or not
    identity = check_truth(run, FIGURES)
    check_drops(run, FIGURES)
    check_conservation(run, identity)
    if seed % 2 == 0:  # data equivalence with a fault-free run of the same seeds
        check_equivalence(run, reference_ledger(run, schedule, frag=FRAG), FIGURES)
    faulty = [m for m in run.metrics if m["episode_faulty"]]
    assert all(m["env_id"] in schedule.envs for m in faulty)
    injected = ledger.injected()
    FIGURES.faults_injected.update(injected)
    return sum(injected.values())


@pytest.mark.parametrize("group", sorted(SWEEP))
def test_sweep_restarts_drop_only_the_faulty_episodes(group):
    kinds, seeds = SWEEP[group]
    injected = sum(sweep_one(kinds, seed) for seed in seeds)
    _swept.add(group)
    assert injected >= 10 * len(seeds)  # the schedules really fire


EXPECTED_WITHOUT_RESTART = {
    "step_raise": (rc.EnvError, r"sub-env 1 raised InjectedFault: injected step", InjectedFault),
    "reset_raise": (rc.EnvError, r"sub-env 1 raised InjectedFault: injected reset", InjectedFault),
    "noargs_raise": (rc.EnvError, r"sub-env 1 raised NoArgsFault \(set RunnerConfig", NoArgsFault),
    "odd_raise": (rc.EnvError, r"sub-env 1 raised OddFault: \(7, 'odd'\)", OddFault),
    "unpicklable_raise": (rc.EnvError, r"raised UnpicklableFault: injected", UnpicklableFault),
    "bad_shape": (rc.EnvCheckError, r"env 1 / agent 'agent0': wrong shape \(6,\)", None),
    "bad_dtype": (rc.EnvCheckError, r"env 1 / agent 'agent0': wrong dtype complex64", None),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED_WITHOUT_RESTART))
def test_without_restart_the_error_names_the_sub_env(kind):
    error, message, cause = EXPECTED_WITHOUT_RESTART[kind]
    ledger = Ledger()
    runner = make_runner(OneFault(kind, env=1, episode=2, t=3), ledger, frag=10)
    run = Run(runner, ledger)
    with pytest.raises(error, match=message) as info:
        run.sample(20)
    FIGURES.faults_injected.update(ledger.injected())
    if cause is None:
        assert info.value.__cause__ is None
    else:
        assert type(info.value.__cause__) is cause  # the original exception, as raised
    assert ledger.injected() == {kind: 1}
    assert run.batches, "the fault fires in a later batch"
    check_truth(run, FIGURES)  # what was handed out before the error is true
    with pytest.raises(RunnerStateError, match=r"raised .* midway") as again:
        runner.sample()  # refuses instead of hanging or sampling from a broken state
    assert again.value.__cause__ is info.value


def test_an_error_in_a_background_sampler_is_raised_once_then_refused():
    ledger = Ledger()
    runner = make_runner(OneFault("step_raise", env=0, episode=1, t=2), ledger, sample_async=True)
    start = time.monotonic()
    with pytest.raises(rc.EnvError, match="sub-env 0 raised InjectedFault") as info:
        Run(runner, ledger).sample(10)
    with pytest.raises(RunnerStateError) as again:  # not a wait for a batch that never comes
        runner.sample()
    assert again.value.__cause__ is info.value and time.monotonic() - start < scaled(10)
    runner.stop()
    FIGURES.faults_injected.update(ledger.injected())


@pytest.mark.parametrize("kind", [*VALUE_KINDS, "out_of_space"])
def test_without_restart_values_are_recorded_as_the_env_gave_them(kind):
    """Documented: with ``check_finite=False`` and after the ``check_env`` polls nothing
    checks values, so a NaN, an inf or an out-of-bounds observation (or a NaN reward) is
    recorded exactly as produced (by default a non-finite one raises EnvCheckError)."""
    ledger = Ledger()
    runner = make_runner(OneFault(kind, env=1, episode=2, t=3), ledger, frag=10, check_finite=False)
    run = Run(runner, ledger).sample(8)
    check_truth(run, FIGURES)
    FIGURES.faults_injected.update(ledger.injected())
    (key,) = [k for k, s in ledger.steps.items() if not s.clean]
    rows = [b for b, _ in run.batches if any(i.get("key") == key for i in b["infos"])]
    assert len(rows) == 1  # the bad transition is in a batch, as the env gave it


@pytest.mark.parametrize("kind", VALUE_KINDS)
def test_by_default_a_late_non_finite_value_raises_naming_it(kind):
    ledger = Ledger()
    runner = make_runner(OneFault(kind, env=1, episode=2, t=3), ledger, frag=10)
    field = "reward" if "reward" in kind else "obs"
    with pytest.raises(rc.EnvCheckError, match=rf"sub-env 1 .*field '{field}', at step 3"):
        Run(runner, ledger).sample(8)


ONE_FAULT_KINDS = [k for k in FAILING_KINDS if k not in ("hang", EVERY_EPISODE_KIND)]


@pytest.mark.parametrize("kind", ONE_FAULT_KINDS)  # hang: see test_remote_faults.py
def test_one_fault_with_restart_drops_one_episode_and_rebuilds_once(kind):
    ledger = Ledger()
    runner = make_runner(
        OneFault(kind, env=2, episode=1, t=2), ledger, frag=15, restart_failed_sub_environments=True
    )
    run = Run(runner, ledger).sample(6)
    identity = check_truth(run, FIGURES)
    check_drops(run, FIGURES)
    check_conservation(run, identity)
    faulty = [m for m in run.metrics if m["episode_faulty"]]
    length = 0 if kind == "reset_raise" else 1  # the steps before the fault
    assert [(m["env_id"], m["episode_length"]) for m in faulty] == [(2, length)]
    assert ledger.builds == {0: 1, 1: 1, 2: 2, 3: 1}
    FIGURES.faults_injected.update(ledger.injected())


def test_a_reset_that_always_raises_gives_up_after_the_restart_limit():
    ledger = Ledger()
    schedule = FaultSchedule(0, RESET_KINDS, envs=(1,), p=1.0)  # every reset of sub-env 1
    runner = make_runner(
        schedule, ledger, frag=10, restart_failed_sub_environments=True, sub_env_restart_limit=4
    )
    with pytest.raises(
        rc.EnvError,
        match=r"sub-env 1 failed 5 times in a row .*"
        r"gave up after 4 restarts \(RunnerConfig.sub_env_restart_limit\)",
    ) as info:
        runner.sample()
    assert isinstance(info.value.__cause__, InjectedFault)
    assert ledger.injected() == {"reset_raise": 5} and ledger.builds[1] == 5  # 4 restarts
    faulty = [m for m in runner.get_metrics() if m["episode_faulty"]]
    assert len(faulty) == 4 and {m["env_id"] for m in faulty} == {1}
    FIGURES.faults_injected.update(ledger.injected())


@pytest.mark.parametrize("mode", ["truncate_episodes", "complete_episodes"])
def test_a_sub_env_failing_in_every_episode_gives_up_after_the_restart_limit(mode):
    """Good steps between the failures do not reset the budget, only a
    completed episode does (before, this restarted 1,000 times a second forever; the
    schedule stops after 50 episodes, so an unbounded runner ends and this test fails)."""
    ledger = Ledger()
    runner = make_runner(
        EveryEpisode(env=1, t=3, episodes=50),
        ledger,
        frag=10,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=3,
        batch_mode=mode,
    )
    run = Run(runner, ledger)
    with pytest.raises(
        rc.EnvError,
        match=r"sub-env 1 failed 4 times in a row without completing an episode "
        r"\(last: InjectedFault: injected failure in episode 3 of 1\); "
        r"gave up after 3 restarts \(RunnerConfig.sub_env_restart_limit\)",
    ) as info:
        run.sample(50)
    assert type(info.value.__cause__) is InjectedFault  # the last exception, as raised
    assert ledger.injected() == {EVERY_EPISODE_KIND: 4} and ledger.builds[1] == 4
    records = run.metrics + runner.get_metrics()
    faulty = [m for m in records if m["episode_faulty"]]
    assert [(m["env_id"], m["episode_length"]) for m in faulty] == [(1, 2)] * 3
    check_truth(run, FIGURES)  # what was handed out before the error is true
    FIGURES.faults_injected.update(ledger.injected())
    FIGURES.episodes_dropped[EVERY_EPISODE_KIND] += len(faulty)


def test_a_completed_episode_between_failures_renews_the_restart_budget():
    """Failing in every other episode, after good steps, with a budget of one restart:
    each completed episode in between ends the streak, so every failure is restarted."""
    ledger = Ledger()
    schedule = EveryEpisode(env=0, t=2, episodes=10**6, every=2)
    runner = make_runner(
        schedule, ledger, frag=30, restart_failed_sub_environments=True, sub_env_restart_limit=1
    )
    run = Run(runner, ledger).sample(3)
    assert ledger.injected()[EVERY_EPISODE_KIND] > 5  # far more than the limit
    identity = check_truth(run, FIGURES)
    check_drops(run, FIGURES)
    check_conservation(run, identity)
    FIGURES.faults_injected.update(ledger.injected())


def test_the_invariant_checks_can_fail():
    """Negative controls: a changed reward, a row of a faulty episode and a lost drop
    record are each caught."""
    ledger = Ledger()
    schedule = FaultSchedule(5, ("step_raise",), envs=(1,), p=1.0, first_step=3, last_step=3)
    runner = make_runner(  # every episode of sub-env 1 fails: a budget to last the run
        schedule, ledger, frag=10, restart_failed_sub_environments=True, sub_env_restart_limit=100
    )
    run = Run(runner, ledger).sample(3)
    scratch = Figures()
    check_truth(run, scratch)
    batch, _ = run.batches[0]
    batch["rewards"][0] += 1.0
    with pytest.raises(AssertionError, match="not true to the simulator"):
        check_truth(run, scratch)
    batch["rewards"][0] -= 1.0
    rows = batch["env_id"] == 1
    fault, _ = ledger.faults[0]
    episode = batch["infos"][np.flatnonzero(rows)[0]]["key"][1]
    ledger.faults[0] = (fault._replace(episode=episode), 0)  # as if it failed back then
    with pytest.raises(AssertionError, match="leaked from faulty episodes"):
        check_truth(run, scratch)
    run.metrics = [m for m in run.metrics if not m["episode_faulty"]][1:]
    with pytest.raises(AssertionError, match="faulty records"):
        check_drops(run, scratch)


def test_the_suite_injected_at_least_1000_faults():
    """Sums what this session's sweep injected (running any sweep group a partial test
    selection left out), plus the table-driven cases above."""
    for group, (kinds, seeds) in SWEEP.items():
        if group not in _swept:
            for seed in seeds:
                sweep_one(kinds, seed)
            _swept.add(group)
    total = FIGURES.total_injected()
    assert total >= 1000, FIGURES.as_dict()
    assert FIGURES.counts["corrupted_or_leaked_rows"] == 0
    assert FIGURES.counts["collateral_drops"] == 0
    assert (
        FIGURES.counts["unaffected_episodes_identical"]
        == FIGURES.counts["unaffected_episodes_compared"]
        > 0
    )
