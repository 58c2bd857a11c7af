"""How much of the runner's CPU time goes to Python's garbage collector?

Every object that holds other objects (dicts, lists, episodes) is followed by CPython's
cyclic garbage collector, and one that lives through two of its young collections is
scanned again by every full collection until it dies. What a runner keeps alive while
its rows wait for the batch (episodes, their reward dicts, metric records) therefore
costs time at every full collection. This script samples a workload (``ConstantPolicy``,
the default pipelines, fragments of 50, ``get_metrics()`` after every batch, as a
training loop does) for a fixed number of batches and counts, with ``gc.callbacks``,
the collections of each generation and the CPU time they took, as a share of the
process's CPU time. Collection counts are the same from run to run; the share moves
with the machine as all CPU times do.

    python benchmarks/dev/bench_gc.py                        # this tree
    python benchmarks/dev/bench_gc.py --base-src OTHER/src   # and another, side by side
    python benchmarks/dev/bench_gc.py --quick                # smoke run

Each tree runs in a fresh process that imports rlconnect from it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _common

from _common import build_runner, machine, print_table

#: name -> (env, number of sub-envs, batches measured)
WORKLOADS = {
    "cartpole-inprocess N=64": ("CartPole-v1", 64, 300),
    "cartpole-envpool N=64": ("envpool:CartPole-v1", 64, 600),
    "cartpole-inprocess N=8": ("CartPole-v1", 8, 300),
}


def _measure(env: str, num_envs: int, batches: int) -> dict:
    """Collections per generation and the CPU seconds they took, and the process's CPU
    seconds, over ``batches`` batches after a warm-up."""
    runner = build_runner(env, num_envs)
    for _ in range(3):
        runner.sample()
        runner.get_metrics()
    counts, secs, started = [0, 0, 0], [0.0, 0.0, 0.0], [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            counts[info["generation"]] += 1
            secs[info["generation"]] += time.process_time() - started[0]

    gc.callbacks.append(timed)
    t0 = time.process_time()
    for _ in range(batches):
        runner.sample()
        runner.get_metrics()
    cpu = time.process_time() - t0
    gc.callbacks.remove(timed)
    runner.stop()
    return {"counts": counts, "gc": sum(secs), "cpu": cpu}


def _run_tree(src: str, names: list[str], scale: float) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": src}
    out = {}
    for name in names:
        cmd = [sys.executable, __file__, "--inner", name, "--scale", str(scale)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"{name} failed under {src}:\n{proc.stderr[-2000:]}")
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-src", help="another source tree (its src/) to compare with")
    parser.add_argument("--quick", action="store_true", help="smoke run (few batches)")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        env, n, batches = WORKLOADS[args.inner]
        print(json.dumps(_measure(env, n, max(1, int(batches * args.scale)))))
        return
    try:
        import envpool  # noqa: F401
    except ImportError:
        names = [w for w in WORKLOADS if "envpool" not in w]
    else:
        names = list(WORKLOADS)
    scale = 0.02 if args.quick else 1.0
    here = str(Path(__file__).resolve().parents[2] / "src")
    trees = {"this": here, **({"base": args.base_src} if args.base_src else {})}
    results = {tree: _run_tree(src, names, scale) for tree, src in trees.items()}
    print(machine())
    print("garbage collector: collections per generation, and its share of the CPU time")
    rows = []
    for name in names:
        for tree, by_name in results.items():
            r = by_name[name]
            gens = " / ".join(map(str, r["counts"]))
            rows.append([name, tree, gens, f"{100 * r['gc'] / r['cpu']:.1f} %"])
    print_table(["workload", "tree", "gen 0 / 1 / 2", "gc share of CPU"], rows)


if __name__ == "__main__":
    main()
