"""Taking rows of a column: numpy's ``a[index]`` against ``rlconnect.batches.take.take_rows``.

Building a batch takes the rows of every column twice (a transition's first and second
row), and ``SampleBatch.take`` does it for minibatches. For each column shape below, with
3,200 rows (a CartPole batch of 50 polls of 64 envs) and a shuffled index of 3,136 of
them, both ways take turns for ``--rounds`` rounds (in reverse order every other round);
the table gives the median [min-max] microseconds per call and their ratio, for integer
indices and for a boolean mask.

    python benchmarks/bench_take.py [--quick] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from bench_envpool_pacer import take_turns

from rlconnect.batches.take import take_rows

ROWS, TAKEN = 3200, 3136

SHAPES: dict[str, tuple[tuple[int, ...], type]] = {
    "int64 (n,)": ((ROWS,), np.int64),
    "object (n,)": ((ROWS,), object),
    "float32 (n, 4)": ((ROWS, 4), np.float32),
    "float64 (n, 2, 3)": ((ROWS, 2, 3), np.float64),
    "uint8 (n, 84, 84)": ((ROWS, 84, 84), np.uint8),
}


def per_call_us(fn: Callable[[], object], seconds: float) -> float:
    """Microseconds per call, over about ``seconds`` of repeated calls."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(10):
            fn()
        calls += 10
    return elapsed / calls * 1e6


def contenders(column: np.ndarray, index: np.ndarray) -> dict[str, Callable[[float], float]]:
    """``seconds`` -> microseconds per call, of ``column[index]`` and of ``take_rows``."""
    return {
        "plain": lambda seconds: per_call_us(lambda: column[index], seconds),
        "ours": lambda seconds: per_call_us(lambda: take_rows(column, index), seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 short rounds")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rounds, seconds = (2, 0.01) if args.quick else (args.rounds, 0.1)
    rng = np.random.default_rng(0)
    index = rng.permutation(ROWS)[:TAKEN]
    mask = np.zeros(ROWS, dtype=bool)
    mask[index] = True
    print(f"{ROWS} rows, {TAKEN} taken; median [min-max] us per call over {rounds} rounds")
    print(f"{'column':20s} {'index':6s} {'a[index]':>20s} {'take_rows':>20s} {'ratio':>6s}")
    for name, (shape, dtype) in SHAPES.items():
        column: np.ndarray = np.zeros(shape, dtype=dtype)
        for kind, idx in (("ints", index), ("mask", mask)):
            us = take_turns(contenders(column, idx), rounds, seconds)
            plain, ours = us["plain"], us["ours"]
            p, o = statistics.median(plain), statistics.median(ours)
            cells = [f"{p:8.1f} [{min(plain):.1f}-{max(plain):.1f}]"]
            cells.append(f"{o:8.1f} [{min(ours):.1f}-{max(ours):.1f}]")
            print(f"{name:20s} {kind:6s} {cells[0]:>20s} {cells[1]:>20s} {p / o:6.2f}")


if __name__ == "__main__":
    main()
