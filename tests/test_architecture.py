"""The shape the code must keep (docs: ARCHITECTURE): layers, one step, short functions.

Each check reads the package's source with ``ast``; a failure names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rlconnect"
RUNNER = PACKAGE / "runner"
#: every function of the package reads on one screen
MAX_FUNCTION_LINES = 60
#: in these folders no function body of two statements or more is written twice
WRITTEN_ONCE_FOLDERS = ("runner", "envs")

#: layers above the runner: it never imports them, not even inside a function
UPPER_LAYERS = (
    "rlconnect.offline",
    "rlconnect.serve",
    "rlconnect.distributed",
    "rlconnect.cli",
    "rlconnect.deploy",
)


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
    """A deployed policy is built on checkpoints, connectors and policies, not the loop:
    deploy/ reads a runner's checkpoint through checkpoints/ and imports nothing of runner/."""
    deploy = PACKAGE / "deploy"
    imports = [(p, line, module) for p in _modules(deploy) for line, module, _ in _imports(p)]
    bad = [f"{p.name}:{line} {m}" for p, line, m in imports if m.startswith("rlconnect.runner")]
    assert _modules(deploy) and not bad, f"deploy/ imports the runner: {bad}"
    assert any(m == "rlconnect.checkpoints.runner_load" for _, _, m in imports)


def test_checkpoints_sit_below_the_runner():
    """checkpoints/ owns the runner's file format, verification and loading, and is handed
    plain data and objects: it never imports runner/ (nor anything above it)."""
    bad = [
        f"{p.name}:{line} {module}"
        for p in _modules(PACKAGE / "checkpoints")
        for line, module, _ in _imports(p)
        if module.startswith(("rlconnect.runner", *UPPER_LAYERS))
    ]
    assert not bad, f"checkpoints/ imports the runner or a layer above it: {bad}"


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
        for p in _modules(PACKAGE)
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


EXTERNAL = PACKAGE / "envs" / "external"
HUB_MODULE = EXTERNAL / "hub.py"
#: where code may hold an ExternalEnv's hub by its private name (the env and its adapters)
HUB_HOLDERS = (EXTERNAL / "env.py", EXTERNAL / "multi_agent.py")


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
            if reaches_in or (node.attr == "_hub" and p not in HUB_HOLDERS):
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


def _reachable_docstrings(body: list[ast.stmt]) -> list[str]:
    """Docstrings doctest's finder reaches: classes' and functions' defined at module level
    or in a class (and in module-level ``if``/``try``), never a function's inner ones."""
    out = []
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(ast.get_docstring(node, clean=False) or "")
            if isinstance(node, ast.ClassDef):
                out.extend(_reachable_docstrings(node.body))
        elif isinstance(node, (ast.If, ast.Try)):
            handlers = [h.body for h in getattr(node, "handlers", [])]
            for block in (node.body, node.orelse, *handlers):
                out.extend(_reachable_docstrings(block))
    return out


def test_every_docstring_example_is_collected():
    """A ``>>>`` line outside a docstring doctest reaches would never run (tests/test_doctests
    runs every module with one, and counts them again on import)."""
    from test_doctests import MODULES, example_count

    bad, with_examples = [], set()
    for p in _modules(PACKAGE):
        source = p.read_text()
        written = example_count(source)
        if not written:
            continue
        with_examples.add(p)
        tree = ast.parse(source)
        docs = [ast.get_docstring(tree, clean=False) or "", *_reachable_docstrings(tree.body)]
        reached = sum(example_count(d) for d in docs)
        if reached != written:
            bad.append(f"{p.relative_to(PACKAGE)}: {written - reached} of {written} not reached")
    assert not bad, f"examples doctest never runs: {bad}"
    assert with_examples == set(MODULES.values())


EXTERNAL_FACE = "rlconnect.envs.external"


def _names_envs(module: str, names: list[str]) -> bool:
    """An import of ``rlconnect.envs`` or of a module in it (``from rlconnect import envs``)."""
    return module.startswith("rlconnect.envs") or (module == "rlconnect" and "envs" in names)


