"""Waiting costs no CPU: a runner waiting on slow env workers, and env workers waiting on a
slow policy, block in the operating system (each uses well under a tenth of a core)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym
import pytest
from env_cases import make_cartpole, spaces

import rlconnect as rc

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/schedstat").exists(), reason="reads CPU times from Linux's /proc"
)

STEP_S = 0.02  # a slow sub-env's step, or a slow policy's call
MEASURE_S = 1.0  # wall-clock time measured, about
MAX_CORES = 0.1


class SlowEnv(gym.Wrapper):
    """CartPole whose step sleeps ``STEP_S`` (a simulator that takes its time)."""

    def step(self, action):
        time.sleep(STEP_S)
        return super().step(action)


def make_slow(ctx: rc.EnvContext) -> gym.Env:
    return SlowEnv(gym.make("CartPole-v1"))


class SlowPolicy(rc.RandomPolicy):
    """Random actions after ``STEP_S`` of sleep (a policy on a busy accelerator)."""

    def compute_actions(self, input_batch, explore=True):
        time.sleep(STEP_S)
        return super().compute_actions(input_batch, explore)


def cpu_s(pid: int) -> float:
    """Seconds the process ``pid`` (its main thread) ran on a CPU (``/proc``, in ns)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def own_cpu_s() -> float:
    """Seconds this process ran on a CPU, every thread."""
    t = os.times()
    return t.user + t.system


def sample_for(runner: rc.EnvRunner, seconds: float) -> float:
    """Sample batches until ``seconds`` passed; returns the wall-clock time taken."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        runner.sample()
    return time.monotonic() - t0


def test_a_runner_waiting_on_slow_env_workers_uses_under_a_tenth_of_a_core():
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, num_env_workers=2, seed=0)
    runner = rc.EnvRunner(make_slow, rc.RandomPolicy(*spaces()), config=config)
    try:
        runner.sample()  # workers started, first resets done
        before = own_cpu_s()
        wall = sample_for(runner, MEASURE_S)
        used = own_cpu_s() - before
    finally:
        runner.stop()
    assert used < MAX_CORES * wall, f"the runner used {used:.3f} CPU-s in {wall:.2f} s"


def test_env_workers_waiting_on_a_slow_policy_use_under_a_tenth_of_a_core_each():
    config = rc.RunnerConfig(num_envs=8, rollout_fragment_length=10, num_env_workers=2, seed=0)
    runner = rc.EnvRunner(make_cartpole, SlowPolicy(*spaces()), config=config)
    try:
        runner.sample()
        pids = [w.proc.pid for w in runner.env.workers]
        before = [cpu_s(p) for p in pids]
        wall = sample_for(runner, MEASURE_S)
        used = [cpu_s(p) - b for p, b in zip(pids, before)]
    finally:
        runner.stop()
    assert all(u < MAX_CORES * wall for u in used), f"workers used {used} CPU-s in {wall:.2f} s"
