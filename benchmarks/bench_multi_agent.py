"""Multi-agent collection against hand loops that record the same per-agent rows (wall).

The workloads of ``multi_agent_loops.py``: PettingZoo's ``rps_v2`` turn-based and as a
``ParallelEnv`` (a policy per player), and four agents acting at every step
(``rc.MultiAgentEnv``, one shared policy), each at N = 1 and 8 sub-envs in one process, with a policy that costs nothing. The runner
and the hand loop take turns round by round (the order reversed every other round); the
table gives env steps/s (medians) and the median [range] of the per-round ratios
runner / hand loop. ``bench_instructions.py`` counts the same workloads in instructions,
which do not move with the machine's load.

    python benchmarks/bench_multi_agent.py            # 5 rounds of 2 s per contender
    python benchmarks/bench_multi_agent.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

from _common import machine, median_range, print_table, ratios, sample_for, take_turns
from multi_agent_loops import WORKLOADS

SIZES = (1, 8)


def timed_hand_loop(run: Callable[[int], int], n: int, seconds: float) -> tuple[int, float]:
    """The hand loop ``run(rounds)`` for about ``seconds``: (env steps, seconds)."""
    rounds = max(256 // n, 1)  # rounds per "batch" of rows stacked
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += run(rounds)
    return steps, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per contender and round")
    args = parser.parse_args()
    rounds, seconds = (2, 0.3) if args.quick else (args.rounds, args.seconds)
    print(machine())
    table = []
    for name, workload in WORKLOADS.items():
        for n in SIZES:
            runner = workload.runner(n, max(256 // n, 1))
            runner.sample()  # warm-up (and the first polls)
            hand = workload.hand_loop(n)
            hand(8)
            rates = take_turns(
                {
                    "runner": partial(sample_for, runner, seconds),
                    "hand": partial(timed_hand_loop, hand, n, seconds),
                },
                rounds,
            )
            runner.stop()
            per_s = {k: [steps / secs for steps, secs in v] for k, v in rates.items()}
            table.append(
                (
                    f"{name} N={n}",
                    f"{statistics.median(per_s['runner']):,.0f}",
                    f"{statistics.median(per_s['hand']):,.0f}",
                    median_range(ratios(per_s["runner"], per_s["hand"]), ".3f"),
                )
            )
    print_table(("workload", "runner steps/s", "hand loop steps/s", "runner / hand"), table)
    print(
        "rps: PettingZoo rps_v2 (AEC, agents take turns); rps_parallel: the same as a "
        "ParallelEnv; four: 4 agents acting at every step (rc.MultiAgentEnv); env steps/s "
        "are medians over the rounds."
    )


if __name__ == "__main__":
    main()
