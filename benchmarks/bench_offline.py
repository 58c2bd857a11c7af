"""How fast are batches written to and read from Parquet, and how large are they on disk?

Datasets (synthetic batches shaped exactly like what a runner samples):

- ``cartpole``: 1,000,000 rows of CartPole columns (``obs`` / ``new_obs`` float32[4],
  ``actions``, ``rewards`` float64, ``terminateds``, ``truncateds``, ``infos`` (empty
  dicts), ``t``, ``eps_id``, ``env_id``, ``agent_index``, ``action_logp``,
  ``action_dist_inputs`` float32[2]) in batches of 4,000 rows.
- ``atari``: 84x84x4 uint8 ``obs`` and ``new_obs`` plus the same scalar columns, 20,000
  rows (2.2 GB of image data would be 1.1 GB per 10,000 rows, so fewer rows than CartPole)
  in batches of 500. Frames are Atari-like: a dark background with a few moving bright
  blocks and a noisy score strip, so compression sees realistic redundancy; pure noise
  would not compress at all, a black frame would compress ~1000x.

Each dataset is written with ``ParquetBatchWriter`` (64 MiB files) once with
``compress_columns=("obs", "new_obs")`` (zstd, the default) and once with no compressed
column, then read back with ``rc.read_batches`` (whole batches as written). MB/s counts
the in-memory (numpy) bytes of the batches. Times are the median of ``--repeats`` runs.

    python benchmarks/bench_offline.py            # full (~1-2 min)
    python benchmarks/bench_offline.py --quick    # smoke run (a few seconds)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import machine, print_table

import rlconnect as rc
from rlconnect.offline import ParquetBatchWriter


def scalar_columns(n: int, start: int, rng: np.random.Generator) -> dict:
    t = (np.arange(start, start + n) % 200).astype(np.int64)
    return {
        "actions": rng.integers(0, 2, n),
        "rewards": np.ones(n),
        "terminateds": t == 199,
        "truncateds": np.zeros(n, bool),
        "infos": [{}] * n,
        "t": t,
        "eps_id": (np.arange(start, start + n) // 200).astype(np.int64),
        "env_id": np.zeros(n, np.int64),
        "agent_index": np.zeros(n, np.int64),
        "action_logp": rng.uniform(-1.0, 0.0, n).astype(np.float32),
        "action_dist_inputs": rng.standard_normal((n, 2)).astype(np.float32),
    }


def cartpole_batches(rows: int, per_batch: int) -> list[rc.SampleBatch]:
    rng = np.random.default_rng(0)
    out = []
    for start in range(0, rows, per_batch):
        n = min(per_batch, rows - start)
        obs = (rng.standard_normal((n + 1, 4)) * [1.0, 0.5, 0.1, 0.5]).astype(np.float32)
        out.append(
            rc.SampleBatch({"obs": obs[:-1], "new_obs": obs[1:], **scalar_columns(n, start, rng)})
        )
    return out


def atari_frames(n: int, start: int, rng: np.random.Generator) -> np.ndarray:
    frames = np.full((n + 4, 84, 84), 20, np.uint8)
    k = np.arange(start, start + n + 4)
    for j in range(3):  # three moving blocks
        x = (k * (j + 1) * 3 + 17 * j) % 76
        y = (k * (j + 2) + 29 * j) % 76
        for i in range(n + 4):
            frames[i, y[i] : y[i] + 8, x[i] : x[i] + 8] = 200 - 40 * j
    frames[:, :6, :] = rng.integers(0, 255, (n + 4, 6, 84), dtype=np.uint8)  # score strip
    return np.stack([frames[i : i + n + 1] for i in range(4)], axis=-1)  # (n + 1, 84, 84, 4)


def atari_batches(rows: int, per_batch: int) -> list[rc.SampleBatch]:
    rng = np.random.default_rng(0)
    out = []
    for start in range(0, rows, per_batch):
        n = min(per_batch, rows - start)
        frames = atari_frames(n, start, rng)
        out.append(
            rc.SampleBatch(
                {"obs": frames[:-1], "new_obs": frames[1:], **scalar_columns(n, start, rng)}
            )
        )
    return out


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.parquet"))


def run(batches: list[rc.SampleBatch], compress: bool, repeats: int) -> dict:
    rows = sum(len(b) for b in batches)
    nbytes = sum(b.nbytes for b in batches)
    cols = ("obs", "new_obs") if compress else ()
    writes, reads, size, files = [], [], 0, 0
    for _ in range(repeats):
        d = Path(tempfile.mkdtemp(prefix="bench_offline_"))
        try:
            t0 = time.perf_counter()
            with ParquetBatchWriter(d, compress_columns=cols) as w:
                for b in batches:
                    w.write(b)
            writes.append(time.perf_counter() - t0)
            size, files = dir_size(d), len(list(d.glob("*.parquet")))
            t0 = time.perf_counter()
            got = sum(b.count for b in rc.read_batches(d))
            reads.append(time.perf_counter() - t0)
            if got != rows:
                raise RuntimeError(f"read {got} rows, wrote {rows}")
        finally:
            shutil.rmtree(d, ignore_errors=True)
    w_s, r_s = statistics.median(writes), statistics.median(reads)
    return {
        "rows": rows,
        "mb": nbytes / 1e6,
        "write_rows_s": rows / w_s,
        "write_mb_s": nbytes / 1e6 / w_s,
        "read_rows_s": rows / r_s,
        "read_mb_s": nbytes / 1e6 / r_s,
        "disk_mb": size / 1e6,
        "files": files,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small datasets, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        sets = {"cartpole": cartpole_batches(20_000, 4000), "atari": atari_batches(500, 250)}
        repeats = 1
    else:
        sets = {
            "cartpole": cartpole_batches(1_000_000, 4000),
            "atari": atari_batches(20_000, 500),
        }
        repeats = args.repeats
    print(machine())
    print(f"rlconnect offline benchmark (pyarrow Parquet), median of {repeats} repeats")
    rows = []
    for name, batches in sets.items():
        for compress in (True, False):
            r = run(batches, compress, repeats)
            rows.append(
                (
                    name,
                    "obs,new_obs" if compress else "none",
                    f"{r['rows']:,}",
                    f"{r['mb']:.1f}",
                    f"{r['write_rows_s']:,.0f}",
                    f"{r['write_mb_s']:.1f}",
                    f"{r['read_rows_s']:,.0f}",
                    f"{r['read_mb_s']:.1f}",
                    f"{r['disk_mb']:.1f}",
                    r["files"],
                )
            )
    header = ("dataset", "compressed", "rows", "in-mem MB", "write rows/s", "write MB/s")
    print_table((*header, "read rows/s", "read MB/s", "disk MB", "files"), rows)


if __name__ == "__main__":
    main()
