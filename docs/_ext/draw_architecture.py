"""Draw docs/img/architecture.svg from the package's own imports.

Each subpackage of ``src/rlconnect`` sits one row above the highest package it imports
(longest-path layering of the import graph), so the picture shows the layers as the code
has them, not as someone remembers them; ``tests/test_docs.py`` redraws it and fails when
the committed file differs (run this script to update it):

    python docs/_ext/draw_architecture.py            # rewrite docs/img/architecture.svg
    python docs/_ext/draw_architecture.py --check    # exit 1 if it is out of date

Below the layers, the three shapes one poll passes through (``POLL``), the same whether
the columns are numpy arrays or torch tensors.
"""

from __future__ import annotations

import argparse
import ast
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rlconnect"
OUT = ROOT / "docs" / "img" / "architecture.svg"

#: what each package is for, one short line under its name
ROLES = {
    "batches": "SampleBatch, columns",
    "spaces": "flatten, JSON codec",
    "errors": "named errors",
    "policy": "Policy, torch policies",
    "episodes": "episode bookkeeping",
    "collectors": "rows into batches",
    "loggers": "JSONL, CSV, TensorBoard",
    "interop": "TorchRL, SB3",
    "connectors": "agent, action, learner",
    "envs": "adapters; external/",
    "checkpoints": "every file format",
    "checker": "check_pipeline",
    "deploy": "policy files, ONNX",
    "runner": "EnvRunner, the poll",
    "offline": "Parquet in and out",
    "distributed": "RunnerGroup on Ray",
    "serve": "policy server, client",
    "cli": "the rlconnect command",
}
#: the poll's three shapes: name, what it holds
POLL = [
    ("the env's rows", "obs, rewards, ends, ids (facts derived on read)"),
    ("what the kernel adds", "done, firsts, trajectory, agent, policy"),
    ("per policy", "its rows, pipeline data, policy outputs"),
]


def imports() -> dict[str, set[str]]:
    """Each subpackage's (and ``errors.py``'s) imports of the others; the top ``__init__``,
    ``testing.py`` (helpers for users' tests) and private modules are left out."""
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    graph: dict[str, set[str]] = {name: set() for name in [*packages, "errors"]}
    for name in graph:
        files = [PACKAGE / "errors.py"] if name == "errors" else (PACKAGE / name).rglob("*.py")
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules = [node.module]
                elif isinstance(node, ast.Import):
                    modules = [a.name for a in node.names]
                else:
                    continue
                for module in modules:
                    parts = module.split(".")
                    if parts[0] == "rlconnect" and len(parts) > 1 and parts[1] in graph:
                        graph[name].add(parts[1])
        graph[name].discard(name)
    return graph


def layers(graph: dict[str, set[str]]) -> list[list[str]]:
    """Packages by row, bottom row first: a package's row is one above its highest import."""
    row: dict[str, int] = {}

    def place(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            raise ValueError(f"import cycle: {' -> '.join((*path, name))}")
        if name not in row:
            row[name] = 1 + max((place(d, (*path, name)) for d in graph[name]), default=-1)
        return row[name]

    for name in graph:
        place(name, ())
    out: list[list[str]] = [[] for _ in range(max(row.values()) + 1)]
    for name in sorted(graph):
        out[row[name]].append(name)
    return out


def _box(x: float, y: float, w: float, h: float, cls: str) -> str:
    return f'  <rect class="{cls}" x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="4"/>'


def _text(x: float, y: float, text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'  <text x="{x:g}" y="{y:g}" text-anchor="middle"{attr}>{escape(text)}</text>'


def draw(rows: list[list[str]]) -> str:
    """The SVG text: the rows top to bottom, then the poll's shapes."""
    box_w, box_h, gap, left = 150, 44, 12, 90
    width = left + max(len(r) for r in rows) * (box_w + gap) + gap
    body, y = [], 40
    for level in reversed(range(len(rows))):
        body.append(f'  <text x="10" y="{y + 27}" class="layer">layer {level}</text>')
        for i, name in enumerate(rows[level]):
            x = left + i * (box_w + gap)
            body.append(_box(x, y, box_w, box_h, "pkg"))
            label = name if name == "errors" else f"{name}/"  # (errors is one module)
            body.append(_text(x + box_w / 2, y + 19, label, "name"))
            body.append(_text(x + box_w / 2, y + 35, ROLES.get(name, ""), "role"))
        y += box_h + gap
    y += 24
    body.append(
        f'  <text x="10" y="{y}" class="head">One poll, three shapes '
        "(numpy arrays or torch tensors on one device)</text>"
    )
    y += 12
    shape_w = (width - 20 - 2 * 30) / 3
    for i, (name, holds) in enumerate(POLL):
        x = 10 + i * (shape_w + 30)
        body.append(_box(x, y, shape_w, 52, "shape"))
        body.append(_text(x + shape_w / 2, y + 21, name, "name"))
        body.append(_text(x + shape_w / 2, y + 39, holds, "role"))
        if i < len(POLL) - 1:
            ax = x + shape_w + 4
            body.append(f'  <path d="M{ax:g},{y + 26} h18 l-6,-5 m6,5 l-6,5" class="arrow"/>')
    height = y + 52 + 10
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="Helvetica, Arial, sans-serif" '
        'font-size="13">',
        "  <title>rlconnect's packages in layers, and the three shapes of one poll</title>",
        "  <desc>Each package imports only packages in rows below it. Drawn from the "
        "package's imports by docs/_ext/draw_architecture.py.</desc>",
        "  <style>.pkg{fill:#e8eef7;stroke:#5a7bb5}.shape{fill:#fdf1d6;stroke:#c08a00}"
        ".name{font-weight:bold}.role{fill:#444;font-size:11px}"
        ".layer{fill:#666;font-style:italic}.head{font-weight:bold}"
        ".arrow{fill:none;stroke:#444;stroke-width:2}</style>",
        '  <text x="10" y="22" class="head">Packages: each imports only the rows below it</text>',
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"


def main() -> int:
    """Write the picture, or with ``--check`` say whether the committed one is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if out of date")
    args = parser.parse_args()
    svg = draw(layers(imports()))
    if args.check:
        current = OUT.read_text() if OUT.is_file() else ""
        if current != svg:
            print(f"{OUT} is out of date: run python docs/_ext/draw_architecture.py")
            return 1
        return 0
    OUT.write_text(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
