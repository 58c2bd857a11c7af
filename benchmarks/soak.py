"""Do memory, open fds or threads grow over long sampling and serving runs?

``sampling``: ``rc.EnvRunner`` on CartPole-v1 (N=16 sub-envs, MeanStdFilter, MLPPolicy)
samples ``--steps`` env steps like a training loop: ``get_metrics()`` after every batch, a
checkpoint every ``--checkpoint-every`` batches, restored alternately into the same runner
and into a new one (``EnvRunner.from_checkpoint``, the old runner stopped and dropped); each
restore is checked against the saved weights and filter statistics.

``serving``: a ``PolicyServer`` (FrameStack(2) agent pipeline, so served episodes hold
connector state) with a sampling thread, and ``--clients`` client processes sending
``--requests`` requests in all. At seeded random points a client abandons its episode and
  abandon  - starts the next one on the same connection,
  close    - closes its connection and reconnects,
  cut      - sends half a request body on a new socket and resets it (RST),
  inflight - sends a whole ``get_action`` and resets the socket before the answer;
``--kills`` clients also exit abruptly once (os._exit mid-episode) and are respawned.
10 % of episodes are served without training (``training_enabled=False``). Abandoned
episodes must be closed by the server's episode timeout, and nothing may pile up.

RSS (``/proc/self/statm``, after ``gc.collect()``), open fds and OS threads are recorded at
intervals. After a warm-up (the first ``--warmup`` fraction) growth = max RSS after
warm-up - RSS at the end of warm-up; the slope is a least-squares fit after warm-up (MB per
1M steps, or per 100k requests); fds and threads are summarised as [start, max, end]. The
script exits 1 when growth >= ``--max-growth-mb`` or a check fails. ``--tracemalloc`` lists
where the memory allocated after warm-up still lives (slows it down).

    python benchmarks/soak.py                  # 2M steps + 100k requests (10-30 min)
    python benchmarks/soak.py --quick          # smoke run (~15 s)
    python benchmarks/soak.py --only sampling --steps 500000 --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tree

import rlconnect as rc

torch.set_num_threads(1)


# -- probes ---------------------------------------------------------------------------------
def rss_mb() -> float:
    """Resident set size of this process in MB (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


def open_fds() -> int:
    """Open file descriptors of this process (-1 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def os_threads() -> int:
    """OS threads of this process (torch's included); Python threads where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


def probe(**fields: Any) -> dict[str, Any]:
    """One point of the series: ``fields`` plus RSS (after a full collection), fds, threads."""
    gc.collect()
    return {**fields, "rss_mb": round(rss_mb(), 2), "fds": open_fds(), "threads": os_threads()}


class Tracer:
    """Optional tracemalloc: a snapshot at the end of warm-up, compared at the end."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.baseline: tracemalloc.Snapshot | None = None

    def warm(self) -> None:
        """Warm-up is over: start tracing (once)."""
        if self.on and self.baseline is None:
            tracemalloc.start(8)
            self.baseline = tracemalloc.take_snapshot()

    def report(self, top: int = 12) -> None:
        """Print where memory allocated after warm-up still lives."""
        if self.baseline is None:
            return
        gc.collect()
        print("tracemalloc, top allocations still alive since warm-up:")
        for stat in tracemalloc.take_snapshot().compare_to(self.baseline, "lineno")[:top]:
            print("   ", stat)
        tracemalloc.stop()
        self.baseline = None


def growth(series: list[dict], x: str, warmup: float, per: float) -> dict[str, float]:
    """RSS at the end of warm-up and at the end, growth after warm-up, slope in MB per ``per``."""
    end_x = series[-1][x]
    warm = next(p for p in series if p[x] >= warmup * end_x)
    after = [p for p in series if p[x] >= warm[x]]
    xs = np.array([p[x] for p in after], float)
    ys = np.array([p["rss_mb"] for p in after], float)
    slope = float(np.polyfit(xs, ys, 1)[0] * per) if len(after) > 2 and np.ptp(xs) else 0.0
    return {
        "warmup_at": warm[x],
        "rss_warmup_mb": warm["rss_mb"],
        "rss_end_mb": series[-1]["rss_mb"],
        "growth_mb": round(float(ys.max() - warm["rss_mb"]), 2),
        "slope_mb": round(slope, 3),
    }


# -- sampling soak --------------------------------------------------------------------------
def _state(runner: rc.EnvRunner) -> list[np.ndarray]:
    nest = {"w": runner.get_weights(), "c": runner.get_connector_states()}
    return [np.asarray(leaf) for leaf in tree.flatten(nest)]


def sampling_soak(args: argparse.Namespace, tmp: Path) -> tuple[list[dict], dict]:
    """Sample ``args.steps`` steps with checkpoints and restores; the series and summary."""
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=16, observation_filter="MeanStdFilter", seed=args.seed)
    policy = rc.MLPPolicy(env.observation_space, env.action_space, seed=args.seed)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    batch_steps = config.num_envs * config.rollout_fragment_length
    every = max(1, args.steps // batch_steps // args.points)
    series = [probe(steps=0, steps_per_s=0.0)]
    steps = batches = episodes = restores = rebuilt = mismatches = 0
    start = last_t = time.perf_counter()
    last_steps, tracer = 0, Tracer(args.tracemalloc)
    print(f"{'steps':>10} {'RSS MB':>8} {'fds':>5} {'threads':>7} {'steps/s':>8}", flush=True)
    while steps < args.steps:
        steps += runner.sample().count
        batches += 1
        episodes += len(runner.get_metrics())
        if steps >= args.warmup * args.steps:
            tracer.warm()
        if batches % args.checkpoint_every == 0:
            path = tmp / f"ckpt{restores % 2}"
            saved = _state(runner)
            runner.save_checkpoint(path)
            if restores % 2:
                runner.restore(path)
            else:
                runner.stop()
                runner = rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
                rebuilt += 1
            restores += 1
            got = _state(runner)
            mismatches += len(got) != len(saved) or any(
                not np.array_equal(a, b) for a, b in zip(got, saved)
            )
        if batches % every == 0 or steps >= args.steps:
            now = time.perf_counter()
            point = probe(steps=steps, steps_per_s=round((steps - last_steps) / (now - last_t)))
            series.append(point)
            last_t, last_steps = time.perf_counter(), steps
            print(
                f"{steps:>10} {point['rss_mb']:>8.1f} {point['fds']:>5} {point['threads']:>7} "
                f"{point['steps_per_s']:>8}",
                flush=True,
            )
    wall = time.perf_counter() - start
    runner.stop()
    tracer.report()
    summary = {
        "steps": steps,
        "wall_s": round(wall, 1),
        "steps_per_s": round(steps / wall),
        "episodes": episodes,
        "checkpoints": restores,
        "rebuilt_from_checkpoint": rebuilt,
        "restore_mismatches": mismatches,
        **growth(series, "steps", args.warmup, 1e6),
        "fds": [series[0]["fds"], max(p["fds"] for p in series), series[-1]["fds"]],
        "threads": [series[0]["threads"], max(p["threads"] for p in series), series[-1]["threads"]],
    }
    return series, summary


# -- main ----------------------------------------------------------------------------------------
def check(name: str, s: dict, limit: float) -> list[str]:
    """Why this soak failed (empty if it passed)."""
    bad = [f"{name}: RSS grew {s['growth_mb']} MB >= {limit} MB"] if s["growth_mb"] >= limit else []
    if s.get("restore_mismatches"):
        bad.append(f"{name}: {s['restore_mismatches']} restores differ from their checkpoint")
    if name == "serving":
        if not s["answering"]:
            bad.append("serving: the server stopped answering")
        if s["open_episodes_end"] or s["queued_end"] or s["held_states_end"]:
            bad.append("serving: abandoned episodes, queued events or connector states remain")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (~15 s)")
    ap.add_argument("--only", choices=("sampling", "serving"), help="run one soak")
    ap.add_argument("--steps", type=int, default=2_000_000, help="env steps to sample")
    ap.add_argument("--checkpoint-every", type=int, default=20, help="batches per checkpoint")
    ap.add_argument("--points", type=int, default=40, help="RSS samples over the sampling soak")
    ap.add_argument("--requests", type=int, default=100_000, help="serving requests in all")
    ap.add_argument("--clients", type=int, default=16, help="client processes")
    ap.add_argument("--kills", type=int, default=4, help="clients that exit abruptly once")
    ap.add_argument("--fault-every", type=float, default=200, help="mean requests per fault")
    ap.add_argument("--episode-timeout", type=float, default=2.0, help="server idle timeout (s)")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between server probes")
    ap.add_argument("--warmup", type=float, default=0.1, help="warm-up fraction")
    ap.add_argument("--max-growth-mb", type=float, default=50.0, help="fail at this growth")
    ap.add_argument("--tracemalloc", action="store_true", help="print top growth sites")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the series and summaries here")
    args = ap.parse_args()
    if args.quick:  # every path once: 2 checkpoints (one rebuilt, one restored), faults, a kill
        args.steps, args.checkpoint_every, args.points = 12_800, 2, 4
        args.requests, args.clients, args.kills = 600, 2, 1
        args.fault_every, args.episode_timeout, args.interval = 10, 0.5, 0.25
    report: dict[str, Any] = {}
    failures: list[str] = []
    if args.only != "serving":
        with tempfile.TemporaryDirectory(prefix="rlconnect-soak-") as tmp:
            series, summary = sampling_soak(args, Path(tmp))
        report["sampling"] = {"series": series, "summary": summary}
        print("sampling summary:", json.dumps(summary), flush=True)
        print(
            f"sampling: {summary['steps']} steps in {summary['wall_s']} s "
            f"({summary['steps_per_s']} steps/s), RSS {summary['rss_warmup_mb']} -> "
            f"{summary['rss_end_mb']} MB, growth {summary['growth_mb']} MB, slope "
            f"{summary['slope_mb']} MB per 1M steps",
            flush=True,
        )
        failures += check("sampling", summary, args.max_growth_mb)
    if args.only != "sampling":
        from soak_serving import serving_soak  # its client processes import this module

        series, summary = serving_soak(args)
        report["serving"] = {"series": series, "summary": summary}
        print("serving summary:", json.dumps(summary), flush=True)
        print(
            f"serving: {summary['requests']} requests/{summary['clients']} clients in "
            f"{summary['wall_s']} s ({summary['requests_per_s']} requests/s), RSS growth "
            f"{summary['growth_mb']} MB, answering {summary['answering']}",
            flush=True,
        )
        failures += check("serving", summary, args.max_growth_mb)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, **report}, indent=1, default=str
            )
        )
    for line in failures:
        print("FAIL", line, flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
