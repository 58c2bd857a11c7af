"""Every benchmark script (``benchmarks/`` for users, ``benchmarks/dev/`` for developers) runs
to completion in its quick mode and prints its table.

No timing assertions: machines are noisy; the scripts print ratios for people to read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: script -> (timeout in seconds, words its output must contain)
BENCHMARKS = {
    "bench_learner.py": (120, ("rc.GAE", "per-trajectory loop", "x faster", "max |difference|")),
    "bench_connectors.py": (
        120,
        ("µs/call", "µs/row", "1024 one-row calls / one 1024-row call", " 64 ", " 1024 "),
    ),
    "bench_sampling.py": (
        300,
        ("hand-torch", "runner-torch", "runner-mlp", "targets", "check_finite cost"),
    ),
    "dev/bench_gc.py": (240, ("garbage collector", "gen 0 / 1 / 2", "cartpole-inprocess N=64")),
    "dev/bench_instructions.py": (
        420,
        ("instructions per env step", "rps_v2", "4 agents acting", "runner/hand"),
    ),
    "bench_multi_agent.py": (240, ("rps N=1", "four N=8", "runner / hand")),
    "bench_overhead.py": (120, ("own cost per env step", "CPU us per row", "256 ")),
    "bench_parallel.py": (300, ("SyncVectorEnv", "in-process", "env workers", "EnvPool")),
    "bench_offline.py": (300, ("write rows/s", "read MB/s", "disk MB", "cartpole", "atari")),
    "bench_pixels.py": (
        240,
        ("rlconnect preset", "gymnasium loop", "compress_observations=True", "per 1M transitions"),
    ),
    "bench_remote_envs.py": (120, ("remote_envs", "slow env (1 ms/step)", "remote / in-process")),
    "bench_serving.py": (240, ("remote", "local", "p50", "p99")),
    "dev/bench_vs_commit.py": (
        300,
        ("working tree vs HEAD", "work / base per round", "cartpole-workers", "cartpole-inprocess"),
    ),
    "soak.py": (240, ("steps/s", "RSS MB", "growth", "requests/s", "timed out", "answering True")),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_benchmark_quick_mode_prints_its_table(script: str) -> None:
    timeout, words = BENCHMARKS[script]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for word in words:
        assert word in proc.stdout, f"{script} printed no {word!r}"