def test_serve_imports_of_envs_only_the_external_envs_face():
    """serve/ uses envs/ through one module: ``rlconnect.envs.external``, the public face
    of the external env (no module inside it, nothing else of envs/)."""
    bad = [
        f"{p.relative_to(PACKAGE)}:{line} {module} {names}"
        for p in _modules(PACKAGE / "serve")
        for line, module, names in _imports(p)
        if _names_envs(module, names) and module != EXTERNAL_FACE
    ]
    assert _modules(PACKAGE / "serve") and not bad, f"serve/ imports envs/ past the face: {bad}"


def test_nothing_outside_the_external_env_imports_its_inner_modules():
    """The package, its tests, benchmarks and examples import ``rlconnect.envs.external``
    by its face only: its modules are its own parts."""
    root = PACKAGE.parents[1]
    inner = {p.stem for p in _modules(EXTERNAL)} - {"__init__"}
    files = [PACKAGE, root / "tests", root / "benchmarks", root / "examples"]
    bad = [
        f"{p.relative_to(root)}:{line} {module} {names}"
        for folder in files
        for p in _modules(folder)
        if EXTERNAL not in p.parents
        for line, module, names in _imports(p)
        if module.startswith(EXTERNAL_FACE + ".")
        or (module == EXTERNAL_FACE and inner & set(names))
    ]
    assert inner and not bad, f"imports of the external env's inner modules: {bad}"


def test_a_served_request_is_checked_by_the_episode_hub_alone():
    """serve/ hands a request's values to the episode hub, which checks every call once,
    served or an ExternalEnv's own: no module of serve/ calls a check of envs/external
    but deployed.py (a DeployedPolicy's endpoints, which have no hub)."""
    checks = {
        node.name
        for node in ast.parse((EXTERNAL / "checks.py").read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
    }
    bad = [
        f"{p.relative_to(PACKAGE)}:{line} {name}"
        for p in _modules(PACKAGE / "serve")
        if p.name != "deployed.py"
        for line, name in _identifiers(ast.parse(p.read_text()))
        if name in checks
    ]
    assert checks and not bad, f"serve/ checks what the episode hub checks: {bad}"


def _identifiers(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every name, attribute, argument, definition and import in
    ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.arg):
            out.append((node.lineno, node.arg))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.ImportFrom):
            out += [(node.lineno, node.module or ""), *((node.lineno, a.name) for a in node.names)]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


def test_the_external_env_never_holds_the_runner():
    """envs/external/ asks what a served episode needs through the ``ServedInference`` the
    runner attaches (compute actions, drop an episode's state): no name, attribute,
    argument or import there is the runner (``EnvRunner``, ``runner``, ``_runner``,
    ``rlconnect.runner``)."""
    bad = [
        f"{p.relative_to(PACKAGE)}:{line} {name}"
        for p in _modules(EXTERNAL)
        for line, name in _identifiers(ast.parse(p.read_text()))
        if "runner" in name.lower()
    ]
    assert _modules(EXTERNAL) and not bad, f"the external env reaches the runner: {bad}"


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
    """In ``WRITTEN_ONCE_FOLDERS``, a body of two statements or more is written once: what
    two classes share lives in an object both hold (e.g. ``SubEnvs``)."""
    seen: dict[str, str] = {}
    twice = []
    for folder in WRITTEN_ONCE_FOLDERS:
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


