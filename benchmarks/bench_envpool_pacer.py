"""When the runner blocks in EnvPool's ``recv``: the learned delay against fixed ones.

``EnvRunner.sample()`` on ``"envpool:CartPole-v1"`` (N=64, synchronous, RandomPolicy) with
the runner's ``RecvPacer`` as it is (it learns how long to wait after a send before it
blocks in ``recv``), with no wait (blocking at once, as before the pacer), and with fixed
waits, beside the in-process gymnasium runner. The contenders take turns for
``--rounds`` rounds of ``--seconds``; the table gives the median env steps/s [min-max],
the median over rounds of the ratio to the in-process runner of the same round, and the
share of receives that slept (longer than the fastest receive by more than the pacer's
``SLEPT_S``). The learned contender also prints the delay it settled on.

It replaces the pacer of a runner's private ``EnvPoolEnv`` (a profiling tool, not an API).

    python benchmarks/bench_envpool_pacer.py [--quick] [--rounds 7] [--seconds 1]
                                             [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import rlconnect as rc
from rlconnect.envs import make_base_env, recv_pacer
from rlconnect.envs.recv_pacer import RecvPacer

N = 64
FIXED_US = (40, 60, 80)


class Watched(RecvPacer):
    """The pacer with its receive times kept; ``fixed_s`` (not None) never learns."""

    def __init__(self, fixed_s: float | None) -> None:
        super().__init__()
        self.fixed_s = fixed_s
        self.wait_s = fixed_s or 0.0
        self.took: list[float] = []

    def learn(self, took_s: float) -> None:
        self.took.append(took_s)
        if self.fixed_s is None:
            super().learn(took_s)


def _runner(env: str, threads: int) -> tuple[rc.EnvRunner, Any]:
    config = rc.RunnerConfig(num_envs=N, rollout_fragment_length=50, seed=0, check_env=False)
    cfg = {"num_threads": threads} if env.startswith("envpool:") else {}
    base = make_base_env(env, num_envs=N, seed=0, env_config=cfg)
    space = base.observation_space(rc.DEFAULT_AGENT_ID), base.action_space(rc.DEFAULT_AGENT_ID)
    return rc.EnvRunner(base, rc.RandomPolicy(*space), config=config), base


def timed_runner(runner: rc.EnvRunner) -> Callable[[float], float]:
    """``run(seconds)``: the runner's env steps/s sampling for that long (as a training
    loop does: each batch's episode records taken), after one warm-up batch."""
    runner.sample()  # warm-up: first resets

    def run(seconds: float) -> float:
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            steps += runner.sample().count
            runner.get_metrics()
        return steps / (time.perf_counter() - t0)

    return run


def envpool_missing() -> bool:
    """Whether the optional ``envpool`` package is missing (then the benchmark says it is
    skipped: there is nothing to measure)."""
    try:
        import envpool  # noqa: F401
    except ImportError as exc:
        print(f"skipped: {exc}")
        return True
    return False


def take_turns(
    runs: dict[str, Callable[[float], float]], rounds: int, seconds: float
) -> dict[str, list[float]]:
    """Each contender's env steps/s in every round; the contenders take turns, in reverse
    order every other round (host load that lasts a round hits all of them)."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            rates[name].append(runs[name](seconds))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2, help="EnvPool's num_threads")
    args = ap.parse_args()
    rounds, seconds = (1, 0.3) if args.quick else (args.rounds, args.seconds)
    if envpool_missing():
        return
    waits: dict[str, float | None] = {"learned": None, "no wait": 0.0}
    waits.update({f"fixed {us} us": us * 1e-6 for us in FIXED_US})
    runners: dict[str, rc.EnvRunner] = {}
    pacers: dict[str, Watched] = {}
    runners["in-process gymnasium"], _ = _runner("CartPole-v1", args.threads)
    for name, fixed in waits.items():
        runners[name], base = _runner("envpool:CartPole-v1", args.threads)
        base._pacer = pacers[name] = Watched(fixed)
    try:
        rates = take_turns({n: timed_runner(r) for n, r in runners.items()}, rounds, seconds)
    finally:
        for runner in runners.values():
            runner.stop()
    print(
        f"envpool:CartPole-v1, N={N}, synchronous, {args.threads} EnvPool threads: env steps/s,"
        f" median [min-max] of {rounds} rounds"
    )
    base_rates = rates["in-process gymnasium"]
    for name, values in rates.items():
        ratio = statistics.median(a / b for a, b in zip(values, base_rates))
        line = f"{name:<22} {statistics.median(values):>10,.0f} [{min(values):,.0f}-"
        line += f"{max(values):,.0f}] {ratio:6.2f}x"
        if name in pacers:
            took = pacers[name].took
            fastest = min(took)
            slept = sum(t - fastest > recv_pacer.SLEPT_S for t in took) / len(took)
            line += f"  slept {slept:4.0%}"
        print(line)
    print(f"the learned wait settled at {pacers['learned'].wait_s * 1e6:.0f} us after the send")


if __name__ == "__main__":
    main()
