"""Reading a batch file's structure back into batches, checking every field on the way.

The structure is the JSON that ``rlconnect.offline.batch_files`` describes, already
parsed and its arrays attached (``rlconnect.checkpoints.container.load_nest``). Anything
``encode_batch`` cannot have produced raises :class:`Malformed` naming where it is.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from rlconnect.batches import MultiAgentBatch, SampleBatch
from rlconnect.offline._common import Malformed, expect, name_value_pairs
from rlconnect.offline.json_values import MAX_JSON_DEPTH

__all__ = ["RAW_DTYPE_RE", "decode_structure"]

RAW_DTYPE_RE = re.compile(r"^[<>|=][a-zA-Z]\d+(\[\w+\])?$")
"""``dtype.str`` of the dtypes stored as raw bytes (no objects, no fields)."""


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    expect(isinstance(obj, dict), f"{where} is not an object")
    expect(key in obj, f"{where} lacks {key!r}")
    value = obj[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is int)
    expect(ok, f"{where}.{key} has the wrong type ({type(value).__name__})")
    return value


def decode_structure(obj: Any) -> SampleBatch | MultiAgentBatch:
    """The batch a file's structure describes."""
    kind = _field(obj, "kind", str, "the structure")
    _field(obj, "index", int, "the structure")
    if kind == "SampleBatch":
        return _decode_batch(_field(obj, "batch", dict, "the structure"), "batch")
    if kind == "MultiAgentBatch":
        env_steps = _field(obj, "env_steps", int, "the structure")
        expect(env_steps >= 0, "env_steps is negative")
        pairs = name_value_pairs(
            _field(obj, "policy_batches", list, "the structure"), "policy_batches", unique=True
        )
        return MultiAgentBatch(
            {pid: _decode_batch(b, f"policy batch {pid!r}") for pid, b in pairs}, env_steps
        )
    raise Malformed(f"unknown batch kind {kind[:40]!r}")


def _decode_batch(obj: Any, where: str) -> SampleBatch:
    count = _field(obj, "count", int, where)
    meta_text = _field(obj, "meta", str, where)
    try:
        meta = json.loads(meta_text)
    except (ValueError, RecursionError):
        raise Malformed(f"{where}: meta is not valid JSON") from None
    expect(isinstance(meta, dict), f"{where}: meta is not a JSON object")
    pairs = name_value_pairs(_field(obj, "columns", list, where), f"{where} columns", unique=True)
    columns = {name: _decode_column(col, f"{where} column {name!r}", 0) for name, col in pairs}
    try:
        batch = SampleBatch(columns, meta=meta)
    except (ValueError, TypeError) as exc:
        raise Malformed(f"{where}: {exc}") from None
    expect(len(batch) == count, f"{where}: holds {len(batch)} rows, not {count}")
    return batch


def _decode_column(obj: Any, where: str, depth: int) -> Any:
    expect(depth <= MAX_JSON_DEPTH, f"{where}: nested too deeply")
    node = _field(obj, "node", str, where)
    if node == "dict":
        items = name_value_pairs(_field(obj, "items", list, where), where, unique=True)
        return {k: _decode_column(v, f"{where}/{k}", depth + 1) for k, v in items}
    if node == "tuple":
        items = _field(obj, "items", list, where)
        return tuple(_decode_column(v, f"{where}/{i}", depth + 1) for i, v in enumerate(items))
    shape_list = _field(obj, "shape", list, where)
    expect(
        len(shape_list) >= 1
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape_list),
        f"{where}: malformed shape",
    )
    shape = tuple(shape_list)
    data = _field(obj, "data", np.ndarray, where)
    if node == "array":
        dtype = _field(obj, "dtype", str, where)
        expect(data.dtype.name == dtype, f"{where}: stored as {data.dtype.name}, not {dtype}")
        expect(data.shape == shape, f"{where}: stored with shape {data.shape}, not {shape}")
        return data
    expect(data.dtype == np.uint8 and data.ndim == 1, f"{where}: data is not a byte array")
    if node == "raw":
        dtype_str = _field(obj, "dtype", str, where)
        expect(bool(RAW_DTYPE_RE.match(dtype_str)), f"{where}: malformed dtype {dtype_str[:20]!r}")
        try:
            dt = np.dtype(dtype_str)
        except (TypeError, ValueError):
            raise Malformed(f"{where}: unknown dtype {dtype_str!r}") from None
        expect(
            not dt.hasobject and dt.fields is None and dt.itemsize > 0,
            f"{where}: dtype {dtype_str!r} is not allowed",
        )
        expect(
            data.size == math.prod(shape) * dt.itemsize,
            f"{where}: {data.size} bytes do not make an array of {dt} and shape {shape}",
        )
        return data.view(dt).reshape(shape)
    if node == "json":
        try:
            values = json.loads(data.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise Malformed(f"{where}: the stored JSON text is damaged") from None
        expect(
            isinstance(values, list) and len(values) == math.prod(shape),
            f"{where}: the stored JSON is not a list of {math.prod(shape)} values",
        )
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            out[i] = v
        return out.reshape(shape)
    raise Malformed(f"{where}: unknown node {node[:40]!r}")
