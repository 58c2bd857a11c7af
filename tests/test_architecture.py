"""The shape the code must keep (docs: ARCHITECTURE): layers, one step, small modules.

Each check reads the package's source with ``ast``; a failure names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlconnect"
RUNNER = PACKAGE / "runner"
MAX_LINES = 400

#: layers above the runner: it never imports them, not even inside a function
UPPER_LAYERS = ("rlconnect.offline", "rlconnect.serve", "rlconnect.distributed", "rlconnect.cli")


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import statement, wherever it stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def test_no_runner_part_imports_the_runner():
    """Parts get what they need, never the EnvRunner (no hub with satellites)."""
    bad = [
        f"{p.name}:{line}"
        for p in _modules(RUNNER)
        if p.name not in ("runner.py", "__init__.py")
        for line, module, names in _imports(p)
        if "EnvRunner" in names or module == "rlconnect.runner.runner"
    ]
    assert not bad, f"runner parts importing EnvRunner: {bad}"


def test_the_runner_imports_no_upper_layer():
    bad = [
        f"{p.name}:{line} {module}"
        for p in _modules(RUNNER)
        for line, module, _ in _imports(p)
        if module.startswith(UPPER_LAYERS)
    ]
    assert not bad, f"runner/ imports an upper layer: {bad}"


def test_runner_has_no_mixin_stubs():
    """No method whose body is only ``raise NotImplementedError`` (a stub filled in by a
    class it is mixed into)."""
    bad = []
    for p in _modules(RUNNER):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = [s for s in node.body if not isinstance(s, ast.Expr)]  # no docstring
                if len(body) == 1 and isinstance(body[0], ast.Raise):
                    exc = body[0].exc
                    name = exc.func if isinstance(exc, ast.Call) else exc
                    if isinstance(name, ast.Name) and name.id == "NotImplementedError":
                        bad.append(f"{p.name}:{node.lineno} {node.name}")
    assert not bad, f"stub methods in runner/: {bad}"


def test_policies_are_called_from_one_place():
    """``policy.compute_actions`` is called in ``runner/acting.py`` only; everything else
    in runner/ acts through ``act``."""
    calls = []
    for p in _modules(RUNNER):
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "compute_actions"
            ):
                target = ast.unparse(node.func.value)
                if target != "self._inference":  # the runner's own inference API
                    calls.append(f"{p.name}:{node.lineno} {target}.compute_actions")
    assert calls and all(c.startswith("acting.py:") for c in calls), calls


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (> {MAX_LINES})"
