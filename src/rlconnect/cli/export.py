"""``rlconnect export``: a run folder's or checkpoint's policy as one deployable file.

    rlconnect export RUN_OR_CHECKPOINT --out FILE [--onnx FILE] [--policy ID] [--import MODULE]

writes ``rc.export_policy``'s file to ``--out`` (read it back with ``rc.load_policy``) and,
with ``--onnx``, the ONNX model of ``rc.export_onnx``. ``--import MODULE`` (repeatable)
first imports the module that registers a policy kind or connector of your own. A source
that is neither a run folder nor a checkpoint, an unknown ``--policy``, an output folder
that does not exist or an unregistered kind is a usage error (exit 2, one line).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from rlconnect.cli.errors import UsageError
from rlconnect.cli.imports import add_import_option

__all__ = ["add_export_parser", "cmd_export"]


def add_export_parser(sub: Any) -> None:
    """Add the ``export`` command to the subparsers ``sub``."""
    e = sub.add_parser(
        "export",
        help="write a run's or checkpoint's policy as one file (and an ONNX model)",
        description="Export one policy of a run folder (rlconnect sample --out) or a runner "
        "checkpoint: its pipelines with frozen statistics, kind, config and weights, in one "
        "file for rc.load_policy; --onnx also writes an ONNX model (the onnx extra).",
    )
    e.add_argument("source", metavar="RUN_OR_CHECKPOINT")
    e.add_argument("--out", metavar="FILE", required=True, help="the policy file to write")
    e.add_argument("--onnx", metavar="FILE", help="also write an ONNX model here")
    e.add_argument("--policy", metavar="ID", default="default_policy", help="(default_policy)")
    add_import_option(e)
    e.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    e.set_defaults(func=cmd_export)


def _check_target(path: str, flag: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path!r} is a folder; give a file name")
    if not target.resolve().parent.is_dir():
        raise UsageError(f"{flag} {path!r}: folder {str(target.resolve().parent)!r} does not exist")


def _source(path: str) -> str:
    from rlconnect.deploy.sources import find_checkpoint

    try:
        return find_checkpoint(path)
    except FileNotFoundError as exc:
        here = ""
        if os.path.isdir(path):
            names = sorted(os.listdir(path))[:8]
            here = f"; it holds {names}" if names else "; it is empty"
        raise UsageError(f"{exc}{here}") from None


def _policy_ids(checkpoint: str) -> list[str]:
    from rlconnect.checkpoints.runner_format import read_manifest

    return [p["id"] for p in read_manifest(checkpoint)["policies"]]


def cmd_export(args: argparse.Namespace) -> int:
    """Export the policy; print what was written."""
    from rlconnect.deploy import export_onnx, export_policy

    checkpoint = _source(args.source)
    ids = _policy_ids(checkpoint)
    if args.policy not in ids:
        raise UsageError(f"--policy {args.policy!r}: {args.source!r} holds policies {ids}")
    _check_target(args.out, "--out")
    if args.onnx:
        _check_target(args.onnx, "--onnx")
        missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:
            raise UsageError(f"--onnx needs {missing}: pip install 'rlconnect[onnx]'")
    # one command, one outcome: the policy file is written aside and put in place only
    # once the ONNX model (if asked) is written too, so a failed export leaves neither
    staged = f"{args.out}.partial-{os.getpid()}"
    try:
        size = export_policy(checkpoint, staged, policy_id=args.policy)
        if args.onnx:
            export_onnx(checkpoint, args.onnx, policy_id=args.policy)
        os.replace(staged, args.out)
    finally:
        with contextlib.suppress(OSError):
            os.remove(staged)
    print(f"wrote {args.out} ({size:,} bytes): policy {args.policy!r} with its pipelines")
    if args.onnx:
        print(f"wrote {args.onnx} ({os.path.getsize(args.onnx):,} bytes): ONNX model")
    return 0
