"""Is the working tree as fast as a base commit? Env steps/s of both, taking turns.

The base commit's ``src/`` is exported (``git archive``) into a temporary folder, and every
timing runs in a fresh Python process that imports rlconnect from one of the two source
trees (``PYTHONPATH``); the process says which one it imported, and the benchmark checks
it. Each round times every workload once on each side, the side that goes first swapping
from round to round, so load that lasts a round or more hits both. The table gives each
side's median env steps/s with its range and the median of the per-round ratios (working
tree over base) with their range.

Workloads (``ConstantPolicy``, the default pipelines, a fragment of 50 steps per
sub-env): ``pong-workers``: Pong, Atari preset, N=8 on 2 env workers;
``cartpole-workers``: CartPole-v1, N=64 on 2 env workers; ``cartpole-envpool``:
``envpool:CartPole-v1``, N=64; ``cartpole-inprocess``: CartPole-v1, N=8 in the runner's
process. A workload whose package is missing (ale-py, envpool) is skipped.

    python benchmarks/dev/bench_vs_commit.py [BASE] [--rounds 5] [--seconds 3] [--only w1,w2]
    python benchmarks/dev/bench_vs_commit.py --quick        # HEAD against HEAD, one short round

``--quick`` times, unless ``--only`` names others, the two CartPole workloads that cover
both kinds of runner (env workers and in-process): each timing is a fresh process (and
its env workers' processes), which is what a smoke run pays for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _common

from _common import machine, median_range, print_table, ratios

ROOT = Path(__file__).resolve().parents[2]

#: name -> (env, number of sub-envs, RunnerConfig keywords)
WORKLOADS: dict[str, tuple[str, int, dict]] = {
    "pong-workers": ("ALE/Pong-v5", 8, {"preset": "atari", "num_env_workers": 2}),
    "cartpole-workers": ("CartPole-v1", 64, {"num_env_workers": 2}),
    "cartpole-envpool": ("envpool:CartPole-v1", 64, {}),
    "cartpole-inprocess": ("CartPole-v1", 8, {}),
}
QUICK_WORKLOADS = ["cartpole-workers", "cartpole-inprocess"]


def child(workload: str, seconds: float) -> None:
    """In the timing process: build the workload's runner, warm it up, time it; print
    JSON with the rate and the rlconnect that was imported."""
    from _common import build_runner, sample_for

    import rlconnect

    env, num_envs, config = WORKLOADS[workload]
    try:
        runner = build_runner(env, num_envs, **config)
    except ImportError as exc:
        print(json.dumps({"skipped": str(exc)}))
        return
    try:
        runner.sample()  # warm-up: worker start, first resets
        steps, secs = sample_for(runner, seconds)
    finally:
        runner.stop()
    print(json.dumps({"rate": steps / secs, "rlconnect": rlconnect.__file__}))


def export_src(commit: str, into: Path) -> Path:
    """``commit``'s ``src/`` folder, written under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def timed(src: Path, workload: str, seconds: float) -> float | None:
    """Env steps/s of ``workload`` in a fresh process importing rlconnect from ``src``
    (None: skipped)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--child", workload, "--seconds", str(seconds)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} on {src} failed:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in out:
        return None
    if not Path(out["rlconnect"]).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"imported {out['rlconnect']}, not rlconnect from {src}")
    return float(out["rate"])


def compare(base: str, workloads: list[str], rounds: int, seconds: float) -> None:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(machine())
    print(f"working tree vs {base} ({commit}): env steps/s, {rounds} rounds of {seconds} s")
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"base": export_src(commit, Path(tmp)), "work": ROOT / "src"}
        rates: dict[str, dict[str, list[float]]] = {w: {"base": [], "work": []} for w in workloads}
        skipped: set[str] = set()
        for r in range(rounds):
            for w in workloads:
                order = ["base", "work"] if r % 2 == 0 else ["work", "base"]
                for side in order:
                    rate = None if w in skipped else timed(sides[side], w, seconds)
                    if rate is None:
                        skipped.add(w)
                    else:
                        rates[w][side].append(rate)
    rows = [
        (
            w,
            median_range(rates[w]["base"]),
            median_range(rates[w]["work"]),
            median_range(ratios(rates[w]["work"], rates[w]["base"]), ".3f"),
        )
        for w in workloads
        if w not in skipped
    ]
    print_table(("workload", "base", "working tree", "work / base per round"), rows)
    for w in sorted(skipped):
        print(f"skipped {w}: its package is not installed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?", default="HEAD", help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--quick", action="store_true", help="one round of 0.1 s, 2 workloads")
    ap.add_argument("--child", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.seconds)
        return
    default = QUICK_WORKLOADS if args.quick else list(WORKLOADS)
    workloads = [w for w in args.only.split(",") if w] or default
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown workloads {unknown}; choose from {sorted(WORKLOADS)}")
    rounds, seconds = (1, 0.1) if args.quick else (args.rounds, args.seconds)
    compare(args.base, workloads, rounds, seconds)


if __name__ == "__main__":
    main()
