"""When does a process per sub-env pay? ``remote_envs=True`` against in-process envs.

Two workloads at N=4 sub-envs with a RandomPolicy (so the envs dominate): CartPole-v1,
whose step costs microseconds, and a slow env that sleeps 1 ms per step (a simulator).
Each runner is warmed up, then the two take turns for ``--rounds`` rounds; the table gives
medians [ranges] of env steps/s and of the per-round ratio. ``--quick`` runs in about 5 s.

    python benchmarks/bench_remote_envs.py [--quick] [--num-envs 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np
from _common import build_runner, machine, median_range, print_table, ratios, sample_for, take_turns

import rlconnect as rc


class SlowEnv(gym.Env):
    """CartPole-sized obs; each step sleeps ``delay`` seconds, like a slow simulator."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay: float = 0.001) -> None:
        self.delay = delay
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(self.delay)
        self.t += 1
        return np.full(4, 0.5, np.float32), 1.0, False, self.t >= 100, {}


def make_slow(ctx: rc.EnvContext) -> gym.Env:
    return SlowEnv()


WORKLOADS = {"CartPole-v1": ("CartPole-v1", 200), "slow env (1 ms/step)": (make_slow, 25)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 5 s in all")
    ap.add_argument("--num-envs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds, seconds = (1, 0.5) if args.quick else (args.rounds, 1.5)
    print(machine())
    print(f"N={args.num_envs} sub-envs, RandomPolicy; env steps/s, median [range] of {rounds}")
    rows = []
    for name, (env, frag) in WORKLOADS.items():
        runners = {
            mode: build_runner(env, args.num_envs, rc.RandomPolicy, frag, remote_envs=remote)
            for mode, remote in (("in-process", False), ("remote_envs", True))
        }
        try:
            for r in runners.values():
                r.sample()  # warm-up (worker start, first resets)
            turns = {mode: (lambda r=r: sample_for(r, seconds)) for mode, r in runners.items()}
            runs = take_turns(turns, rounds)
        finally:
            for r in runners.values():
                r.stop()
        rates = {mode: [steps / secs for steps, secs in v] for mode, v in runs.items()}
        local, remote = rates["in-process"], rates["remote_envs"]
        ratio = median_range(ratios(remote, local), ".2f")
        rows.append((name, median_range(local), median_range(remote), ratio))
    print_table(("workload", "in-process", "remote_envs", "remote / in-process"), rows)


if __name__ == "__main__":
    main()
