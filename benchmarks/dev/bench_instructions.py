"""Instructions the runner executes per env step, counted by valgrind (noise-free).

Wall and CPU times on a shared machine move by several percent from run to run; the
number of instructions a deterministic run executes does not. This script counts them
with ``valgrind --tool=callgrind`` for an ``EnvRunner`` sampling CartPole-v1 with a
policy that costs nothing (``_common.ConstantPolicy``: action 0 for every row) and the
default pipelines, at N = 1, 8 and 64 sub-envs, and subtracts what gymnasium's CartPole
costs stepped alone in a plain loop: what remains is the runner's own work per env step
(``all`` is the sum; compare trees on both columns).

    python benchmarks/dev/bench_instructions.py                      # this source tree (~3 min)
    python benchmarks/dev/bench_instructions.py --base-src OTHER/src # and another, with ratios
    python benchmarks/dev/bench_instructions.py --quick              # smoke run (N = 1, 8)

How: one process per source tree runs under callgrind. For each N it builds the runner
and samples two warm-up batches, then forks twice: one child exits at once, the other
samples the measured batches and exits. A forked child inherits the parent's count, so
the difference of the two children's totals is the measured batches alone. (Objects made
before the fork are frozen out of the garbage collector, so its passes cost the same in
every run.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _common

SIZES = (1, 8, 64)
ENV_STEPS = 4_096  # env steps measured per N (fewer with --quick)
BATCHES = 4  # the measured batches, of ENV_STEPS / BATCHES env steps each


# -- inside valgrind ----------------------------------------------------------------------
def _forked_pair(work: Callable[[], None]) -> tuple[int, int]:
    """The pids of a child that exits at once and of one that runs ``work`` first."""
    gc.collect()
    gc.freeze()  # what exists now is never traversed again: the children collect the same
    pids = []
    for run in (False, True):
        pid = os.fork()
        if pid == 0:
            if run:
                work()
            os._exit(0)
        os.waitpid(pid, 0)
        pids.append(pid)
    return pids[0], pids[1]


def _sample(runner: Any, batches: int) -> None:
    for _ in range(batches):
        runner.sample()


def _step_alone(envs: list[Any], polls: int) -> None:
    """Gymnasium's CartPole stepped with action 0 in a plain loop, ``polls`` times each."""
    for _ in range(polls):
        for env in envs:
            _, _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                env.reset()


def _measure(sizes: list[int], env_steps: int) -> None:
    """Print one JSON line per N: the pids whose counts differ by the measured work."""
    import gymnasium as gym
    from _common import ConstantPolicy

    import rlconnect as rc

    space = gym.make("CartPole-v1")
    for n in sizes:
        frag = max(env_steps // (BATCHES * n), 1)  # polls per batch
        cfg = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=0)
        policy = ConstantPolicy(space.observation_space, space.action_space)
        runner = rc.EnvRunner("CartPole-v1", policy, config=cfg)
        for _ in range(2):  # warm-up (and the first polls, which check the env)
            runner.sample()
        run = _forked_pair(partial(_sample, runner, BATCHES))
        runner.stop()
        envs = [gym.make("CartPole-v1") for _ in range(n)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        alone = _forked_pair(partial(_step_alone, envs, BATCHES * frag))
        print(json.dumps({"n": n, "steps": BATCHES * frag * n, "run": run, "env": alone}))


# -- outside ------------------------------------------------------------------------------
def _total(folder: Path, pid: int) -> int:
    for line in (folder / f"cg.{pid}").read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in callgrind's output for process {pid}")


def count(src: str, sizes: list[int], env_steps: int) -> dict[int, tuple[float, float]]:
    """N -> (instructions per env step of the run, of CartPole alone), ``src`` imported."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "0"}  # the same dicts
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p"]
        cmd += [sys.executable, __file__, "--inner", "--steps", str(env_steps)]
        cmd += ["--sizes", *map(str, sizes)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"the run under valgrind failed:\n{proc.stderr[-3000:]}")
        out = {}
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            run, alone = (
                _total(Path(tmp), b) - _total(Path(tmp), a) for a, b in (r["run"], r["env"])
            )
            out[r["n"]] = (run / r["steps"], alone / r["steps"])
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--base-src", help="another source tree (its src/) to compare with")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--steps", type=int, default=ENV_STEPS, help="env steps per N")
    args = parser.parse_args()
    if args.inner:
        _measure(args.sizes, args.steps)
        return
    if shutil.which("valgrind") is None:
        print("valgrind not found: no instructions per env step counted (install valgrind)")
        sys.exit(0 if args.quick else 1)
    sizes, steps = ([1, 8], 256) if args.quick else (args.sizes, args.steps)
    here = str(Path(__file__).resolve().parents[2] / "src")
    trees = {"this": here, **({"base": args.base_src} if args.base_src else {})}
    counts = {name: count(src, sizes, steps) for name, src in trees.items()}
    print("instructions per env step (callgrind; CartPole-v1, a policy that costs nothing)")
    header = f"{'N':>4} {'tree':>5} {'all':>9} {'CartPole':>9} {'runner':>9}"
    print(header + ("  this/base: all, runner" if "base" in counts else ""))
    for n in sizes:
        for name, by_n in counts.items():
            run, env_alone = by_n[n]
            line = f"{n:>4} {name:>5} {run:>9.0f} {env_alone:>9.0f} {run - env_alone:>9.0f}"
            if name == "base":
                this_run, this_alone = counts["this"][n]
                line += f"  {this_run / run:.3f} {(this_run - this_alone) / (run - env_alone):.3f}"
            print(line)


if __name__ == "__main__":
    main()
