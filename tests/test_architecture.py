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


def _package_of(module: str) -> str:
    """``rlconnect.envs.external`` -> ``envs``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_package_imports_a_private_name_of_another():
    """A private name is its package's own: serve/ uses what envs/ offers, by public name."""
    bad = []
    for p in _modules(PACKAGE):
        here = _package_of("rlconnect." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts))
        for line, module, names in _imports(p):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if module.startswith("rlconnect.") and _package_of(module) != here and private:
                bad.append(f"{p.relative_to(PACKAGE)}:{line} {module} {private}")
    assert not bad, f"private names imported across packages: {bad}"


HUB_MODULE = PACKAGE / "envs" / "external_hub.py"
#: where code may hold an ExternalEnv's hub by its private name (the env and its adapters)
HUB_HOLDERS = ("external.py", "external_multi_agent.py")


def test_the_episode_hub_keeps_its_lock_and_state():
    """``EpisodeHub`` is a monitor: its attributes are private, and nothing outside its
    module touches its lock or private state; tests and benchmarks use its methods."""
    init = next(
        node
        for node in ast.walk(ast.parse(HUB_MODULE.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.name == "__init__"
        and any(a.arg == "max_concurrent" for a in node.args.args)
    )
    public = [
        ast.unparse(t)
        for node in ast.walk(init)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute) and not t.attr.startswith("_")
    ]
    assert not public, f"EpisodeHub has public attributes: {public}"
    root = PACKAGE.parents[1]
    files = [*_modules(PACKAGE), *_modules(root / "tests"), *_modules(root / "benchmarks")]
    bad = []
    for p in files:
        if p == HUB_MODULE:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = ast.unparse(node.value)
            reaches_in = owner.endswith("hub") and (
                node.attr.startswith("_") or node.attr == "cond"
            )
            if reaches_in or (node.attr == "_hub" and p.name not in HUB_HOLDERS):
                bad.append(f"{p.relative_to(root)}:{node.lineno} {owner}.{node.attr}")
    assert not bad, f"code reaching into the episode hub: {bad}"


def test_the_servers_limits_are_spelled_once():
    """``PolicyServer``'s limits are the fields of ``ServerSettings``: its ``__init__`` takes
    them as keywords into one object and names none of them itself."""
    import attrs

    from rlconnect.serve import ServerSettings

    tree = ast.parse((PACKAGE / "serve" / "server.py").read_text())
    init = next(
        f
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and c.name == "PolicyServer"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    params = {a.arg for a in [*init.args.args, *init.args.kwonlyargs]}
    spelled = sorted(params & set(attrs.fields_dict(ServerSettings)))
    assert not spelled, f"PolicyServer.__init__ spells settings fields again: {spelled}"


def _bodies(path: Path) -> list[tuple[int, str, str]]:
    """``(line, name, body)`` of every function in ``path`` (the body without its
    docstring, as ``ast.dump``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            if len(body) >= 2:  # one statement (a hand-over, a return) may well repeat
                out.append((node.lineno, node.name, ast.dump(ast.Module(body, []))))
    return out


def test_no_function_body_is_written_twice():
    """In the folders that read on one screen, a body of two statements or more is written
    once: what two classes share lives in an object both hold (e.g. ``SubEnvs``)."""
    seen: dict[str, str] = {}
    twice = []
    for folder in SHORT_FUNCTION_FOLDERS:
        for p in _modules(PACKAGE / folder):
            for line, name, body in _bodies(p):
                where = f"{p.relative_to(PACKAGE)}:{line} {name}"
                if body in seen:
                    twice.append(f"{where} repeats {seen[body]}")
                seen.setdefault(body, where)
    assert not twice, twice


def test_a_sub_env_is_rebuilt_in_one_place():
    """The in-process adapters hold a ``SubEnvs`` (envs/sub_envs.py), which alone builds,
    seeds and rebuilds their sub-envs: nothing else names ``rebuild_error`` or keeps a
    restart count per sub-env."""
    envs = PACKAGE / "envs"
    for adapter in ("gym_envs.py", "multi_agent.py"):
        assert "SubEnvs(" in (envs / adapter).read_text(), f"{adapter} holds no SubEnvs"
    bad = [
        f"{p.relative_to(PACKAGE)}:{node.lineno}"
        for p in _modules(envs)
        if p.name != "sub_envs.py"
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Name) and node.id == "rebuild_error"
    ]
    assert not bad, f"sub-envs rebuilt outside envs/sub_envs.py: {bad}"


def test_env_settings_are_declared_once():
    """The env settings are ``EnvSettings``' fields; ``RunnerConfig`` declares each with
    ``env_field(<its name>, ...)`` (default and check from envs/settings.py) and hands
    them on as one object, ``env_settings()``."""
    import attrs

    from rlconnect.envs.settings import EnvSettings
    from rlconnect.runner.config import RunnerConfig

    names = list(attrs.fields_dict(EnvSettings))
    config = ast.parse((RUNNER / "config.py").read_text())
    declared = {
        node.target.id: ast.unparse(node.value)
        for cls in config.body
        if isinstance(cls, ast.ClassDef) and cls.name == "RunnerConfig"
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value
    }
    wrong = [n for n in names if not declared.get(n, "").startswith(f"env_field({n!r}")]
    assert not wrong, f"RunnerConfig fields not declared with env_field: {wrong}"
    defaults = RunnerConfig().env_settings()
    assert defaults == EnvSettings(), "RunnerConfig's env defaults differ from EnvSettings'"


def test_no_function_takes_the_env_settings_one_by_one():
    """Settings travel as one object: no function takes more than four of the env
    settings' names as parameters (an adapter's count, seed, config and index at most)."""
    import attrs

    from rlconnect.envs.settings import EnvSettings

    names = set(attrs.fields_dict(EnvSettings))
    bad = []
    for p in _modules(PACKAGE):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                taken = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} & names
                if len(taken) > 4:
                    bad.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name}{sorted(taken)}")
    assert not bad, f"env settings passed one by one: {bad}"


def test_the_step_kernel_holds_few_attributes():
    """``StepKernel`` holds at most 16 attributes: what one poll needs, not copies of what
    its parts already hold (a timer dict, a collector's log, a config flag)."""
    tree = ast.parse((RUNNER / "kernel.py").read_text())
    kernel = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StepKernel")
    names = {
        node.attr
        for node in ast.walk(kernel)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Store)
    }
    assert len(names) <= 16, f"StepKernel holds {len(names)} attributes: {sorted(names)}"


#: what writes into the collectors: the one write of each kernel's step
COLLECTOR_WRITERS = {
    ("runner/kernel.py", "StepKernel._record"),
    ("runner/tensor_kernel.py", "TensorKernel.step"),
}
#: methods that change what a collector holds (called on something named *collector* or
#: *store*: the group, a policy collector, its store, the env-step log, a tensor store)
_COLLECTOR_MUTATORS = {"add_rows", "record", "write", "add", "append", "keep", "drop", "close"}


def _calls_by_function(path: Path) -> list[tuple[str, ast.Call]]:
    """``(qualified name of the enclosing function, call)`` for every call in ``path``."""
    out: list[tuple[str, ast.Call]] = []

    def visit(node: ast.AST, prefix: str, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.", prefix + child.name)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", where)
            else:
                if isinstance(child, ast.Call):
                    out.append((where, child))
                visit(child, prefix, where)

    visit(ast.parse(path.read_text()), "", "<module>")
    return out


def test_one_place_per_step_writes_into_the_collectors():
    """Rows, episode ends and env steps reach the collectors through one call per step
    (the kernel's ``_record``): episode bookkeeping returns what ended (``EpisodeEnds``)
    instead of writing rows itself."""
    writers = set()
    for p in _modules(PACKAGE):
        if p.parent.name == "collectors":
            continue
        for where, call in _calls_by_function(p):
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in _COLLECTOR_MUTATORS:
                target = ast.unparse(func.value).lower()
                if "collector" in target or "store" in target:
                    writers.add((str(p.relative_to(PACKAGE)), where))
    assert writers == COLLECTOR_WRITERS, sorted(writers)
    record_calls = [
        where
        for where, call in _calls_by_function(RUNNER / "kernel.py")
        if isinstance(call.func, ast.Attribute) and call.func.attr == "_record"
    ]
    assert record_calls == ["StepKernel.step"] * 2, record_calls  # (a poll with rows or not)


MAX_INSTANCE_ATTRIBUTES = 16
#: classes allowed more, and why
MANY_ATTRIBUTES = {
    "runner/runner.py:EnvRunner": "the public facade: it holds the parts it composes",
    "serve/http.py:HttpConnection": "one HTTP/1.1 connection's parser and writer state",
    "serve/http.py:Listener": "a server socket's accept loop, limits and live connections",
    "envs/envpool_env.py:EnvPoolEnv": "the pool, its spaces and its asynchronous-send state",
    "envs/workers/pool.py:WorkerEnvs": "worker processes, their shared blocks and faults",
}


def test_classes_hold_few_attributes():
    """A class holds at most 16 instance attributes (``self.x = ...`` anywhere in it):
    more means it does several things; the few exceptions say why."""
    many = {}
    for p in _modules(PACKAGE):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {
                    n.attr
                    for n in ast.walk(node)
                    if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == "self"
                    and isinstance(n.ctx, ast.Store)
                }
                key = f"{p.relative_to(PACKAGE)}:{node.name}"
                if len(names) > MAX_INSTANCE_ATTRIBUTES and key not in MANY_ATTRIBUTES:
                    many[key] = len(names)
    assert not many, f"classes over {MAX_INSTANCE_ATTRIBUTES} attributes: {many}"


def test_episode_bookkeeping_lives_in_episodes():
    """``episodes/`` owns the tracker, the agent slots and the table of ids, lengths and
    returns; it sits below envs/ and the runner and never touches the collectors."""
    assert not (RUNNER / "bookkeeping.py").exists()
    homes = {"EpisodeTracker", "AgentSlots", "EpisodeTable", "TrajectoryIds", "EpisodeEnds"}
    found = {}
    for p in _modules(PACKAGE):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name in homes:
                found[node.name] = p.parent.name
    assert found == dict.fromkeys(homes, "episodes"), found
    upper = ("rlconnect.envs", "rlconnect.runner", "rlconnect.collectors", "rlconnect.policy")
    bad = [
        f"{p.name}:{line} {module}"
        for p in _modules(PACKAGE / "episodes")
        for line, module, _ in _imports(p)
        if module.startswith(upper)
    ]
    assert not bad, f"episodes/ imports an upper layer: {bad}"
