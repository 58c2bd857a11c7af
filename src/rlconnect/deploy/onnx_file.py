"""Reading what ``export_onnx`` wrote, without torch: the interface in the metadata, and
the digest that proves the model is the one exported.

``metadata_props["rlconnect"]`` holds the interface as JSON, and in it ``"model_sha256"``,
a SHA-256 over the graph (nodes and weights, serialized deterministically), the opsets and
the rest of the interface. rlconnect checks it wherever it reads an ONNX file (``rlconnect
inspect``); a runtime that only runs the model (onnxruntime) reads the interface with
``session.get_modelmeta().custom_metadata_map`` and needs no check.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from rlconnect.checkpoints.files import read_regular_file
from rlconnect.errors import CheckpointError

__all__ = ["DIGEST_KEY", "METADATA_KEY", "describe_onnx_file", "model_digest", "read_onnx_model"]

METADATA_KEY = "rlconnect"
"""The ``metadata_props`` key holding the model's interface as JSON."""

DIGEST_KEY = "model_sha256"
"""The interface's key holding :func:`model_digest` as 64 hex digits."""


def model_digest(model: Any, interface: dict[str, Any]) -> str:
    """SHA-256 over ``model``'s graph (nodes and weights), opsets and ``interface`` (its
    JSON with sorted keys, without the digest itself)."""
    h = hashlib.sha256()
    h.update(model.graph.SerializeToString(deterministic=True))
    for o in model.opset_import:
        h.update(f"\0{o.domain}\0{o.version}".encode())
    rest = {k: v for k, v in interface.items() if k != DIGEST_KEY}
    h.update(b"\0" + json.dumps(rest, sort_keys=True).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _fail(source: str, msg: str) -> CheckpointError:
    return CheckpointError(f"cannot load ONNX model {source!r}: {msg}")


def read_interface(model: Any, source: str) -> dict[str, Any]:
    """The interface of a loaded ONNX ``model`` after checking its digest; CheckpointError
    when it has no rlconnect metadata or was changed after export."""
    from rlconnect.checkpoints.damage import DIGEST_MISMATCH

    meta = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in meta:
        raise _fail(source, "no rlconnect metadata (not written by rc.export_onnx, or truncated)")
    try:
        interface = json.loads(meta[METADATA_KEY])
    except (ValueError, RecursionError):
        raise _fail(source, "its rlconnect metadata is not JSON") from None
    if not isinstance(interface, dict) or not isinstance(interface.get(DIGEST_KEY), str):
        raise _fail(source, f"its rlconnect metadata is not an object with a {DIGEST_KEY!r}")
    if model_digest(model, interface) != interface[DIGEST_KEY]:
        raise _fail(source, DIGEST_MISMATCH)
    problem = _interface_problem(interface)
    if problem is not None:  # a digest anyone can recompute: the shape is checked too
        raise _fail(source, f"its rlconnect interface is malformed: {problem}")
    return interface


def _interface_problem(interface: dict[str, Any]) -> str | None:
    """What is wrong with the shape of an interface (as ``export_onnx`` writes it), or
    None: ``inputs`` and ``outputs`` are lists of objects with a string ``name``, a
    ``shape`` list of ints and strings and a string ``dtype``; the spaces are objects."""
    for key in ("inputs", "outputs"):
        entries = interface.get(key)
        if not isinstance(entries, list):
            return f"{key!r} must be a list, got {type(entries).__name__}"
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                return f"{key}[{i}] must be an object, got {type(e).__name__}"
            shape = e.get("shape")
            if not (
                isinstance(e.get("name"), str)
                and isinstance(e.get("dtype"), str)
                and isinstance(shape, list)
                and all(isinstance(d, int | str) and not isinstance(d, bool) for d in shape)
            ):
                return f"{key}[{i}] needs a string 'name', a 'shape' list and a string 'dtype'"
    for key in ("observation_space", "action_space", "pipelines"):
        if key in interface and not isinstance(interface[key], dict):
            return f"{key!r} must be an object, got {type(interface[key]).__name__}"
    return None


def read_onnx_model(data: bytes, source: str) -> tuple[Any, dict[str, Any]]:
    """``(model, interface)`` of an exported ONNX file's bytes, digest checked."""
    import onnx

    from rlconnect.checkpoints.damage import TRUNCATED_OR_NOT

    if not data:
        raise _fail(source, "the file is empty")
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # a protobuf parser: any failure means a damaged file
        raise _fail(source, f"{TRUNCATED_OR_NOT.format(what='ONNX model')} ({exc})") from None
    return model, read_interface(model, source)


def describe_onnx_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An exported ONNX model for people: size, digests, opset, inputs and outputs (initial
    state values summarised), spaces and pipelines, from its metadata (checked)."""
    source = os.fspath(path)
    data = read_regular_file(source, fail=lambda msg: _fail(source, msg))
    model, interface = read_onnx_model(data, source)

    def entry(e: Any) -> Any:
        text = json.dumps(e.get("initial")) if isinstance(e, dict) else ""
        if len(text) > 120:  # a frame stack's zeros: say how big, not every value
            e = {**e, "initial": f"{len(text):,} characters of JSON"}
        return e

    return {
        "file": source,
        "format": "ONNX (rlconnect.export_onnx)",
        "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "model_digest": "ok (graph, weights and interface as exported)",
        "opset": [f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import],
        **{k: v for k, v in interface.items() if k not in ("inputs", "outputs")},
        "inputs": [entry(e) for e in interface.get("inputs", [])],
        "outputs": [entry(e) for e in interface.get("outputs", [])],
    }
