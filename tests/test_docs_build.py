"""The documentation site builds with MkDocs in strict mode: no warning of any kind.

Strict mode turns every warning into a failure: a broken link or anchor, a page missing
from the nav, an API reference entry that does not resolve, or a docstring that griffe
cannot parse.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner, not a build warning
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    for page in ("index.html", "api/index.html", "rllib-migration/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
