"""Instructions the runner executes per env step, counted by valgrind (noise-free).

Wall and CPU times on a shared machine move by several percent from run to run; the
number of instructions a deterministic run executes does not. This script counts them
with ``valgrind --tool=callgrind`` for an ``EnvRunner`` with a policy that costs nothing
(``_common.ConstantPolicy``: the first action for every row) and the default pipelines:

- ``cartpole``: CartPole-v1 at N = 1, 8 and 64 sub-envs, minus what gymnasium's CartPole
  costs stepped alone in a plain loop: what remains is the runner's own work per env step
  (``all`` is the sum; compare trees on both columns);
- ``rps``, ``rps_parallel`` and ``four`` (``multi_agent_loops.py``): PettingZoo's ``rps_v2``
  turn-based and as a ``ParallelEnv``, and four agents acting at every step, at N = 1 and
  8, against a hand loop that records the same per-agent rows (``runner/hand``: the runner's instructions per env step over the
  hand loop's).

    python benchmarks/dev/bench_instructions.py                      # this source tree (~5 min)
    python benchmarks/dev/bench_instructions.py --base-src OTHER/src # and another, with ratios
    python benchmarks/dev/bench_instructions.py --quick              # smoke run (N = 1, 64 steps)
    python benchmarks/dev/bench_instructions.py --workloads rps rps_parallel four  # multi-agent

How: one process per source tree runs under callgrind. For each N it builds the runner
and samples two warm-up batches, then forks twice: one child exits at once, the other
samples the measured batches and exits. A forked child inherits the parent's count, so
the difference of the two children's totals is the measured batches alone. (Objects made
before the fork are frozen out of the garbage collector, so its passes cost the same in
every run.) The child runs with ``PYTHONHASHSEED=0``: string hashes, hence dict and set
layouts and their probe counts, are the same from one run to the next.
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
QUICK_SIZES, QUICK_STEPS = [1], 64  # --quick: every workload and table, once, at N = 1
BATCHES = 4  # the measured batches, of ENV_STEPS / BATCHES env steps each
WORKLOAD_NAMES = ["cartpole", "rps", "rps_parallel", "four"]
MULTI_MAX_N = 8  # the multi-agent workloads are measured at N = 1 and 8


# -- inside valgrind ----------------------------------------------------------------------
def _forked_pair(work: Callable[[], int]) -> tuple[int, int, int]:
    """The pids of a child that exits at once and of one that runs ``work`` first, and the
    env steps ``work`` returned (told through a pipe)."""
    gc.collect()
    gc.freeze()  # what exists now is never traversed again: the children collect the same
    pids = []
    read, write = os.pipe()
    for run in (False, True):
        pid = os.fork()
        if pid == 0:
            try:
                if run:
                    os.write(write, str(work()).encode())
            finally:
                os._exit(0)  # (an error shows as no steps told)
        os.waitpid(pid, 0)
        pids.append(pid)
    os.close(write)
    with os.fdopen(read) as f:
        steps = int(f.read())
    return pids[0], pids[1], steps


def _sample(runner: Any, batches: int) -> int:
    return sum(runner.sample().count for _ in range(batches))


def _step_alone(envs: list[Any], polls: int) -> int:
    """Gymnasium's CartPole stepped with action 0 in a plain loop, ``polls`` times each."""
    for _ in range(polls):
        for env in envs:
            _, _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                env.reset()
    return polls * len(envs)


def _hand_batches(run: Callable[[int], int], rounds: int) -> int:
    return sum(run(rounds) for _ in range(BATCHES))


def _measure_cartpole(sizes: list[int], env_steps: int) -> None:
    """One JSON line per N: the pids whose counts differ by the measured work."""
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
        print(json.dumps({"workload": "cartpole", "n": n, "run": run, "ref": alone}))


