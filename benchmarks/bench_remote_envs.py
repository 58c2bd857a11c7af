"""Env steps/s of remote_envs=True (one env worker per sub-env) vs in-process envs.

Two workloads at N=4 sub-envs with a RandomPolicy (so the envs dominate): CartPole-v1,
whose step costs microseconds, and a slow env that sleeps 1 ms per step (a simulator).
Each runner samples for a fixed time after a warm-up; the two modes alternate in rounds.
No assertions: it prints a table. ``--quick`` runs in about 5 s.

    python benchmarks/bench_remote_envs.py [--quick] [--num-envs 4]
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np

import rlconnect as rc


class SlowEnv(gym.Env):
    """CartPole-sized obs; each step sleeps ``delay`` seconds, like a slow simulator."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay: float = 0.001) -> None:
        self.delay = delay
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        time.sleep(self.delay)
        self.t += 1
        return np.full(4, 0.5, np.float32), 1.0, False, self.t >= 100, {}


def make_slow(ctx: rc.EnvContext) -> gym.Env:
    return SlowEnv()


WORKLOADS = {"CartPole-v1": ("CartPole-v1", 200), "slow env (1 ms/step)": (make_slow, 25)}


def build(env, frag: int, n: int, remote: bool) -> rc.EnvRunner:
    probe = gym.make(env) if isinstance(env, str) else env(rc.EnvContext())
    policy = rc.RandomPolicy(probe.observation_space, probe.action_space)
    config = rc.RunnerConfig(
        num_envs=n, rollout_fragment_length=frag, seed=0, remote_envs=remote, check_env=False
    )
    return rc.EnvRunner(env, policy, config=config)


def timed(runner: rc.EnvRunner, seconds: float) -> tuple[int, float]:
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += runner.sample().count
    return steps, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 5 s in all")
    ap.add_argument("--num-envs", type=int, default=4)
    args = ap.parse_args()
    rounds, per_round = (1, 0.5) if args.quick else (3, 1.5)
    cpus = os.cpu_count()
    print(f"N={args.num_envs} sub-envs, RandomPolicy, {cpus} CPUs; env steps/s (higher is better)")
    print(f"{'workload':<22} {'in-process':>12} {'remote_envs':>12} {'remote/local':>13}")
    for name, (env, frag) in WORKLOADS.items():
        t_start = time.perf_counter()
        runners = {remote: build(env, frag, args.num_envs, remote) for remote in (False, True)}
        totals = {False: [0, 0.0], True: [0, 0.0]}
        try:
            for r in runners.values():
                r.sample()  # warm-up (worker start, first resets)
            for _ in range(rounds):
                for is_remote, r in runners.items():
                    steps, secs = timed(r, per_round)
                    totals[is_remote][0] += steps
                    totals[is_remote][1] += secs
        finally:
            for r in runners.values():
                r.stop()
        local, remote = (totals[k][0] / totals[k][1] for k in (False, True))
        print(f"{name:<22} {local:>12,.0f} {remote:>12,.0f} {remote / local:>12.2f}x", end="")
        print(f"   ({time.perf_counter() - t_start:.1f} s)")


if __name__ == "__main__":
    main()
