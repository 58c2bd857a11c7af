"""Idle env workers with a CPU of their own watch for the next poll before they sleep on
their pipe (``rlconnect.envs.workers.linger``); the runner counts the polls it sends."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from env_cases import StepCountEnv

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.workers import WorkerEnvs, linger
from rlconnect.envs.workers import worker as worker_module

needs_yield = pytest.mark.skipif(not hasattr(os, "sched_yield"), reason="no sched_yield")


@needs_yield
def test_linger_returns_at_once_for_a_counter_that_passed_already():
    counter = np.array([0, 3], dtype=np.int64)
    t0 = time.perf_counter()
    assert linger.linger(counter, 1, 2, budget_s=5.0)
    assert time.perf_counter() - t0 < 1.0


@needs_yield
def test_linger_sees_a_counter_another_thread_bumps():
    counter = np.zeros(1, dtype=np.int64)
    bump = threading.Timer(0.02, lambda: counter.__setitem__(0, 1))
    bump.start()
    t0 = time.perf_counter()
    try:
        assert linger.linger(counter, 0, 0, budget_s=5.0)
    finally:
        bump.join()
    assert time.perf_counter() - t0 < 2.5  # far less than the budget


@needs_yield
def test_linger_gives_up_after_its_budget():
    counter = np.zeros(1, dtype=np.int64)
    t0 = time.perf_counter()
    assert not linger.linger(counter, 0, 0, budget_s=0.01)
    assert time.perf_counter() - t0 >= 0.01


def plain(ctx) -> gym.Env:
    return gym.wrappers.TimeLimit(StepCountEnv(10_000 * ctx.vector_index), max_episode_steps=5)


def step_all(env: WorkerEnvs) -> None:
    """Every sub-env's action, as the runner sends them after a synchronous poll."""
    ids = np.arange(env.num_envs)
    env.send_actions(ids, (DEFAULT_AGENT_ID,) * len(ids), np.zeros(len(ids), dtype=np.int64))


def test_the_runner_counts_the_polls_it_sends_each_worker_and_a_new_worker_starts_at_0():
    env = WorkerEnvs(plain, 4, num_workers=2)
    firsts = [w.lo for w in env.workers]
    try:
        for _ in range(3):
            rows = env.poll()
            assert not rows.errors
            step_all(env)
        assert env._a.posted[firsts].tolist() == [3, 3]
        os.kill(env.workers[1].proc.pid, signal.SIGKILL)
        env.workers[1].proc.join(5)
        rows = env.poll()  # worker 0 answers; worker 1's sub-envs report its death
        assert sorted(rows.errors) == [2, 3]
        assert env._a.posted[firsts].tolist() == [4, 3]  # no poll reached the dead one
        step_all(env)
        for e in (2, 3):
            env.try_restart(e)  # the first replaces the whole worker
        assert env._a.posted[firsts].tolist() == [4, 0]
        rows = env.poll()
        assert not rows.errors and sorted(rows.env_ids.tolist()) == [0, 1, 2, 3]
        assert env._a.posted[firsts].tolist() == [5, 1]
    finally:
        env.close()


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or multiprocessing.get_start_method() != "fork",
    reason="workers are pinned where the OS can, and the recording reaches them by fork",
)
@pytest.mark.parametrize("extra", [0, 1], ids=["one-cpu-each", "more-workers-than-cpus"])
def test_only_workers_with_a_cpu_of_their_own_linger(tmp_path, monkeypatch, extra):
    """A pinned worker watches for poll k+1 after it read k polls; workers that share
    CPUs go straight to their pipe."""

    def record(counter, index, seen, budget_s=linger.LINGER_S):
        with open(tmp_path / f"{os.getpid()}.txt", "a") as f:
            f.write(f"{index} {seen}\n")
        return False

    monkeypatch.setattr(worker_module, "linger", record)
    num_workers = len(os.sched_getaffinity(0)) + extra
    env = WorkerEnvs(plain, num_workers, num_workers=num_workers)
    try:
        for _ in range(3):
            env.poll()
            step_all(env)
    finally:
        env.close()
    files = sorted(tmp_path.glob("*.txt"))
    if extra:
        assert files == []
        return
    calls = {}
    for f in files:
        lines = [tuple(map(int, line.split())) for line in f.read_text().splitlines()]
        calls[lines[0][0]] = lines
    # each worker (by its first sub-env) before each read of its pipe: 3 polls, then close
    assert calls == {lo: [(lo, 0), (lo, 1), (lo, 2), (lo, 3)] for lo in range(num_workers)}


@needs_yield
@pytest.mark.skipif(
    not Path("/proc/self/status").exists()
    or len(os.sched_getaffinity(0)) < 2
    or multiprocessing.get_start_method() != "fork",
    reason="needs Linux's /proc, a CPU for each of 2 workers, and workers forked",
)
def test_lingering_workers_read_the_next_poll_without_sleeping(monkeypatch):
    """Workers that stay pinned and linger long enough for any runner (50 ms here, so a
    loaded test machine does not matter) read each poll without sleeping: the counter the
    runner bumps wakes them, not the pipe (without lingering: one sleep per poll,
    ``test_workers_frames``)."""
    from env_cases import sleeps_per_worker

    from rlconnect.envs.workers import affinity

    monkeypatch.setattr(worker_module, "linger", functools.partial(linger.linger, budget_s=0.05))
    monkeypatch.setattr(affinity.CorePin, "polled", lambda self, wall_s, cpu_s: None)
    polls = 200
    sleeps = sleeps_per_worker(polls)
    assert all(s < polls * 0.1 for s in sleeps), (sleeps, polls)
