"""How many actions/s does policy serving give over loopback HTTP, with what p50/p99 latency?

A PolicyServer (MLPPolicy, CartPole-sized obs, Discrete(2)) samples whole episodes in a
thread while 1 or 16 client *processes* drive 20-step episodes, with ``remote`` inference
(one HTTP request per action) and ``local`` inference (actions computed in the client,
experience shipped in batches). Latency is per ``get_action`` call as the simulator sees
it; actions/s counts all clients over the common wall time. No assertions: it prints a
table. ``--quick`` runs in about 15 s.

    python benchmarks/bench_serving.py [--quick] [--seconds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
from _common import machine

import rlconnect as rc
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyClient, PolicyServer

OBS = gym.spaces.Box(-10, 10, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def episode(client: PolicyClient, rng: np.random.Generator, lat: list[float]) -> None:
    eid = client.start_episode()
    for _ in range(20):
        obs = rng.uniform(-1, 1, 4).astype(np.float32)
        t0 = time.perf_counter()
        client.get_action(eid, obs)
        lat.append(time.perf_counter() - t0)
        client.log_returns(eid, 1.0)
    client.end_episode(eid, np.zeros(4, np.float32))


def client_main(url: str, mode: str, seconds: float, barrier: Any, out: mp.Queue) -> None:
    client = PolicyClient(url, mode, update_interval=1.0)
    rng = np.random.default_rng(0)
    for _ in range(3):  # warm-up (local mode: fetches the policy)
        episode(client, rng, [])
    barrier.wait()
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        episode(client, rng, lat)
    client.close()
    out.put(lat)


def measure(url: str, mode: str, clients: int, seconds: float) -> tuple[float, float, float]:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    barrier = ctx.Barrier(clients + 1)
    procs = [
        ctx.Process(target=client_main, args=(url, mode, seconds, barrier, out))
        for _ in range(clients)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    t0 = time.perf_counter()
    lat = np.concatenate([np.asarray(out.get(timeout=120)) for _ in procs])
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(30)
    return len(lat) / wall, 1e3 * np.percentile(lat, 50), 1e3 * np.percentile(lat, 99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 15 s in all")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured time per row")
    args = ap.parse_args()
    seconds = 1.0 if args.quick else args.seconds
    policy = rc.MLPPolicy(OBS, ACT, seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=200)
    server = PolicyServer(policy, "127.0.0.1", 0, config=config, max_concurrent=64)

    def sample() -> None:
        while True:
            try:
                server.runner.sample()
            except EnvError:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rows = (
        [("remote", 1), ("local", 1)]
        if args.quick
        else [("remote", 1), ("remote", 16), ("local", 1), ("local", 16)]
    )
    print(machine())
    print(f"{'mode':8} {'clients':>7} {'actions/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for mode, n in rows:
        rate, p50, p99 = measure(server.url, mode, n, seconds)
        print(f"{mode:8} {n:>7} {rate:>10.0f} {p50:>8.3f} {p99:>8.3f}", flush=True)
    server.stop()
    sampler.join(10)


if __name__ == "__main__":
    main()
