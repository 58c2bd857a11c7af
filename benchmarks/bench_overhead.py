"""What does rlconnect itself cost per env step? An env and a policy that cost nothing.

``FreeEnv`` is an ``rc.BaseEnv`` whose ``poll()`` hands out precomputed CartPole-shaped
rows (4 float32 features, reward 1, an episode ending with probability 1/22 per step, as
CartPole under a random policy does) without stepping anything, made the way every
adapter makes its rows (``EnvRowsBuilder.columns``). The runner samples it with the
default pipelines and ``ConstantPolicy`` (a slice of a ready array), so what is timed is
the step kernel, the episode bookkeeping, the collectors and the batch building:
rlconnect's own cost per env step. An env engine that steps N envs in T microseconds is
slowed by this much per row.

    python benchmarks/bench_overhead.py            # N = 1, 8, 64, 256 (~1 min)
    python benchmarks/bench_overhead.py --quick    # smoke run (~5 s)

CPU time of this thread is reported (other processes disturb it less than wall time);
medians over rounds, with their range.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np
from _common import ConstantPolicy, machine, median_range, print_table

import rlconnect as rc
from rlconnect.envs.base import BaseEnv
from rlconnect.envs.rows import EnvRows, EnvRowsBuilder

OBS = gym.spaces.Box(-10, 10, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
POOL = 64  # distinct precomputed polls, cycled


class FreeEnv(BaseEnv):
    """N single-agent sub-envs whose polls are precomputed (see the module doc)."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.num_envs = num_envs
        rng = np.random.default_rng(seed)
        self._obs = rng.uniform(-1, 1, (POOL, num_envs, 4)).astype(np.float32)
        self._done = rng.random((POOL, num_envs)) < 1 / 22
        self._ids = np.arange(num_envs, dtype=np.int64)
        self._ones = np.ones(num_envs)
        self._zeros = np.zeros(num_envs, dtype=bool)
        self._infos: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        self._k = 0
        self._fresh: set[int] = set(range(num_envs))  # reset at the next poll

    def observation_space(self, agent_id: object) -> gym.Space:
        return OBS

    def action_space(self, agent_id: object) -> gym.Space:
        return ACT

    def poll(self) -> EnvRows:
        k = self._k % POOL
        self._k += 1
        first = None  # what GymEnvs says too: no first row, all sub-envs in order
        if self._fresh:
            first = np.zeros(self.num_envs, dtype=bool)
            first[list(self._fresh)] = True
            self._fresh.clear()
        return EnvRowsBuilder.columns(
            self._ids,
            self._obs[k],
            self._ones,
            self._done[k],
            self._zeros,
            self._infos,
            first,
        )

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: object) -> None:
        pass

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        self._fresh.add(env_id)


def own_cost_us_per_row(n: int, steps: int) -> float:
    """CPU microseconds of ``sample()`` per env step, N sub-envs, about ``steps`` steps."""
    cfg = rc.RunnerConfig(num_envs=n, rollout_fragment_length=max(steps // n, 1), seed=0)
    runner = rc.EnvRunner(FreeEnv(n), ConstantPolicy(OBS, ACT), config=cfg)
    runner.sample()  # warm-up (and the check_env polls)
    t0 = time.thread_time()
    batch = runner.sample()
    return 1e6 * (time.thread_time() - t0) / batch.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args()
    steps, rounds = (4_096, 1) if args.quick else (65_536, 5)
    print(machine())
    print(f"rlconnect's own cost per env step: CPU us per row, median [range] of {rounds} rounds")
    rows = [
        (n, median_range([own_cost_us_per_row(n, steps) for _ in range(rounds)], ".2f"))
        for n in (1, 8, 64, 256)
    ]
    print_table(("N", "own cost per env step"), rows)


if __name__ == "__main__":
    main()
