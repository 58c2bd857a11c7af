"""Reading what ``export_onnx`` wrote, without torch: the interface in the metadata."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from rlconnect.errors import CheckpointError

__all__ = ["describe_onnx_file", "read_interface"]

METADATA_KEY = "rlconnect"
"""The ``metadata_props`` key holding the model's interface as JSON."""


def read_interface(model: Any, source: str) -> dict[str, Any]:
    """The interface JSON of a loaded ONNX ``model``; CheckpointError when it has none."""
    meta = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in meta:
        raise CheckpointError(f"{source!r} is an ONNX model without rlconnect metadata")
    try:
        interface = json.loads(meta[METADATA_KEY])
    except ValueError:
        raise CheckpointError(f"{source!r}: its rlconnect metadata is not JSON") from None
    if not isinstance(interface, dict):
        raise CheckpointError(f"{source!r}: its rlconnect metadata is not an object")
    return interface


def describe_onnx_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An exported ONNX model for people: size, digest, opset, inputs and outputs (initial
    state values summarised), spaces and pipelines, from its metadata."""
    import onnx

    source = os.fspath(path)
    with open(source, "rb") as f:
        data = f.read()
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # a protobuf parser: any failure means a damaged file
        raise CheckpointError(f"cannot load ONNX model {source!r}: {exc}") from None
    interface = read_interface(model, source)

    def entry(e: Any) -> Any:
        text = json.dumps(e.get("initial")) if isinstance(e, dict) else ""
        if len(text) > 120:  # a frame stack's zeros: say how big, not every value
            e = {**e, "initial": f"{len(text):,} characters of JSON"}
        return e

    return {
        "file": source,
        "format": "ONNX (rlconnect.export_onnx)",
        "size": f"{len(data):,} bytes",
        "sha256": hashlib.sha256(data).hexdigest(),
        "opset": [f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import],
        **{k: v for k, v in interface.items() if k not in ("inputs", "outputs")},
        "inputs": [entry(e) for e in interface.get("inputs", [])],
        "outputs": [entry(e) for e in interface.get("outputs", [])],
    }
