"""The offline benchmark runs to completion (no timing assertions: machines are noisy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_offline_quick_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_offline.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("write rows/s", "read MB/s", "disk MB", "cartpole", "atari"):
        assert word in proc.stdout
