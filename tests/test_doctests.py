"""Every ``>>>`` example in ``src/rlconnect`` runs as a doctest: one test per module with one.

The modules are found by reading the source, not listed by hand, so a new example is run
the day it is written. Each test also counts the examples doctest ran against the ``>>>``
lines of the file: an example doctest cannot reach (in a comment, in a function nested in
a function) fails here instead of being silently left out.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import re
import tempfile
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "rlconnect"
_EXAMPLE = re.compile(r"^\s*>>> *(?!#)\S")  # a prompt with code (doctest skips comment lines)

OPTIONAL: dict[str, tuple[str, tuple[str, ...]]] = {
    # module: (extra, the imports its examples need); the test skips only when one is absent
    "rlconnect.envs.atari": ("atari", ("ale_py", "cv2")),
    "rlconnect.loggers.event_files": ("tensorboard", ("tensorboard",)),
    "rlconnect.offline.parquet_writer": ("offline", ("pyarrow",)),
}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def example_count(source: str) -> int:
    """How many ``>>>`` lines of ``source`` hold code (each is one doctest example)."""
    return sum(1 for line in source.splitlines() if _EXAMPLE.match(line))


def module_name(path: Path) -> str:
    """``src/rlconnect/a/b.py`` -> ``rlconnect.a.b``; a package's ``__init__`` -> the package."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_with_examples() -> dict[str, Path]:
    """Every module of the package whose source has at least one example, by name."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if example_count(path.read_text(encoding="utf-8")):
            found[module_name(path)] = path
    return found


MODULES = modules_with_examples()


def test_example_lines_are_counted_as_doctest_counts_them():
    source = '"""\n>>> x = 1\n>>> # a comment\n>>>\n... x\n    >>> x + 1\n2\n"""\n'
    assert example_count(source) == 2
    assert module_name(PACKAGE / "batches" / "__init__.py") == "rlconnect.batches"
    assert module_name(PACKAGE / "envs" / "atari.py") == "rlconnect.envs.atari"


def test_optional_entries_name_modules_with_examples():
    """A stale entry would let a module skip for a reason that no longer holds."""
    assert set(OPTIONAL) <= set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    extra, needs = OPTIONAL.get(name, ("", ()))
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{name}'s examples need the {extra!r} extra ({', '.join(missing)} absent)")
    # examples write where tempfile and the cwd point: inside this test's folder
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
    written = example_count(MODULES[name].read_text(encoding="utf-8"))
    assert result.attempted == written, (
        f"{name} has {written} example lines but doctest ran {result.attempted}: move each "
        "example into a docstring doctest finds (module, class, function or method)"
    )
