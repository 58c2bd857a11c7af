"""The hand-written contenders of ``bench_parallel.py``: the same loop in one process and
in forked processes, with no runner, policy, rows or checks.

They bound what env workers can gain on a machine: two processes stepping their halves of
the sub-envs, exchanging observations and actions through shared memory and one pipe byte
each way, one thread per numeric library and blocking on the pipe between steps as
rlconnect's workers do; the parent spins a given time per step after copying the observations, standing in for what
a runner does besides stepping (``--hand-busy-us``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.envs.workers import split_evenly
from rlconnect.envs.workers.tuning import tune_worker_process

__all__ = ["Runner", "hand_loop", "hand_workers", "timed"]

Runner = Callable[[float], tuple[int, float]]  # run for ~seconds -> (env steps, seconds)


def timed(step: Callable[[int], Any], n: int) -> Runner:
    """A contender's run: ``step(k)``, its k-th step of ``n`` sub-envs, until the time is up."""

    def run(seconds: float) -> tuple[int, float]:
        steps, k, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step(k)
            k += 1
            steps += n
        return steps, time.perf_counter() - t0

    return run


def _busy(seconds: float) -> None:
    """Spin for ``seconds``: a hand-written loop's stand-in for a runner's own work."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _step_group(envs: list[gym.Env], act: np.ndarray, obs: np.ndarray) -> None:
    """Step each env with its action, resetting those whose episode ended, observations
    into ``obs``."""
    for j, env in enumerate(envs):
        o, _, terminated, truncated, _ = env.step(act[j])
        if terminated or truncated:
            o, _ = env.reset()
        obs[j] = o


def _random_actions(space: Any, n: int) -> list[np.ndarray]:
    """256 steps of random actions of a ``Discrete`` space for ``n`` sub-envs."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, space.n, n) for _ in range(256)]


def hand_loop(make: Callable[[], gym.Env], n: int, busy_s: float) -> tuple[Runner, Any]:
    """The same loop as the hand-written processes, in one process: every sub-env stepped
    in turn, observations into one array, copied, then ``busy_s`` of spinning."""
    envs = [make() for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    space = envs[0].observation_space
    obs = np.zeros((n, *(space.shape or ())), space.dtype)
    actions = _random_actions(envs[0].action_space, n)

    def step(k: int) -> None:
        _step_group(envs, actions[k % 256], obs)
        obs.copy()
        _busy(busy_s)

    def close() -> None:
        for env in envs:
            env.close()

    run = timed(step, n)
    run(0.2)  # warm-up
    return run, close


def _hand_worker(make: Callable[[], gym.Env], lo: int, hi: int, shared: Any, pipes: Any) -> None:
    """One process of the hand-written pair: steps sub-envs ``lo .. hi - 1`` on each byte,
    observations straight into shared memory, one byte back. Set up like rlconnect's
    workers, so the comparison is of the hand-off alone."""
    obs_raw, act_raw, shape, dtype, n = shared
    (cmd_r, _), (_, done_w) = pipes
    tune_worker_process()  # one thread per numeric library, as rlconnect's workers run
    envs = [make() for _ in range(lo, hi)]
    for i, env in enumerate(envs):
        env.reset(seed=lo + i)
    obs = np.frombuffer(obs_raw, dtype).reshape(n, *shape)[lo:hi]
    act = np.frombuffer(act_raw, np.int64)[lo:hi]
    while True:
        if os.read(cmd_r, 1) != b"s":
            return
        _step_group(envs, act, obs)
        os.write(done_w, b"d")


def hand_workers(
    make: Callable[[], gym.Env], n: int, busy_s: float, workers: int = 2
) -> tuple[Runner, Any]:
    """The floor of env workers: ``workers`` forked processes stepping their groups of
    sub-envs, written by hand (shared memory for actions and observations, one pipe byte
    each way, random actions, no policy, no rows, no checks); the parent spins ``busy_s``
    per step after copying the observations, as ``hand_loop`` does."""
    if "fork" not in multiprocessing.get_all_start_methods():
        raise ImportError("the hand-written workers are forked")
    ctx = multiprocessing.get_context("fork")
    probe = make()
    space, actions_space = probe.observation_space, probe.action_space
    probe.close()
    shape, dtype = space.shape or (), np.dtype(space.dtype)  # as ``hand_loop``'s array
    obs_raw = ctx.RawArray("b", int(np.prod((n, *shape))) * dtype.itemsize)
    act_raw = ctx.RawArray("q", n)
    obs = np.frombuffer(obs_raw, dtype).reshape(n, *shape)
    act = np.frombuffer(act_raw, np.int64)
    actions = _random_actions(actions_space, n)
    links, procs = [], []
    shared = (obs_raw, act_raw, shape, dtype, n)
    for lo, size in split_evenly(n, workers):
        pipes = (os.pipe(), os.pipe())
        proc = ctx.Process(target=_hand_worker, args=(make, lo, lo + size, shared, pipes))
        proc.start()
        os.close(pipes[0][0])  # the worker's ends
        os.close(pipes[1][1])
        links.append((pipes[0][1], pipes[1][0]))
        procs.append(proc)

    def step(k: int) -> None:
        act[:] = actions[k % 256]
        for cmd_w, _ in links:
            os.write(cmd_w, b"s")
        for _, done_r in links:
            os.read(done_r, 1)
        obs.copy()
        _busy(busy_s)

    def close() -> None:
        for cmd_w, done_r in links:
            os.write(cmd_w, b"q")
            os.close(cmd_w)
            os.close(done_r)
        for proc in procs:
            proc.join(5)

    run = timed(step, n)
    run(0.2)  # warm-up
    return run, close
