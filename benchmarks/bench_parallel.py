"""How fast on every core? rlconnect's env workers and EnvPool against gymnasium and by hand.

Workloads (random actions; rlconnect samples with a RandomPolicy and, as a training loop
does, takes each batch's episode records with ``get_metrics()``: records nobody takes pile
up and make Python's full garbage collections ever dearer):

- ``cartpole``: CartPole-v1, N=64 sub-envs;
- ``pong``: Pong, 84x84 gray, frame skip 4, a stack of 4, N=8 sub-envs (gymnasium's
  ``AtariPreprocessing`` + ``FrameStackObservation``; rlconnect's ``preset="atari"``;
  EnvPool's own ``Pong-v5`` defaults).

Contenders: gymnasium ``SyncVectorEnv`` and ``AsyncVectorEnv(shared_memory=True)`` (their
steps include the reset step after each episode), EnvPool stepped by hand (2 threads), 2
forked processes written by hand (the floor of env workers: shared memory, one pipe byte
each way, no policy or rows) and the same loop in 1 process, and ``EnvRunner.sample()``
with the sub-envs in-process, ``remote_envs=True``, ``num_env_workers=1`` and ``2`` (sync,
and async with ``env_poll_size=N/2``), and on EnvPool (``"envpool:<task>"``) sync and
async (``env_poll_size=N/2``) with the threads rlconnect picks (one for CartPole, EnvPool's
default of a thread per CPU for Pong). Each is built and
warmed up once, then they take turns for ``--rounds`` rounds of ``--seconds``; the table
gives the median env steps/s [min-max] and the median over rounds of the ratio to the
in-process runner's run of the same round (host load that lasts a round or more hits
both); each target line also lists that ratio round by round. Contenders whose package is
missing (ale-py, envpool) are skipped. ``--quick``: one short round each, on 4 sub-envs
(Pong: 2); ``--only in-process,envpool``: the contenders whose name has one of the words
(and the in-process runner, which the ratios are to).

``--hand-busy-us K``: the hand-written loops spin K microseconds per step, standing in for
what a runner does besides stepping (policy, records). With K chosen so that "1 process by
hand" runs about as fast as "rlconnect in-process", the ratio of the two hand-written
contenders (printed last) is what 2 workers could gain by hand for a runner that costs as
much per step as rlconnect's. On Linux, the CPU time per poll of the parent process and of
each worker of the two 2-process contenders (``/proc/<pid>/schedstat``) shows where the
two differ.

    python benchmarks/bench_parallel.py [--quick] [--workload cartpole|pong|all] [--only ...]
                                        [--hand-busy-us K]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from _common import (
    build_runner,
    machine,
    median_range,
    print_table,
    ratios,
    sample_for,
    take_turns,
)
from hand_written import Runner, hand_loop, hand_workers, timed

import rlconnect as rc

WORKLOADS: dict[str, dict[str, Any]] = {
    "cartpole": {"n": 64, "gym": "CartPole-v1", "envpool": "CartPole-v1", "frag": 50},
    "pong": {"n": 8, "gym": "ALE/Pong-v5", "envpool": "Pong-v5", "frag": 50},
}
#: ``--quick``: the sub-envs of each workload (every contender still runs, 2 workers too)
QUICK_N = {"cartpole": 4, "pong": 2}


def _gym_maker(workload: str) -> Callable[[], gym.Env]:
    if workload == "cartpole":
        return lambda: gym.make("CartPole-v1")

    def make() -> gym.Env:
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make("ALE/Pong-v5", frameskip=1)
        env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=84)
        return gym.wrappers.FrameStackObservation(env, 4)

    return make


class _VectorEnv(Protocol):
    """What ``_vector_loop`` steps: a gymnasium ``VectorEnv`` or EnvPool's gymnasium pool
    (which has the same methods without subclassing it)."""

    @property
    def num_envs(self) -> int: ...

    @property
    def single_action_space(self) -> Any: ...

    def reset(self, *, seed: int | None = None) -> Any: ...

    def step(self, actions: Any, /) -> Any: ...


def _vector_loop(venv: _VectorEnv) -> Runner:
    venv.reset(seed=0)
    space = venv.single_action_space
    space.seed(0)
    actions = [np.array([space.sample() for _ in range(venv.num_envs)]) for _ in range(256)]
    return timed(lambda k: venv.step(actions[k % 256]), venv.num_envs)


def _runner_loop(runner: rc.EnvRunner) -> Runner:
    runner.sample()  # warm-up: worker start, first resets, checks

    return lambda seconds: sample_for(runner, seconds)


def _rlconnect(workload: str, env: Any, n: int, **cfg: Any) -> tuple[Runner, Callable[[], None]]:
    runner = build_runner(env, n, rc.RandomPolicy, WORKLOADS[workload]["frag"], **cfg)
    return _runner_loop(runner), runner.stop


def contenders(
    workload: str, busy_s: float = 0.0, n: int | None = None
) -> dict[str, Callable[[], tuple[Runner, Callable[[], None]]]]:
    """name -> builder of (run, close); built lazily so a missing package skips one.
    ``busy_s``: what the hand-written loops spin per step; ``n``: sub-envs (default: the
    workload's)."""
    w = WORKLOADS[workload]
    n, make = n or w["n"], _gym_maker(workload)
    spec = "CartPole-v1" if workload == "cartpole" else "ALE/Pong-v5"
    preset = {} if workload == "cartpole" else {"preset": "atari"}
    pool = f"envpool:{w['envpool']}"

    def vector(kind: Any, **kw: Any) -> tuple[Runner, Callable[[], None]]:
        venv = kind([make] * n, **kw)
        return _vector_loop(venv), venv.close

    def envpool_raw() -> tuple[Runner, Callable[[], None]]:
        import envpool

        venv = envpool.make_gymnasium(w["envpool"], num_envs=n, num_threads=2, seed=0)
        return _vector_loop(venv), venv.close

    return {
        "gym SyncVectorEnv": lambda: vector(gym.vector.SyncVectorEnv),
        "gym AsyncVectorEnv (shm)": lambda: vector(gym.vector.AsyncVectorEnv, shared_memory=True),
        "EnvPool by hand (2 threads)": envpool_raw,
        "1 process by hand": lambda: hand_loop(make, n, busy_s),
        "2 processes by hand": lambda: hand_workers(make, n, busy_s),
        "rlconnect in-process": lambda: _rlconnect(workload, spec, n, **preset),
        "rlconnect remote_envs": lambda: _rlconnect(workload, spec, n, remote_envs=True, **preset),
        "rlconnect 1 env worker": lambda: _rlconnect(
            workload, spec, n, num_env_workers=1, **preset
        ),
        "rlconnect 2 env workers": lambda: _rlconnect(
            workload, spec, n, num_env_workers=2, **preset
        ),
        "rlconnect 2 workers async": lambda: _rlconnect(
            workload, spec, n, num_env_workers=2, env_poll_size=n // 2, **preset
        ),
        "rlconnect envpool sync": lambda: _rlconnect(workload, pool, n),
        "rlconnect envpool async": lambda: _rlconnect(workload, pool, n, env_poll_size=n // 2),
    }


#: the contenders whose CPU time per poll (parent and each worker) is printed, on Linux
ACCOUNTED = ("2 processes by hand", "rlconnect 2 env workers")


def _cpu_ns(pids: list[int]) -> list[int]:
    """Nanoseconds each process's main thread has run on a CPU (Linux's schedstat)."""
    return [int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) for pid in pids]


def measure(
    workload: str, rounds: int, seconds: float, only: list[str], busy_s: float, n: int
) -> None:
    built: dict[str, tuple[Runner, Callable[[], None]]] = {}
    kids: dict[str, list[int]] = {}  # the worker processes each contender started
    for name, build in contenders(workload, busy_s, n).items():
        if only and name != "rlconnect in-process" and not any(w in name for w in only):
            continue
        before = {p.pid for p in multiprocessing.active_children()}
        try:
            built[name] = build()
        except ImportError as exc:
            print(f"  skipped {name}: {exc}")
        kids[name] = [
            p.pid
            for p in multiprocessing.active_children()
            if p.pid is not None and p.pid not in before  # started: never None
        ]
    linux = Path("/proc/self/schedstat").exists()

    def turn(name: str) -> Callable[[], tuple[float, list[float]]]:
        """A round of ``name``: its env steps/s, and the CPU us per poll of its processes."""

        def run() -> tuple[float, list[float]]:
            pids = [os.getpid(), *kids[name]] if linux and name in ACCOUNTED else []
            start = _cpu_ns(pids)
            steps, secs = built[name][0](seconds)
            polls = steps / n
            return steps / secs, [(b - a) / polls / 1e3 for a, b in zip(start, _cpu_ns(pids))]

        return run

    try:
        results = take_turns({name: turn(name) for name in built}, rounds)
    finally:
        for _, close in built.values():
            close()
    rates = {name: [rate for rate, _ in runs] for name, runs in results.items()}
    cpu = {name: [us for _, us in runs] for name, runs in results.items()}

    def ratio(name: str, to: str = "rlconnect in-process") -> float:
        """The median over rounds of ``name``'s rate over that of ``to`` in the same round."""
        return statistics.median(ratios(rates[name], rates[to]))

    print(f"\n{workload}: N={n} sub-envs, env steps/s, median [min-max] of {rounds} rounds")
    table = [(name, median_range(v), f"{ratio(name):.2f}x") for name, v in rates.items()]
    print_table(("contender", "env steps/s", "vs in-process"), table)
    targets = {
        "cartpole": [("rlconnect 2 env workers", 1.2), ("rlconnect envpool sync", 3.0)],
        "pong": [("rlconnect 2 env workers", 1.5)],
    }[workload]
    for name, want in targets:
        if name in rates:
            got = ratio(name)
            verdict = "met" if got >= want else "NOT met"
            each = " ".join(f"{x:.2f}" for x in ratios(rates[name], rates["rlconnect in-process"]))
            print(f"target {name} >= {want}x in-process: {got:.3f}x ({verdict}; rounds {each})")
    print("CPU time per poll (a step of every sub-env), us, medians: parent | each worker")
    for name in ACCOUNTED:
        if cpu.get(name) and len(cpu[name][0]) == 3:
            parent, *workers = (statistics.median(r[k] for r in cpu[name]) for k in range(3))
            print(f"  {name:<28} {parent:6.0f} | " + " ".join(f"{w:6.0f}" for w in workers))
    if "1 process by hand" in rates and "2 processes by hand" in rates:
        pair, us = ratio("2 processes by hand", to="1 process by hand"), busy_s * 1e6
        print(f"by hand, spinning {us:.0f} us per step: 2 processes = {pair:.2f}x 1 process")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round each, 2-4 sub-envs")
    ap.add_argument("--workload", choices=("cartpole", "pong", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--only", default="", help="comma-separated words of contender names")
    ap.add_argument(
        "--hand-busy-us",
        type=float,
        default=0.0,
        help="microseconds the hand-written loops spin per step, for a runner's own work: "
        "pick it so that '1 process by hand' runs about as fast as the in-process runner",
    )
    args = ap.parse_args()
    if args.hand_busy_us < 0:
        ap.error("--hand-busy-us must be >= 0")
    only = [w for w in args.only.split(",") if w]
    rounds, seconds = (1, 0.1) if args.quick else (args.rounds, args.seconds)
    print(f"{machine()}; RandomPolicy / random actions")
    for workload in ("cartpole", "pong") if args.workload == "all" else (args.workload,):
        n = QUICK_N[workload] if args.quick else WORKLOADS[workload]["n"]
        measure(workload, rounds, seconds, only, args.hand_busy_us * 1e-6, n)


if __name__ == "__main__":
    main()
