"""Where a synchronous poll of an EnvPool pool spends its time, stamped in the runner.

Runs an ``EnvRunner`` on ``"envpool:CartPole-v1"`` (N=64, RandomPolicy, synchronous, the
runner's default EnvPool threads) and stamps EnvPool's C++ ``send`` and ``recv`` calls,
then splits each poll into:

- ``runner until send``: from the results being received to the next send: making the
  rows, episodes, the agent pipeline, the policy, the action pipeline and checks;
- ``send``: EnvPool's ``send`` (copying the actions, waking its threads);
- ``send until recv``: the runner recording the poll, ending episodes and waiting
  (``RecvPacer``) while EnvPool steps;
- ``of which waiting``: the part of it ``RecvPacer`` spent yielding its CPU until the step
  was due (0 in a poll where it did not wait): time the runner has nothing to do;
- ``recv``: EnvPool's ``recv`` (waiting for what is not done yet, and the results);
- ``whole poll``: from one receive to the next (a batch's building every
  ``rollout_fragment_length`` polls included).

It wraps private methods of ``rlconnect.envs.envpool_io`` and ``recv_pacer``'s
``yield_until`` (a profiling tool, not an API). Medians, means and the 90th percentile over
the polls; the last line gives the share of the run spent waiting.

    python benchmarks/bench_envpool_poll.py [--quick] [--seconds 3] [--threads T]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_envpool_pacer import envpool_missing
from bench_worker_poll import phase_row

import rlconnect as rc
from rlconnect.envs import envpool_io, make_base_env, recv_pacer
from rlconnect.envs.envpool_env import EnvPoolEnv

N = 64


def _stamp(log: list[tuple[str, float, float]]) -> None:
    """``send`` and ``recv`` of the direct pool I/O append ``(kind, start, end)``."""
    for kind, name in (("s", "send"), ("r", "recv")):
        method = getattr(envpool_io._DirectIO, name)

        def stamped(self: Any, *args: Any, _m: Any = method, _k: str = kind) -> Any:
            start = time.perf_counter()
            out = _m(self, *args)
            log.append((_k, start, time.perf_counter()))
            return out

        setattr(envpool_io._DirectIO, name, stamped)
    waits = recv_pacer.yield_until

    def waiting(end: float, ready: Callable[[], bool] | None = None) -> bool:
        start = time.perf_counter()
        out = waits(end, ready)
        log.append(("w", start, time.perf_counter()))
        return out

    recv_pacer.yield_until = waiting


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=None, help="EnvPool's num_threads")
    args = ap.parse_args()
    if envpool_missing():
        return
    seconds = 0.5 if args.quick else args.seconds
    env_config = {} if args.threads is None else {"num_threads": args.threads}
    log: list[tuple[str, float, float]] = []
    _stamp(log)
    config = rc.RunnerConfig(
        num_envs=N, rollout_fragment_length=50, seed=0, check_env=False, env_config=env_config
    )
    base = make_base_env("envpool:CartPole-v1", num_envs=N, seed=0, env_config=env_config)
    assert isinstance(base, EnvPoolEnv), f"an envpool: env builds an EnvPoolEnv, not {base!r}"
    space = base.observation_space(rc.DEFAULT_AGENT_ID), base.action_space(rc.DEFAULT_AGENT_ID)
    runner = rc.EnvRunner(base, rc.RandomPolicy(*space), config=config)
    threads = int(base.pool.config["num_threads"])
    try:
        runner.sample()  # warm-up: first resets
        log.clear()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            steps += runner.sample().count
            runner.get_metrics()
        elapsed = time.perf_counter() - t0
        rate = steps / elapsed
    finally:
        runner.stop()
    waited = sum(end - start for kind, start, end in log if kind == "w")
    cols: dict[str, list[float]] = {k: [] for k in ("runner until send", "send")}
    cols.update({"send until recv": [], "of which waiting": [], "recv": [], "whole poll": []})
    last: tuple[str, float, float] | None = None  # the last send or recv
    wait = 0.0  # yielded since the last send
    for kind, start, end in log:  # in time order
        if kind == "w":
            wait += end - start
            continue
        if last is not None and last[0] == "r" and kind == "s":
            cols["runner until send"].append(start - last[2])
        elif last is not None and last[0] == "s" and kind == "r":
            cols["send"].append(last[2] - last[1])
            cols["send until recv"].append(start - last[2])
            cols["of which waiting"].append(wait)
            cols["recv"].append(end - start)
        last, wait = (kind, start, end), 0.0
    ends = [end for kind, _, end in log if kind == "r"]
    cols["whole poll"] = list(np.diff(ends))
    shown = f"{threads}" if threads else f"EnvPool's default ({os.cpu_count()} CPUs)"
    print(
        f"envpool:CartPole-v1, N={N}, synchronous, EnvPool threads: {shown}; "
        f"{len(ends)} polls, {rate:,.0f} env steps/s; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'us per poll':<20} {'median':>9} {'mean':>9} {'p90':>9}")
    for name, values in cols.items():
        print(phase_row(name, values, 20))
    print(f"waiting for EnvPool's step: {waited / elapsed:.0%} of the run")


if __name__ == "__main__":
    main()
