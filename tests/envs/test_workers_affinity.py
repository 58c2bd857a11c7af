"""Env workers keep to CPUs of their own while they get those CPUs' time, and let go when
something else keeps their CPU busy (``rlconnect.envs.workers.affinity``)."""

from __future__ import annotations

import multiprocessing
import os

import gymnasium as gym
import pytest
from env_cases import StepCountEnv, TwoAgents

import rlconnect as rc
from rlconnect.envs.workers import WorkerEnvs, affinity
from rlconnect.envs.workers.affinity import (
    FIRST_PAUSE_S,
    MAX_PAUSE_S,
    WINDOW_S,
    CorePin,
    worker_cpus,
)

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="the OS cannot pin processes to CPUs"
)


@pytest.fixture
def allowed():
    """This process's CPUs, given back after the test (CorePin pins the calling process)."""
    cpus = os.sched_getaffinity(0)
    yield sorted(cpus)
    os.sched_setaffinity(0, cpus)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def window(pin: CorePin, share: float) -> None:
    """One measuring window of polls that got ``share`` of their wall time as CPU time."""
    for _ in range(10):
        pin.polled(WINDOW_S / 10 + 1e-9, share * WINDOW_S / 10)


def test_a_worker_lets_go_of_a_busy_cpu_and_comes_back_after_a_doubling_pause(allowed):
    clock = Clock()
    pin = CorePin(allowed[-1], clock=clock)
    assert pin.pinned and os.sched_getaffinity(0) == {allowed[-1]}
    window(pin, 0.95)  # got its CPU: stays
    assert pin.pinned
    window(pin, 0.5)  # half of it: something else runs there
    assert not pin.pinned and os.sched_getaffinity(0) == set(allowed)
    clock.now += FIRST_PAUSE_S - 0.01
    window(pin, 1.0)
    assert not pin.pinned  # still pausing
    clock.now += 0.01
    pin.polled(0.001, 0.001)
    assert pin.pinned and os.sched_getaffinity(0) == {allowed[-1]}
    window(pin, 0.5)  # busy again: the pause doubles
    clock.now += FIRST_PAUSE_S
    pin.polled(0.001, 0.001)
    assert not pin.pinned
    clock.now += FIRST_PAUSE_S
    pin.polled(0.001, 0.001)
    assert pin.pinned
    for _ in range(12):  # the pause stops doubling at MAX_PAUSE_S
        window(pin, 0.1)
        clock.now += MAX_PAUSE_S
        pin.polled(0.001, 0.001)
        assert pin.pinned
    window(pin, 0.9)  # a good window: the next pause is the first one again
    window(pin, 0.1)
    clock.now += FIRST_PAUSE_S
    pin.polled(0.001, 0.001)
    assert pin.pinned


def test_no_cpu_means_never_pinned(allowed):
    pin = CorePin(None)
    window(pin, 0.1)
    assert not pin.pinned and os.sched_getaffinity(0) == set(allowed)


def test_a_cpu_that_cannot_be_had_stops_pinning(allowed):
    pin = CorePin(max(allowed) + 4096)  # no such CPU
    assert not pin.pinned and pin.cpu is None
    window(pin, 0.1)
    assert os.sched_getaffinity(0) == set(allowed)


def test_workers_get_distinct_cpus_only_when_there_is_one_for_each(allowed):
    assert worker_cpus(len(allowed)) == allowed
    assert worker_cpus(1) == allowed[:1]
    assert worker_cpus(len(allowed) + 1) == [None] * (len(allowed) + 1)
    # the runners of a group spread their workers over the CPUs, wrapping around
    assert worker_cpus(1, runner_index=1) == [allowed[1 % len(allowed)]]
    assert worker_cpus(len(allowed), runner_index=1) == allowed


class AffinityEnv(StepCountEnv):
    """Its reset info tells which CPUs the process that built it may run on."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["cpus"] = sorted(os.sched_getaffinity(0))
        return obs, info


@pytest.mark.parametrize("extra", [0, 1], ids=["one-cpu-each", "more-workers-than-cpus"])
def test_worker_processes_are_pinned_when_there_is_a_cpu_for_each(allowed, extra: int):
    num_workers = len(allowed) + extra
    env = WorkerEnvs(
        lambda ctx: gym.wrappers.TimeLimit(AffinityEnv(), 5), num_workers, num_workers=num_workers
    )
    try:
        cpus = [info["cpus"] for info in env.poll().infos]  # the first poll resets them all
    finally:
        env.close()
    if extra:
        assert cpus == [allowed] * num_workers
    else:
        assert cpus == [[c] for c in allowed]
    assert os.sched_getaffinity(0) == set(allowed)  # the runner's process is left alone


@pytest.mark.parametrize("multi_agent", [False, True], ids=["block", "piped"])
def test_every_poll_of_a_pinned_worker_is_measured(allowed, tmp_path, monkeypatch, multi_agent):
    """Polls through the block and polls through the pipe (multi-agent rows) both tell the
    worker's ``CorePin`` their times, so a starved worker lets go either way."""
    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the recording below reaches the workers by fork")

    def record(self, wall_s: float, cpu_s: float) -> None:
        with open(tmp_path / f"{os.getpid()}.txt", "a") as f:
            f.write(f"{wall_s} {cpu_s}\n")

    monkeypatch.setattr(affinity.CorePin, "polled", record)
    space = StepCountEnv.observation_space, StepCountEnv.action_space
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0, num_env_workers=2)
    if multi_agent:
        runner = rc.EnvRunner(
            TwoAgents, {"p": rc.RandomPolicy(*space)}, policy_mapping_fn=lambda *a, **k: "p",
            config=config,
        )  # fmt: skip
    else:
        env = lambda ctx: gym.wrappers.TimeLimit(StepCountEnv(), 5)  # noqa: E731
        runner = rc.EnvRunner(env, rc.RandomPolicy(*space), config=config)
    try:
        runner.sample()
    finally:
        runner.stop()
    files = sorted(tmp_path.glob("*.txt"))
    assert len(files) == min(2, len(allowed))  # each pinned worker measured its polls
    for f in files:
        times = [tuple(map(float, line.split())) for line in f.read_text().splitlines()]
        assert len(times) >= 5 and all(wall >= cpu >= 0 for wall, cpu in times)
