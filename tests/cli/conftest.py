"""Helpers for running ``python -m rlconnect`` as a user does, from this checkout's sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from machine_speed import scaled

SRC = Path(__file__).resolve().parents[2] / "src"


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell, with this checkout's sources first on the path."""
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", COLUMNS="80")
    env.pop("RLCONNECT_TRACEBACK", None)
    env.update(extra)
    return env


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m rlconnect *args`` in a subprocess; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "rlconnect", *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        cwd=cwd,
        env=user_env(**env),
        check=False,
    )


@pytest.fixture
def cli():
    return run_cli
