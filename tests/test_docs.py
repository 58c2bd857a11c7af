"""Every ```python block of every docs/**/*.md page runs, in order, in one namespace per page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rlconnect as rc

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, code)`` of each fenced ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_block_extraction():
    text = "intro\n```python\na = 1\n```\n```text\nnot code\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (9, "b = a\n")]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_docs_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if not hasattr(rc, "check_pipeline"):  # until rlconnect/__init__ exports it
        from rlconnect.checker import check_pipeline

        monkeypatch.setattr(rc, "check_pipeline", check_pipeline, raising=False)
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, code in blocks:
        where = f"{page.relative_to(DOCS).as_posix()}:{line}"
        # pad so tracebacks show the line number in the .md file
        exec(compile("\n" * (line - 1) + code, where, "exec"), namespace)


def test_every_page_is_collected():
    """The guide's pages, subfolders included, are all run (none silently left out)."""
    names = {p.relative_to(DOCS).as_posix() for p in PAGES}
    for expected in ("index.md", "connectors.md", "runner.md", "api/index.md"):
        assert expected in names


def test_the_architecture_picture_is_drawn_from_the_imports():
    """docs/img/architecture.svg is what docs/_ext/draw_architecture.py draws from the
    package's imports today: a package moved to another layer updates the picture."""
    import subprocess
    import sys

    script = DOCS / "_ext" / "draw_architecture.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_architecture_page_names_every_home_once():
    """Each subpackage of rlconnect has exactly one row in docs/architecture.md's homes."""
    import re

    package = DOCS.parent / "src" / "rlconnect"
    homes = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    rows = re.findall(r"^\| `([a-z_]+)/?` \|", (DOCS / "architecture.md").read_text(), re.M)
    assert sorted(r for r in rows if r != "errors") == homes
    assert len(rows) == len(set(rows))
