"""The README's commands work as written: commands that live in the Makefile's venv say so,
the example files they name exist, and ``make test`` (what CI runs) keeps every test while
``make test-fast`` leaves out only the ``slow`` and ``ray`` markers."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md"]
_BASH = re.compile(r"^```bash[ \t]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_ACTIVATE = "source .venv/bin/activate"


def _commands(page: Path) -> list[tuple[bool, list[str]]]:
    """``(venv active, argv)`` of every command in the page's bash blocks, comments cut."""
    out = []
    for block in _BASH.findall(page.read_text(encoding="utf-8")):
        active = False
        for line in block.splitlines():
            code = line.split("  #")[0].strip()
            if not code:
                continue
            active = active or code == _ACTIVATE
            out.append((active, shlex.split(code)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_commands_of_the_venv_say_where_they_come_from(page: Path) -> None:
    for active, argv in _commands(page):
        if argv[0] in ("rlconnect", "python", "mkdocs"):
            # the Makefile installs them in .venv/: activated first, or spelled with the path
            assert active, argv
        if argv[0].endswith("python") and len(argv) > 1 and argv[1].startswith("examples/"):
            assert (ROOT / argv[1]).is_file(), argv


def _make(target: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line for line in done.stdout.splitlines() if "-m pytest" in line]


def test_make_test_runs_everything_and_test_fast_leaves_out_slow_and_ray() -> None:
    (full,) = _make("test")
    assert " -m " not in full.split("pytest", 1)[1]  # no marker left out
    (fast,) = _make("test-fast")
    assert fast.endswith('-m "not slow and not ray"')
    assert "make test\n" in (ROOT / ".ci" / "run").read_text()  # CI runs the whole suite
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make test-fast" in readme and "minutes" in readme


_DURATION = re.compile(r"<!-- test-duration:.*?-->\n(.*?)<!-- /test-duration -->", re.DOTALL)


def test_one_test_duration_everywhere() -> None:
    """The README and the docs' front page say how long the tests take in the same words
    (one marked paragraph), and no other figure for it."""
    paragraphs = [_DURATION.findall(p.read_text(encoding="utf-8")) for p in PAGES]
    assert all(len(found) == 1 for found in paragraphs), paragraphs
    assert paragraphs[0] == paragraphs[1]
    assert "minutes on" in paragraphs[0][0] and "December 2026" in paragraphs[0][0]
    for page in PAGES:
        rest = _DURATION.sub("", page.read_text(encoding="utf-8"))
        assert not re.search(r"\d+(-\d+)? ?min(utes)?\b", rest), page.name
