"""``rlconnect inspect``: describe a saved pipeline, batch files, a checkpoint or a run
folder as JSON values, and render them as indented text."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.checkpoints.files import open_regular_file, read_regular_file
from rlconnect.checkpoints.formats import FORMAT_KEY, VERSION_KEY, FileFormat
from rlconnect.checkpoints.runner_format import MAX_MANIFEST_BYTES
from rlconnect.cli.errors import UsageError
from rlconnect.errors import CheckpointError

_SAME = object()  # a saved config value equal to its default


def peek_format(path: str) -> tuple[str, str] | None:
    """``(format, version)`` from an rlconnect container file's header, or None if the
    file is not one (nothing but the header is read or parsed); ``CheckpointError`` for a
    folder, FIFO or device (``checkpoints.files``)."""
    with open_regular_file(path) as (fd, _), os.fdopen(fd, "rb", closefd=False) as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = int.from_bytes(head, "little")
        if n > 100_000_000:
            return None
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        meta = header["__metadata__"]
        return str(meta[FORMAT_KEY]), str(meta.get(VERSION_KEY, "?"))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return None


def _describe_pipeline(path: str) -> dict[str, Any]:
    from rlconnect.checkpoints.pipelines import describe_pipeline_file

    return describe_pipeline_file(path)


def _describe_container(path: str, fmt: tuple[str, str]) -> dict[str, Any]:
    """Any other rlconnect container (e.g. policy weights), verified: its structure with
    arrays shown by dtype and shape, and the number of values it holds."""
    import tree

    from rlconnect.checkpoints import load_nest

    if not fmt[1].isdecimal() or len(fmt[1]) > 9:
        raise CheckpointError(f"cannot load {path!r}: malformed format version {fmt[1][:20]!r}")
    _, nest = load_nest(path, FileFormat(fmt[0], int(fmt[1])))
    sizes: list[int] = []

    def show(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            sizes.append(int(leaf.size))
            return f"{leaf.dtype}{list(leaf.shape)}"
        return leaf

    content = tree.map_structure(show, nest)
    return {
        "file": path,
        "format": f"{fmt[0]} v{fmt[1]}",
        "values": sum(sizes),
        "arrays": len(sizes),
        "content": content,
    }


def _add_std(desc: dict[str, Any]) -> dict[str, Any]:
    """Pipelines: next to running ``count`` / ``mean`` / ``m2`` statistics, show ``std``."""
    for member in desc.get("members", []):
        state = member.get("params", {}).get("__state__")
        if not isinstance(state, dict) or not {"count", "m2"} <= set(state):
            continue
        try:
            count = float(state["count"]["values"][0])
            m2 = state["m2"]["values"]
            std = [math.sqrt(v / count) if count > 0 else 0.0 for v in m2 if v != "..."]
            state["std"] = {"array": state["m2"]["array"], "values": std + m2[len(std) :]}
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return desc


def _file_status(target: Path, digest: str, size: Any) -> str:
    """``"sha256 ok"`` or the damage, worded as a checkpoint restore words it."""
    import hashlib

    from rlconnect.checkpoints.damage import DIGEST_MISMATCH, size_damage

    try:
        data = read_regular_file(target, fail=CheckpointError)
    except CheckpointError as exc:  # a FIFO, a device, a folder: named, never read
        return str(exc)
    if isinstance(size, int) and not isinstance(size, bool) and len(data) != size:
        return size_damage(len(data), size)
    return "sha256 ok" if hashlib.sha256(data).hexdigest() == digest else DIGEST_MISMATCH


def _verify_manifest_files(folder: Path, manifest: Any) -> dict[str, str]:
    """Every ``{"path": ..., "sha256": ...}`` entry of the manifest, checked on disk."""
    out: dict[str, str] = {}
    stack = [manifest]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            path, digest = node.get("path"), node.get("sha256")
            if isinstance(path, str) and isinstance(digest, str):
                try:
                    target = (folder / path).resolve()
                    inside = folder.resolve() in target.parents
                    present = inside and target.exists()
                except (ValueError, OSError):  # a NUL byte, a name too long ...
                    inside = present = False
                if not inside:
                    out[path] = "BAD PATH (outside the checkpoint)"
                elif not present:
                    out[path] = "MISSING"
                else:
                    out[path] = _file_status(target, digest, node.get("size"))
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return dict(sorted(out.items()))


def _describe_file(path: str) -> dict[str, Any]:
    from rlconnect.checkpoints.formats import BATCH_FILE, PIPELINE_FILE, POLICY_FILE
    from rlconnect.deploy.policy_file import describe_policy_file
    from rlconnect.offline import summarize_batches

    fmt = peek_format(path)
    if fmt is None and path.endswith(".onnx"):
        from rlconnect.deploy.onnx_file import describe_onnx_file

        return {"onnx": describe_onnx_file(path)}
    if fmt is None:
        raise CheckpointError(
            f"cannot load {path!r}: not an rlconnect file (no rlconnect header; damaged?)"
        )
    if fmt[0] == PIPELINE_FILE.name:
        return {"pipeline": _add_std(_describe_pipeline(path))}
    if fmt[0] == BATCH_FILE.name:
        return {"batches": summarize_batches(path)}
    if fmt[0] == POLICY_FILE.name:
        return {"policy": describe_policy_file(path)}
    return {"file": _describe_container(path, fmt)}


def _describe_checkpoint(folder: Path) -> dict[str, Any]:
    """A checkpoint folder: its manifest and every file in it, pipelines in full."""
    from rlconnect.checkpoints.formats import PIPELINE_FILE
    from rlconnect.errors import UnknownConnectorError

    manifest_path = folder / "manifest.json"
    raw = read_regular_file(manifest_path, max_bytes=MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(
            f"cannot load {str(manifest_path)!r}: not valid JSON ({exc})"
        ) from None
    shown = dict(manifest) if isinstance(manifest, dict) else manifest
    if isinstance(shown, dict) and isinstance(shown.get("config"), dict):
        shown["config"] = _non_default_config(shown["config"]) or "defaults"
    out: dict[str, Any] = {"folder": str(folder), "manifest": shown, "files": {}}
    out["integrity"] = _verify_manifest_files(folder, manifest) or "no checksums in the manifest"
    problems: list[str] = []
    checked = out["integrity"] if isinstance(out["integrity"], dict) else {}

    def integrity_ok(rel: str) -> bool:
        return checked.get(rel, "sha256 ok") == "sha256 ok"

    real_folder = folder.resolve()
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name.startswith(".") or p == manifest_path:
            continue
        rel = str(p.relative_to(folder))
        if real_folder not in p.resolve().parents:  # a symlink: never read files elsewhere
            out["files"][rel] = "BAD PATH (links outside the checkpoint; not read)"
            problems.append(f"{rel} (links outside the checkpoint)")
            continue
        fmt = peek_format(str(p))
        try:
            if fmt is None:
                out["files"][rel] = {"size_bytes": p.stat().st_size}
                continue
            desc = (
                _add_std(_describe_pipeline(str(p)))
                if fmt[0] == PIPELINE_FILE.name
                else _describe_container(str(p), fmt)
            )
            desc.pop("file", None)
            out["files"][rel] = desc
        except (CheckpointError, UnknownConnectorError) as exc:
            out["files"][rel] = f"DAMAGED: {exc}"
            if integrity_ok(rel):  # else the manifest's check below says what is wrong
                problems.append(f"{rel} ({exc})")
    integrity = out["integrity"]
    if isinstance(integrity, dict):
        problems.extend(f"{k}: {v}" for k, v in integrity.items() if v != "sha256 ok")
    if problems:
        out["problems"] = problems
    return out


def describe_path(path: str) -> dict[str, Any]:
    """What ``rlconnect inspect`` shows, as JSON values.

    Raises UsageError for a missing path or a folder holding nothing rlconnect wrote,
    CheckpointError for a damaged file.
    """
    from rlconnect.offline import list_batch_files, summarize_batches

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file or folder: {path!r}")
    if not p.is_dir():
        with open_regular_file(p):  # a FIFO or a device is refused unread
            pass
    if p.is_file():
        if p.name == "manifest.json":
            return {"checkpoint": _describe_checkpoint(p.parent)}
        from rlconnect.offline.reader import is_parquet

        if is_parquet(path):
            return {"batches": summarize_batches(path)}
        return _describe_file(path)
    out: dict[str, Any] = {}
    if (p / "run.json").is_file():
        out["run"] = _describe_run(p / "run.json")
    if list_batch_files(p):
        out["batches"] = summarize_batches(p)
    for candidate in (p, p / "checkpoint"):
        if (candidate / "manifest.json").exists():  # (a FIFO there is refused)
            out["checkpoint"] = _describe_checkpoint(candidate)
            break
    if not out:
        pipelines = [
            f
            for f in sorted(p.iterdir())
            if f.is_file() and (f.suffix == ".onnx" or peek_format(str(f)))
        ]
        for f in pipelines:
            out[f.name] = _describe_file(str(f))
    if not out:
        raise UsageError(f"{path!r} holds no batch files, checkpoint, or saved pipelines to show")
    return out


def _non_default_config(config: dict[str, Any]) -> dict[str, Any]:
    """The RunnerConfig values (as in ``to_dict()``) that differ from the defaults, both
    compared as JSON values (a saved list equals a default tuple); of a table such as
    ``offline`` (an ``OfflineConfig``), the settings that differ from its defaults."""
    from rlconnect.offline import OfflineConfig
    from rlconnect.offline.json_values import to_json_value
    from rlconnect.runner.config import RunnerConfig

    defaults = to_json_value(RunnerConfig(offline=OfflineConfig()).to_dict())

    def differ(value: Any, default: Any) -> Any:
        if value is None and isinstance(default, dict):  # no section: its defaults
            return _SAME
        if isinstance(value, dict) and isinstance(default, dict):
            inner = {k: differ(v, default.get(k, _SAME)) for k, v in value.items()}
            inner = {k: v for k, v in inner.items() if v is not _SAME}
            return inner or _SAME
        return _SAME if to_json_value(value) == default else value

    out = {k: differ(v, defaults.get(k, _SAME)) for k, v in config.items()}
    return {k: v for k, v in out.items() if v is not _SAME}


def _describe_run(path: Path) -> Any:
    """run.json of ``sample --out``: settings, non-default runner config, summary."""
    try:
        doc = json.loads(read_regular_file(path, max_bytes=MAX_MANIFEST_BYTES).decode("utf-8"))
        settings = dict(doc["settings"])
        config = settings.pop("runner_config")
        return {"settings": {**settings, **_non_default_config(config)}, "summary": doc["summary"]}
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, CheckpointError):
        return f"{path.name} is damaged"


def _is_array_summary(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"array", "values"}


def render(value: Any, indent: int = 0) -> list[str]:
    """Nested JSON values as indented ``key: value`` lines; arrays on one line."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if _is_array_summary(v):
                lines.append(f"{pad}{k}: {v['array']} {_inline(v['values'])}")
            elif (isinstance(v, dict) and v) or (
                isinstance(v, list) and v and not all(_scalar(x) for x in v)
            ):
                lines.append(f"{pad}{k}:")
                lines.extend(render(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_inline(v)}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict | list) and v and not _is_array_summary(v):
                lines.append(f"{pad}- [{i}]")
                lines.extend(render(v, indent + 1))
            else:
                lines.append(f"{pad}- {_inline(v)}")
    else:
        lines.append(f"{pad}{_inline(value)}")
    return lines


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _inline(v: Any) -> str:
    if _is_array_summary(v):
        return f"{v['array']} {_inline(v['values'])}"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{}" if not v else json.dumps(v)
    return str(v)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a saved pipeline, batch files, a checkpoint or a run folder."""
    from rlconnect.errors import UnknownConnectorError

    try:
        desc = describe_path(args.path)
    except (CheckpointError, UnknownConnectorError) as exc:
        print(f"rlconnect inspect: {exc}", file=sys.stderr)
        return 1
    except PermissionError as exc:
        raise UsageError(f"cannot read {args.path!r}: {exc.strerror}") from None
    problems = desc.get("checkpoint", {}).get("problems")
    if args.json:
        print(json.dumps(desc, indent=2, default=str))
    elif problems:  # one line: what is damaged (--json shows what is intact too)
        print(
            f"rlconnect inspect: damaged checkpoint: {'; '.join(problems)} "
            "(--json shows every file)",
            file=sys.stderr,
        )
        return 1
    else:
        print("\n".join(render(desc)))
    if problems:
        print(f"rlconnect inspect: damaged checkpoint: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0