FORMATS_MODULE = PACKAGE / "checkpoints" / "formats.py"
#: the header entries of a file format: written and checked by ``FileFormat`` alone
HEADER_KEYS = ("format_version", "version")


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of ``tree`` that are not docstrings."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_the_format_header_is_written_in_one_place():
    """Every file kind (runner checkpoints, weights, policy files, batch files, Parquet
    files, pipeline files) has its ``FileFormat`` record in checkpoints/formats.py, which
    alone writes and checks the format name and version: no other module spells the
    version key, nor builds a header of its own (a dict with ``format`` and a version)."""
    bad = []
    for p in _modules(PACKAGE):
        if p == FORMATS_MODULE:
            continue
        tree = ast.parse(p.read_text())
        where = p.relative_to(PACKAGE)
        bad += [
            f"{where}:{s.lineno} {s.value!r}" for s in _strings(tree) if s.value == "format_version"
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if "format" in keys and keys & set(HEADER_KEYS):
                    bad.append(f"{where}:{node.lineno} a format header of its own")
    assert not bad, f"format headers written outside checkpoints/formats.py: {bad}"
    from rlconnect.checkpoints import formats

    records = [v for v in vars(formats).values() if isinstance(v, formats.FileFormat)]
    assert len({r.name for r in records}) == len(records) >= 6, records


def _top_package_imports(path: Path) -> list[str]:
    """``import rlconnect`` or ``from rlconnect import X`` where X is not a submodule."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno} import {a.name}" for a in node.names if a.name == "rlconnect"]
        elif isinstance(node, ast.ImportFrom) and node.module == "rlconnect" and not node.level:
            names = [a.name for a in node.names]
            out += [
                f"{node.lineno} from rlconnect import {n}"
                for n in names
                if not ((PACKAGE / n).is_dir() or (PACKAGE / f"{n}.py").is_file())
            ]
    return out


def test_no_module_imports_the_top_package():
    """Modules import what they use from the submodule that holds it, never the top
    package (whose import pulls in every subpackage): ``rlconnect.__version__`` lives in
    ``rlconnect._version``, which the build reads too (pyproject's ``tool.hatch.version``)."""
    bad = [
        f"{p.relative_to(PACKAGE)}:{hit}"
        for p in _modules(PACKAGE)
        for hit in _top_package_imports(p)
    ]
    assert not bad, f"modules importing the top package rlconnect: {bad}"
    assignments = [
        f"{p.relative_to(PACKAGE)}:{node.lineno}"
        for p in _modules(PACKAGE)
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
    ]
    assert assignments == ["_version.py:3"], assignments
    pyproject = (PACKAGE.parents[1] / "pyproject.toml").read_text()
    assert 'path = "src/rlconnect/_version.py"' in pyproject
    assert 'dynamic = ["version"]' in pyproject


def _package_graph() -> dict[str, dict[str, str]]:
    """``{package: {imported package: first place}}`` among the subpackages (and
    top-level modules) of rlconnect, for imports anywhere in a module."""
    graph: dict[str, dict[str, str]] = {}
    for p in _modules(PACKAGE):
        rel = p.relative_to(PACKAGE).with_suffix("")
        here = rel.parts[0]
        for line, module, _ in _imports(p):
            parts = module.split(".")
            if parts[0] == "rlconnect" and len(parts) > 1 and parts[1] != here:
                graph.setdefault(here, {}).setdefault(parts[1], f"{rel.as_posix()}.py:{line}")
    graph.pop("__init__", None)  # the public names: it imports everything, by design
    return graph


def _cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_packages():
    """The subpackages import each other in one direction only (e.g. checkpoints/ reads
    connectors/, and the pipeline checker, above both, runs a pipeline through its file),
    counting imports inside functions too."""
    graph = _package_graph()
    assert "checkpoints" in graph.get("checker", {}) and "connectors" in graph["checkpoints"]
    cycles = _cycles(graph)
    shown = [
        " <-> ".join(c)
        + ": "
        + ", ".join(f"{a}->{b} {graph[a][b]}" for a in c for b in c if b in graph.get(a, {}))
        for c in cycles
    ]
    assert not cycles, f"import cycles between packages: {shown}"


def test_offline_settings_are_declared_once():
    """Offline's settings are ``OfflineConfig``'s fields (in ``rlconnect.offline``):
    ``RunnerConfig`` holds one as its ``offline`` section and takes its settings as
    keywords, declaring none of them itself."""
    import attrs

    from rlconnect.offline import OfflineConfig
    from rlconnect.runner.config import RunnerConfig

    names = set(attrs.fields_dict(OfflineConfig))
    assert not names & set(attrs.fields_dict(RunnerConfig))
    assert names <= set(RunnerConfig.keywords())
    assert attrs.fields_dict(RunnerConfig)["offline"].default is None

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
