"""Does ``batch.minibatches`` cost what a hand-written shuffle-and-index loop costs?

The batch: ``--rows`` rows (1M by default) of the columns a PPO learner reads (``obs``
``(n, 4)`` float32, ``actions`` int64, ``action_logp``, ``advantages``, ``value_targets``,
``vf_preds`` float32, ``eps_id`` and ``t`` int64), one epoch of minibatches of
``--size`` rows (4096 by default).

The contenders, alternating round by round (``_common.take_turns``), each timed in wall
seconds for the whole epoch:

- ``minibatches (torch)``: ``batch.to("cpu").minibatches(size, seed=r)`` (the tensors
  share the arrays' memory; ``torch.randperm`` and ``index_select`` per column);
- ``hand (torch)``: ``perm = torch.randperm(n)`` and ``{k: v[idx] for k, v in cols.items()}``
  for each ``idx = perm[i:i + size]``, over the same tensors: what users write by hand;
- ``hand index_select (torch)``: the same loop with ``v.index_select(0, idx)``, the
  fastest gather torch has for rows;
- ``minibatches (numpy)`` and ``hand (numpy)``: the same on the numpy batch
  (``rng.permutation`` and ``np.take`` / ``v[idx]``).

Each minibatch's columns are read once (their sum) so that nothing is left lazy. It
prints the times (median [min-max] over rounds) and the ratio hand / minibatches per
round (1.0: the same cost; the target is at least 0.8).

    python benchmarks/bench_minibatches.py            # 1M rows, 5 rounds (~1 min)
    python benchmarks/bench_minibatches.py --quick    # 100k rows, 3 rounds (seconds)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _common import machine, median_range, print_table, ratios, take_turns

import rlconnect as rc

torch.set_num_threads(1)


def make_batch(rows: int) -> rc.SampleBatch:
    """The columns a PPO learner reads, ``rows`` long, seeded."""
    rng = np.random.default_rng(0)
    return rc.SampleBatch(
        {
            "obs": rng.standard_normal((rows, 4), dtype=np.float32),
            "actions": rng.integers(0, 2, rows),
            "action_logp": rng.standard_normal(rows, dtype=np.float32),
            "advantages": rng.standard_normal(rows, dtype=np.float32),
            "value_targets": rng.standard_normal(rows, dtype=np.float32),
            "vf_preds": rng.standard_normal(rows, dtype=np.float32),
            "eps_id": np.repeat(np.arange(rows // 100 + 1), 100)[:rows],
            "t": np.tile(np.arange(100), rows // 100 + 1)[:rows],
        }
    )


def _touch(columns: Any) -> float:
    return float(sum(float(v.sum()) for v in columns.values()))


def contenders(batch: rc.SampleBatch, size: int) -> dict[str, Callable[[], float]]:
    """Each contender runs one epoch and returns its wall seconds."""
    tensors = batch.to("cpu")
    cols_t = dict(tensors.items())
    cols_n = dict(batch.items())
    n = len(batch)
    seeds = iter(range(1_000_000))

    def timed(epoch: Callable[[int], None]) -> Callable[[], float]:
        def run() -> float:
            seed = next(seeds)
            t0 = time.perf_counter()
            epoch(seed)
            return time.perf_counter() - t0

        return run

    def ours_torch(seed: int) -> None:
        for mb in tensors.minibatches(size, seed=seed):
            _touch(mb)

    def hand_torch(seed: int) -> None:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        for i in range(0, n, size):
            idx = perm[i : i + size]
            _touch({k: v[idx] for k, v in cols_t.items()})

    def hand_select(seed: int) -> None:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        for i in range(0, n, size):
            idx = perm[i : i + size]
            _touch({k: v.index_select(0, idx) for k, v in cols_t.items()})

    def ours_numpy(seed: int) -> None:
        for mb in batch.minibatches(size, seed=seed):
            _touch(mb)

    def hand_numpy(seed: int) -> None:
        perm = np.random.default_rng(seed).permutation(n)
        for i in range(0, n, size):
            idx = perm[i : i + size]
            _touch({k: v[idx] for k, v in cols_n.items()})

    return {
        "minibatches (torch)": timed(ours_torch),
        "hand (torch)": timed(hand_torch),
        "hand index_select (torch)": timed(hand_select),
        "minibatches (numpy)": timed(ours_numpy),
        "hand (numpy)": timed(hand_numpy),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100k rows, 3 rounds")
    args = parser.parse_args()
    rows, rounds = (100_000, 3) if args.quick else (args.rows, args.rounds)
    batch = make_batch(rows)
    runs = contenders(batch, args.size)
    for run in runs.values():  # warm up (first-call costs) before the rounds
        run()
    results = take_turns(runs, rounds)
    print(f"minibatches of {args.size} rows over {rows:,} rows, {rounds} rounds; {machine()}")
    table = [[name, median_range([1e3 * s for s in t], ",.1f")] for name, t in results.items()]
    print_table(["one epoch", "ms"], table)
    for hand, ours in [
        ("hand (torch)", "minibatches (torch)"),
        ("hand index_select (torch)", "minibatches (torch)"),
        ("hand (numpy)", "minibatches (numpy)"),
    ]:
        ratio = median_range(ratios(results[hand], results[ours]), ".2f")
        print(f"ratio {hand} / {ours}: {ratio} (target >= 0.8)")


if __name__ == "__main__":
    main()
