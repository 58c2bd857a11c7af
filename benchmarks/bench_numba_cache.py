"""What numba's on-disk cache saves a fresh process: the first learner-connector calls with
an empty cache (compiling), with the cache the previous process filled (loading it), and
with no cache at all (a read-only install without ``NUMBA_CACHE_DIR``: compiling, every
process).

The compiled passes behind ``GAE``, ``DiscountedReturns`` and ``NStepReturns`` are
``numba.njit(cache=True)``: the machine code is written to the first writable cache folder
(``NUMBA_CACHE_DIR``, else ``__pycache__`` next to the package, else the user's cache
folder) and loaded from there by later processes. What is cached is that code, per kernel
and per set of input dtypes; what no cache saves is numba's import and the loading itself,
paid by every process (each Ray runner, each CLI run).

Each round runs three fresh Python processes, one per case, on a batch of ``--rows`` rows
(trajectories of 1 to 500 rows, every one terminated, ``vf_preds`` recorded: no policy
call is timed):

- ``cold``: ``NUMBA_CACHE_DIR`` a new empty folder: the first calls compile and fill it;
- ``warm``: the same folder again: the first calls load what ``cold`` wrote;
- ``no cache``: the kernels compiled with ``cache=False``, what ``rlconnect`` falls back to
  where numba finds no writable folder (as root a read-only folder cannot be made, so the
  fallback is what is run).

It prints, per case, the seconds (median [min-max] over rounds) of ``import numba``, the
first ``GAE`` call, the second one (compiled code, in the same process), and the first
``NStepReturns`` plus ``DiscountedReturns`` calls, and the files ``cold`` left in the cache
folder (numba's ``.nbi`` index and ``.nbc`` code files).

    python benchmarks/bench_numba_cache.py            # 200k rows, 3 rounds (~1 min)
    python benchmarks/bench_numba_cache.py --quick    # 20k rows, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import machine, median_range, print_table

CHILD = r"""
import json, sys, time
import numpy as np
rows, case = int(sys.argv[1]), sys.argv[2]
import rlconnect as rc
t0 = time.perf_counter()
import numba
import_s = time.perf_counter() - t0
if case == "no cache":  # what a folder numba cannot write to leaves: no cache at all
    _njit = numba.njit
    numba.njit = lambda *a, **k: _njit(*a, **{**k, "cache": False})
rng = np.random.default_rng(0)
lengths = []
while sum(lengths) < rows:
    lengths.append(int(rng.integers(1, 501)))
eps = np.repeat(np.arange(len(lengths)), lengths)[:rows]
last = np.r_[eps[1:] != eps[:-1], True]
batch = {
    "eps_id": eps, "t": np.concatenate([np.arange(n) for n in lengths])[:rows],
    "rewards": rng.normal(size=rows).astype(np.float32),
    "vf_preds": rng.normal(size=rows).astype(np.float32),
    "terminateds": last, "truncateds": np.zeros(rows, bool),
    "obs": np.zeros((rows, 4), np.float32), "new_obs": np.zeros((rows, 4), np.float32),
}
space = rc.spaces.flatten_space(__import__("gymnasium").spaces.Box(-1, 1, (4,)))
act = __import__("gymnasium").spaces.Discrete(2)
policy, ctx = rc.RandomPolicy(space, act), rc.ConnectorContext(space, act)
def timed(*connectors):
    b = rc.SampleBatch(dict(batch))
    t = time.perf_counter()
    for c in connectors:
        c(b, policy)
    return time.perf_counter() - t
gae_first = timed(rc.GAE(ctx))
gae_second = timed(rc.GAE(ctx))
others = timed(rc.NStepReturns(ctx), rc.DiscountedReturns(ctx))
print(json.dumps({"import numba": import_s, "first GAE": gae_first,
                  "second GAE": gae_second, "first NStepReturns + DiscountedReturns": others}))
"""

CASES = ("cold", "warm", "no cache")
FIGURES = ("import numba", "first GAE", "second GAE", "first NStepReturns + DiscountedReturns")


def _run(case: str, rows: int, cache_dir: str) -> dict[str, float]:
    """One fresh process of ``case``; its figures."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "OPENBLAS_NUM_THREADS": "1"}
    src = Path(__file__).resolve().parents[1] / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(rows), case],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cache_files(folder: str) -> str:
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    index = sum(p.suffix == ".nbi" for p in files)
    code = sum(p.suffix == ".nbc" for p in files)
    return f"{index} index (.nbi) and {code} code (.nbc) files"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20k rows, 1 round")
    args = parser.parse_args(argv)
    rows, rounds = (20_000, 1) if args.quick else (args.rows, args.rounds)
    results: dict[str, list[dict[str, float]]] = {case: [] for case in CASES}
    filled = ""
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as none:
            results["cold"].append(_run("cold", rows, cache))
            filled = _cache_files(cache)
            results["warm"].append(_run("warm", rows, cache))
            results["no cache"].append(_run("no cache", rows, none))
            if _cache_files(none).startswith("0 index (.nbi) and 0"):
                continue
            raise RuntimeError("the no-cache process wrote a cache")  # pragma: no cover
    print(machine())
    print(f"{rows:,} rows, {rounds} round(s), seconds: median [min-max]; one fresh process each")
    table = [
        [case, *(median_range([r[f] for r in results[case]], ".3f") for f in FIGURES)]
        for case in CASES
    ]
    print_table(["case", *FIGURES], table)
    print(f"cold left in its cache folder: {filled}")


if __name__ == "__main__":
    main()
