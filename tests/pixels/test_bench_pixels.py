"""benchmarks/bench_pixels.py --quick runs to completion and prints its tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_pixels_quick():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_pixels.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rlconnect preset" in proc.stdout and "gymnasium loop" in proc.stdout
    assert "compress_observations=True" in proc.stdout
    assert "per 1M transitions" in proc.stdout