def _measure_multi_agent(name: str, sizes: list[int], env_steps: int) -> None:
    """One JSON line per N: the runner's and the hand loop's pids and env steps."""
    from multi_agent_loops import WORKLOADS

    workload = WORKLOADS[name]
    for n in sizes:
        frag = max(env_steps // (BATCHES * n), 1)
        runner = workload.runner(n, frag)
        for _ in range(2):
            runner.sample()
        run = _forked_pair(partial(_sample, runner, BATCHES))
        runner.stop()
        hand = workload.hand_loop(n)
        hand(frag)  # warm-up
        ref = _forked_pair(partial(_hand_batches, hand, frag))
        print(json.dumps({"workload": name, "n": n, "run": run, "ref": ref}))


def _measure(workloads: list[str], sizes: list[int], env_steps: int) -> None:
    for name in workloads:
        if name == "cartpole":
            _measure_cartpole(sizes, env_steps)
        else:
            _measure_multi_agent(name, [n for n in sizes if n <= MULTI_MAX_N], env_steps)


# -- outside ------------------------------------------------------------------------------
def _total(folder: Path, pid: int) -> int:
    for line in (folder / f"cg.{pid}").read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in callgrind's output for process {pid}")


Counts = dict[tuple[str, int], tuple[float, float]]


def count(src: str, workloads: list[str], sizes: list[int], env_steps: int) -> Counts:
    """(workload, N) -> instructions per env step of the runner and of the reference (env
    alone for CartPole, the recording hand loop for the multi-agent workloads), ``src``
    imported."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": src, "PYTHONHASHSEED": "0"}  # the same dicts
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p"]
        cmd += [sys.executable, __file__, "--inner", "--steps", str(env_steps)]
        cmd += ["--sizes", *map(str, sizes), "--workloads", *workloads]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"the run under valgrind failed:\n{proc.stderr[-3000:]}")
        out = {}
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            run, ref = (
                (_total(Path(tmp), b) - _total(Path(tmp), a)) / steps
                for a, b, steps in (r["run"], r["ref"])
            )
            out[r["workload"], r["n"]] = (run, ref)
        return out


def _print_cartpole(counts: dict[str, Counts], sizes: list[int]) -> None:
    print("instructions per env step (callgrind; CartPole-v1, a policy that costs nothing)")
    header = f"{'N':>4} {'tree':>5} {'all':>9} {'CartPole':>9} {'runner':>9}"
    print(header + ("  this/base: all, runner" if "base" in counts else ""))
    for n in sizes:
        for name, by_n in counts.items():
            run, env_alone = by_n["cartpole", n]
            line = f"{n:>4} {name:>5} {run:>9.0f} {env_alone:>9.0f} {run - env_alone:>9.0f}"
            if name == "base":
                this_run, this_alone = counts["this"]["cartpole", n]
                line += f"  {this_run / run:.3f} {(this_run - this_alone) / (run - env_alone):.3f}"
            print(line)


def _print_multi_agent(counts: dict[str, Counts], workload: str, sizes: list[int]) -> None:
    from multi_agent_loops import WORKLOADS

    print(f"\ninstructions per env step (callgrind; {WORKLOADS[workload].title})")
    header = f"{'N':>4} {'tree':>5} {'runner':>9} {'hand loop':>9} {'runner/hand':>11}"
    print(header + ("  this/base: runner" if "base" in counts else ""))
    for n in sizes:
        for name, by_n in counts.items():
            run, hand = by_n[workload, n]
            line = f"{n:>4} {name:>5} {run:>9.0f} {hand:>9.0f} {run / hand:>11.2f}"
            if name == "base":
                line += f"  {counts['this'][workload, n][0] / run:.3f}"
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--base-src", help="another source tree (its src/) to compare with")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", type=int, nargs="+", help=f"sub-envs (default {SIZES})")
    parser.add_argument("--steps", type=int, help=f"env steps per N (default {ENV_STEPS})")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOAD_NAMES, default=WORKLOAD_NAMES)
    args = parser.parse_args()
    sizes = args.sizes or (QUICK_SIZES if args.quick else list(SIZES))
    steps = args.steps or (QUICK_STEPS if args.quick else ENV_STEPS)
    if args.inner:
        _measure(args.workloads, sizes, steps)
        return
    if shutil.which("valgrind") is None:
        print("valgrind not found: no instructions per env step counted (install valgrind)")
        sys.exit(0 if args.quick else 1)
    here = str(Path(__file__).resolve().parents[2] / "src")
    trees = {"this": here, **({"base": args.base_src} if args.base_src else {})}
    counts = {name: count(src, args.workloads, sizes, steps) for name, src in trees.items()}
    if "cartpole" in args.workloads:
        _print_cartpole(counts, sizes)
    for workload in args.workloads:
        if workload != "cartpole":
            _print_multi_agent(counts, workload, [n for n in sizes if n <= MULTI_MAX_N])


if __name__ == "__main__":
    main()
