"""What watching a run costs: ``sample()`` with ``metrics()`` written to all three
``rc.loggers`` (JSON lines, CSV, TensorBoard) against the same runner without loggers.

Two runners on CartPole-v1, N = 64 sub-envs x 200 steps per batch, ``ConstantPolicy``
(a policy that costs nothing, so the runner's own costs are as large a share as they can
be), alike in every way but the loggers. Both take every batch's episode records
(``get_metrics()``), as a training loop does; the episode folding behind ``metrics()``
runs in both (it is always on), so it is timed on its own too. Each round gives each
runner the same CPU-time budget of whole ``sample()`` calls, in turns (reversed every
other round), and counts env steps per CPU second of the process (the TensorBoard
writer's thread included). The ratio is per round; its median and range are printed:
1.0 means watching costs nothing. On a loaded machine rounds spread widely, so each
part's own CPU time per batch is printed as a share of a ``sample()`` as well.

    python benchmarks/bench_metrics.py            # 9 rounds of 3 s each (~1 min)
    python benchmarks/bench_metrics.py --quick    # smoke run (N=8 x 50, seconds)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
from _common import ConstantPolicy, machine, median_range, print_table, ratios, take_turns

import rlconnect as rc
from rlconnect.runner.metrics import PerfTimers, RunMetrics

NUM_ENVS, FRAGMENT = 64, 200
QUICK_NUM_ENVS, QUICK_FRAGMENT = 8, 50  # --quick: small batches, every figure printed


def make_runner(log_dir: Path | None, num_envs: int, fragment: int) -> rc.EnvRunner:
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=fragment, seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1", ConstantPolicy(env.observation_space, env.action_space), config=config
    )
    if log_dir is not None:
        runner.add_logger(rc.loggers.JsonlLogger(log_dir / "metrics.jsonl"))
        runner.add_logger(rc.loggers.CsvLogger(log_dir / "metrics.csv"))
        runner.add_logger(rc.loggers.TensorBoardLogger(log_dir))
    return runner


def steps_per_cpu_second(runner: rc.EnvRunner, seconds: float) -> Callable[[], float]:
    def run() -> float:
        steps, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            steps += runner.sample().count
            runner.get_metrics()
        return steps / (time.process_time() - t0)

    return run


def shares(runner: rc.EnvRunner, logged: rc.EnvRunner, calls: int) -> dict[str, float]:
    """CPU time per batch of the episode folding (always on) and of ``metrics()`` plus
    the three loggers, each over that of one plain ``sample()``."""
    t0 = time.process_time()
    records = []
    for _ in range(calls):
        runner.sample()
        records.append(runner.get_metrics())
    per_sample = (time.process_time() - t0) / calls
    folding = RunMetrics(["default_policy"], PerfTimers())
    t0 = time.process_time()
    for batch_records in records:
        folding.add_episodes(batch_records)
    fold = (time.process_time() - t0) / calls
    logged.sample()
    record = logged.metrics()
    t0 = time.process_time()
    for _ in range(calls):
        logged.metrics()
        logged._loggers.write(record, None)
    log = (time.process_time() - t0) / calls
    return {
        "episode folding (always on)": fold / per_sample,
        "metrics() + 3 loggers": log / per_sample,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per turn")
    args = parser.parse_args()
    rounds, seconds = (1, 0.05) if args.quick else (args.rounds, args.seconds)
    n, frag = (QUICK_NUM_ENVS, QUICK_FRAGMENT) if args.quick else (NUM_ENVS, FRAGMENT)
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        runners = {
            "no loggers": make_runner(None, n, frag),
            "JSONL + CSV + TensorBoard": make_runner(Path(tmp), n, frag),
        }
        for r in runners.values():  # warm-up: the first polls check the env
            r.sample()
        results = take_turns(
            {name: steps_per_cpu_second(r, seconds) for name, r in runners.items()}, rounds
        )
        parts = shares(
            runners["no loggers"], runners["JSONL + CSV + TensorBoard"], 3 if args.quick else 10
        )
        for r in runners.values():
            r.stop()
    print(f"sample() of CartPole-v1, N={n} x {frag}, ConstantPolicy")
    print(machine())
    plain = results["no loggers"]
    rows = [
        [name, median_range(v), median_range(ratios(v, plain), ".3f")]
        for name, v in results.items()
    ]
    print_table(["runner", "env steps / CPU s", "ratio to no loggers"], rows)
    for name, share in parts.items():
        print(f"{name}: {share:.2%} of a sample()'s CPU time")


if __name__ == "__main__":
    main()
