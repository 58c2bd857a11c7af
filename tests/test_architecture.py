"""The shape the code must keep (docs: ARCHITECTURE): layers, one step, short functions.

Each check reads the package's source with ``ast``; a failure names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlconnect"
RUNNER = PACKAGE / "runner"
#: a function in these folders reads on one screen
SHORT_FUNCTION_FOLDERS = ("runner", "envs")
MAX_FUNCTION_LINES = 60

#: layers above the runner: it never imports them, not even inside a function
UPPER_LAYERS = (
    "rlconnect.offline",
    "rlconnect.serve",
    "rlconnect.distributed",
    "rlconnect.cli",
    "rlconnect.deploy",
)
#: what deploy/ may read of the runner: a checkpoint's files, never its loop
RUNNER_FILES_FOR_DEPLOY = ("rlconnect.runner.checkpoint_load", "rlconnect.runner.checkpoint_format")


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


def test_deploy_reads_only_the_runners_checkpoint_files():
    """A deployed policy is built on checkpoints, connectors and policies, not the loop."""
    deploy = RUNNER.parent / "deploy"
    bad = [
        f"{p.name}:{line} {module}"
        for p in _modules(deploy)
        for line, module, _ in _imports(p)
        if module.startswith("rlconnect.runner") and module not in RUNNER_FILES_FOR_DEPLOY
    ]
    assert _modules(deploy) and not bad, f"deploy/ imports the runner: {bad}"


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


def _function_lengths(path: Path) -> dict[str, int]:
    """``qualified name -> lines`` (decorators included) of every function in ``path``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out[prefix + child.name] = (child.end_lineno or child.lineno) - first + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return out


def test_functions_read_on_one_screen():
    lengths = {
        f"{p.relative_to(PACKAGE)}:{name}": n
        for folder in SHORT_FUNCTION_FOLDERS
        for p in _modules(PACKAGE / folder)
        for name, n in _function_lengths(p).items()
    }
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
