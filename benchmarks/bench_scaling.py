"""How do env steps/s grow with K = 0, 1, 2 Ray runners, and what does Ray add per batch?

Two workloads, N sub-envs per runner: CartPole-v1 with an MLPPolicy (64, 64), where the
runner's own per-step work dominates, and a slow env that sleeps 2 ms per step (a
simulator) with a RandomPolicy. K=0 samples on the driver; with K>0 only the remote
runners sample and the driver gathers and concatenates. For each K the group samples for a
fixed time after a warm-up; steps/s counts the rows the driver received.

The Ray round trip per batch is timed without the env: each runner samples one batch and
keeps it; the driver then fetches that batch again and again (an actor call that returns
it: scheduling, serialisation, object-store transfer, deserialisation), from one runner
and from both at once, and concatenates two of them as ``sample()`` does. Also timed: an
empty actor call, a weight broadcast (``sync_weights``) and a filter sync.
No assertions: it prints tables. ``--quick`` (0.3 s per timing, the round trip at one batch
size) is a smoke run: its time goes to starting Ray and the runners' actors.

    python benchmarks/bench_scaling.py [--quick] [--num-envs 4] [--num-cpus 2]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import ray

import rlconnect as rc
from rlconnect.distributed import RunnerGroup


class SlowEnv(gym.Env):
    """CartPole-sized obs; each step sleeps ``delay`` seconds, like a slow simulator."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay: float = 0.002) -> None:
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


def cartpole_policy() -> rc.MLPPolicy:
    env = gym.make("CartPole-v1")
    return rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(64, 64))


def slow_policy() -> rc.RandomPolicy:
    return rc.RandomPolicy(SlowEnv.observation_space, SlowEnv.action_space)


WORKLOADS = {
    "CartPole-v1 + MLP(64,64)": ("CartPole-v1", cartpole_policy, 200),
    "slow env (2 ms/step) + random": (make_slow, slow_policy, 25),
}


def steps_per_second(group: RunnerGroup, seconds: float) -> tuple[float, float]:
    """(rows/s, ms per sample() call) over about ``seconds`` after one warm-up batch."""
    group.sample()
    rows, calls, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows += group.sample().count
        calls += 1
    elapsed = time.perf_counter() - start
    return rows / elapsed, 1000 * elapsed / calls


def keep_batch(runner: Any) -> int:
    """Sample once inside the actor and keep the batch there (for the round-trip timing)."""
    runner.bench_batch = runner.sample()
    return len(runner.bench_batch)


def kept_batch(runner: Any) -> Any:
    return runner.bench_batch


def scaling_table(args: argparse.Namespace) -> None:
    print(f"\n## Steps/s by number of remote runners (N={args.num_envs} sub-envs per runner)\n")
    print("| workload | K | rows/batch | ms/sample() | steps/s | vs K=0 |")
    print("|---|---|---|---|---|---|")
    for name, (env, make_policy, frag) in WORKLOADS.items():
        config = rc.RunnerConfig(num_envs=args.num_envs, rollout_fragment_length=frag, seed=0)
        base = None
        for k in (0, 1, 2):
            with RunnerGroup(env, make_policy(), config=config, num_runners=k) as group:
                rate, ms = steps_per_second(group, args.seconds)
                rows = frag * args.num_envs * max(k, 1)
            base = base or rate
            print(f"| {name} | {k} | {rows} | {ms:.1f} | {rate:,.0f} | {rate / base:.2f}x |")


def overhead_table(args: argparse.Namespace) -> None:
    print("\n## Ray overhead per batch (K=1 and K=2, CartPole-v1 + MLP(64,64))\n")
    print("| rows/batch | batch MB | round trip ms (K=1) | gather ms (K=2) | concat ms (K=2) |")
    print("|---|---|---|---|---|")
    for frag in (50,) if args.quick else (50, 200, 800, 3200):
        config = rc.RunnerConfig(num_envs=args.num_envs, rollout_fragment_length=frag, seed=0)
        with RunnerGroup("CartPole-v1", cartpole_policy(), config=config, num_runners=2) as g:
            g.foreach_runner(keep_batch)
            actor = g._actors[1]
            one = median_ms(lambda a=actor: ray.get(a.apply.remote(kept_batch)), n=15)
            both = median_ms(lambda g=g: g.foreach_runner(kept_batch), n=15)
            batches = g.foreach_runner(kept_batch)
            concat = median_ms(lambda b=batches: rc.concat_samples(b), n=15)
            mb = sum(np.asarray(batches[0][c]).nbytes for c in batches[0]) / 1e6
            rows = len(batches[0])
            print(f"| {rows} | {mb:.2f} | {one:.2f} | {both:.2f} | {concat:.2f} |")
    config = rc.RunnerConfig(
        num_envs=args.num_envs, rollout_fragment_length=50, observation_filter="MeanStdFilter"
    )
    policy = rc.MLPPolicy(
        gym.spaces.Box(-10, 10, (4,), np.float32), gym.spaces.Discrete(2), hiddens=(256, 256)
    )
    with RunnerGroup("CartPole-v1", policy, config=config, num_runners=2) as g:
        nbytes = sum(v.nbytes for w in g.get_weights().values() for v in w.values())
        noop = median_ms(lambda: g.foreach_runner(id), n=15)
        bcast = median_ms(g.sync_weights, n=15)
        syncs = []
        for _ in range(7):
            g.sample()
            syncs.append(median_ms(g.sync_connector_states, n=1))
    print("\n| K=2 call | ms (median) |\n|---|---|")
    print(f"| empty foreach_runner round trip | {noop:.2f} |")
    print(f"| sync_weights, MLP(256,256) = {nbytes / 1e6:.2f} MB | {bcast:.2f} |")
    print(f"| sync_connector_states (MeanStdFilter, 4 features) | {np.median(syncs):.2f} |")


def median_ms(fn: Callable[..., object], n: int = 7) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timings (smoke run)")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs given to Ray")
    args = parser.parse_args()
    args.seconds = 0.3 if args.quick else 4.0
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# bench_scaling: {os.cpu_count()} CPUs, Ray {ray.__version__}, load {load:.1f}")
    try:
        scaling_table(args)
        overhead_table(args)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
