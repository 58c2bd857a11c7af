"""The benchmark scripts run to completion (no timing assertions: machines are noisy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_connectors_quick_prints_the_table():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_connectors.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "µs/call" in out
    assert "µs/row" in out
    assert "1024 one-row calls / one 1024-row call" in out
    for rows in ("1", "64", "1024"):
        assert f" {rows} " in out
