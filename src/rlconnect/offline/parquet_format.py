"""The ``rlconnect.parquet`` format: batch columns <-> Arrow arrays, and the file metadata.

One row per transition. A batch column that is a plain array becomes one Parquet column of
the same name; a nested column (Dict / Tuple observations) is flattened into one Parquet
column per leaf, named by its path joined with ``/`` (``obs/pos``, ``obs/0``). How each
leaf is stored (its *encoding*):

============  ===========================================  ===========================
encoding      used for                                     Parquet / Arrow type
============  ===========================================  ===========================
``scalar``    one bool / int / uint / float value per row  the matching primitive type
``list``      a small array per row (<= 256 numbers)       ``fixed_size_list<T>[k]``
``tensor``    larger arrays per row (images), and any      ``fixed_size_binary[w]``:
              other fixed-size dtype (complex, strings,    the row's bytes in numpy
              non-native byte order)                       C order
``json``      object columns (``infos``)                   ``string``: one JSON value
============  ===========================================  ===========================

Two more columns, ``policy_id`` and ``agent_id`` (strings), say whose row it is; readers
that only want the experience ignore them. The file's key-value metadata holds, under the
key ``rlconnect``, the JSON document described in ``rlconnect.offline.parquet_writer``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from rlconnect.offline._common import (
    AGENT_ID_COLUMN,
    METADATA_KEY,
    POLICY_ID_COLUMN,
    Malformed,
    OfflineDataError,
    expect,
)
from rlconnect.offline.json_values import to_json_value

__all__ = [
    "AGENT_ID_COLUMN",
    "LIST_MAX_ELEMENTS",
    "METADATA_KEY",
    "POLICY_ID_COLUMN",
    "OfflineDataError",
    "decode_leaf",
    "encode_column",
]

LIST_MAX_ELEMENTS = 256
"""Rows with at most this many numbers are stored as ``fixed_size_list``, more as bytes."""

_PRIMITIVE: dict[str, pa.DataType] = {
    np.dtype(name).str: typ
    for name, typ in [
        ("bool", pa.bool_()),
        ("int8", pa.int8()),
        ("int16", pa.int16()),
        ("int32", pa.int32()),
        ("int64", pa.int64()),
        ("uint8", pa.uint8()),
        ("uint16", pa.uint16()),
        ("uint32", pa.uint32()),
        ("uint64", pa.uint64()),
        ("float16", pa.float16()),
        ("float32", pa.float32()),
        ("float64", pa.float64()),
    ]
}
_MAX_DEPTH = 32


# --------------------------------------------------------------------------------- encode
def _json_strings(leaf: np.ndarray) -> pa.Array:
    values = leaf.tolist()
    if all(isinstance(v, Mapping) and not v for v in values):  # the common case: empty infos
        return pa.array(["{}"] * len(values), pa.string())
    dump = json.dumps
    return pa.array(
        [dump(to_json_value(v), allow_nan=True, separators=(",", ":")) for v in values],
        pa.string(),
    )


def _tensor(leaf: np.ndarray, width: int) -> pa.Array:
    data = np.ascontiguousarray(leaf)
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(data), [None, pa.py_buffer(data)]
    )


def _encode_leaf(leaf: np.ndarray, column: str) -> tuple[dict[str, Any], pa.Array]:
    dt, rest = leaf.dtype, leaf.shape[1:]
    per_row = math.prod(rest)
    node: dict[str, Any] = {"node": "leaf", "column": column, "dtype": dt.str, "shape": list(rest)}
    if dt.kind == "O":
        if rest:
            raise ValueError(
                f"column {column!r}: object arrays must be 1-D, got shape {leaf.shape}"
            )
        return {**node, "encoding": "json"}, _json_strings(leaf)
    if dt.hasobject or dt.fields is not None or dt.itemsize == 0:
        raise ValueError(f"column {column!r}: arrays of dtype {dt} cannot be stored")
    prim = _PRIMITIVE.get(dt.str)
    if prim is not None and not rest:
        return {**node, "encoding": "scalar"}, pa.array(leaf, prim)
    if prim is not None and 0 < per_row <= LIST_MAX_ELEMENTS:
        flat = pa.array(np.ascontiguousarray(leaf).reshape(-1), prim)
        return {**node, "encoding": "list"}, pa.FixedSizeListArray.from_arrays(flat, per_row)
    if per_row == 0:
        raise ValueError(f"column {column!r}: rows of shape {rest} hold no values")
    return {**node, "encoding": "tensor"}, _tensor(leaf, per_row * dt.itemsize)


def encode_column(
    value: Any, name: str, leaves: list[tuple[str, pa.Array]], depth: int = 0
) -> dict[str, Any]:
    """The metadata node of one batch column; appends ``(parquet name, array)`` per leaf."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"column {name!r} is nested too deeply")
    if isinstance(value, np.ndarray):
        node, arr = _encode_leaf(value, name)
        leaves.append((name, arr))
        return node
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not isinstance(k, str) or "/" in k or not k:
                raise ValueError(f"column {name!r}: nested keys must be strings without '/'")
            items.append([k, encode_column(v, f"{name}/{k}", leaves, depth + 1)])
        return {"node": "dict", "items": items}
    if isinstance(value, tuple):
        members = [encode_column(v, f"{name}/{i}", leaves, depth + 1) for i, v in enumerate(value)]
        return {"node": "tuple", "items": members}
    raise TypeError(f"column {name!r}: cannot store a {type(value).__name__}")


# --------------------------------------------------------------------------------- decode
def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()


def _json_rows(arr: pa.Array, where: str) -> np.ndarray:
    out = np.empty(len(arr), dtype=object)
    loads = json.loads
    try:
        for i, s in enumerate(arr.to_pylist()):
            out[i] = {} if s == "{}" else loads(s)
    except (TypeError, ValueError, RecursionError):
        raise Malformed(f"{where}: row {i} is not valid JSON text") from None
    return out


def decode_leaf(node: dict[str, Any], arr: pa.Array, rows: int) -> np.ndarray:
    """The numpy column of one leaf (``node`` already validated) from its Arrow array."""
    where = f"column {node['column']!r}"
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    expect(len(arr) == rows, f"{where} holds {len(arr)} rows, not {rows}")
    expect(arr.null_count == 0, f"{where} holds {arr.null_count} missing (null) values")
    dt, rest, enc = np.dtype(node["dtype"]), tuple(node["shape"]), node["encoding"]
    if enc == "json":
        expect(
            pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type),
            f"{where} is not text",
        )
        return _json_rows(arr, where)
    if enc == "scalar":
        expect(arr.type == _PRIMITIVE[dt.str], f"{where} has Arrow type {arr.type}, not {dt}")
        return _writable(arr.to_numpy(zero_copy_only=False))
    per_row = math.prod(rest)
    if enc == "list":
        want = pa.list_(_PRIMITIVE[dt.str], per_row)
        expect(arr.type == want, f"{where} has Arrow type {arr.type}, not {want}")
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        return _writable(flat.reshape((rows, *rest)))
    width = per_row * dt.itemsize
    expect(arr.type == pa.binary(width), f"{where} has Arrow type {arr.type}, not binary({width})")
    buf = arr.buffers()[1]
    data = np.frombuffer(buf, dtype=np.uint8, count=rows * width, offset=arr.offset * width)
    return data.view(dt).reshape((rows, *rest)).copy()


def check_node(node: Any, where: str, depth: int = 0) -> None:
    """Validate one column node from a file's metadata (hostile input) or raise Malformed."""
    expect(depth <= _MAX_DEPTH, f"{where}: nested too deeply")
    expect(isinstance(node, dict), f"{where}: not an object")
    kind = node.get("node")
    if kind in ("dict", "tuple"):
        items = node.get("items")
        expect(isinstance(items, list), f"{where}: 'items' is not a list")
        for i, item in enumerate(items):
            if kind == "dict":
                ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                expect(ok, f"{where}: item {i} is not a [key, node] pair")
                check_node(item[1], f"{where}/{item[0]}", depth + 1)
            else:
                check_node(item, f"{where}/{i}", depth + 1)
        return
    expect(kind == "leaf", f"{where}: unknown node kind {str(kind)[:30]!r}")
    expect(isinstance(node.get("column"), str), f"{where}: no column name")
    shape = node.get("shape")
    expect(
        isinstance(shape, list)
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        and math.prod(shape) <= 2**31,
        f"{where}: malformed shape",
    )
    enc, dtype = node.get("encoding"), node.get("dtype")
    expect(enc in ("scalar", "list", "tensor", "json"), f"{where}: unknown encoding {enc!r}")
    expect(isinstance(dtype, str) and len(dtype) <= 16, f"{where}: malformed dtype")
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        raise Malformed(f"{where}: unknown dtype {dtype!r}") from None
    if enc == "json":
        expect(dt.kind == "O" and not shape, f"{where}: json leaves are 1-D object columns")
        return
    expect(not dt.hasobject and dt.fields is None and dt.itemsize > 0, f"{where}: bad dtype")
    if enc in ("scalar", "list"):
        expect(dt.str in _PRIMITIVE, f"{where}: {enc} leaves need a numeric dtype")
        expect((enc == "scalar") == (not shape), f"{where}: shape does not fit {enc!r}")


def decode_column(node: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """Rebuild a (nested) batch column from its node and the decoded leaf arrays."""
    kind = node["node"]
    if kind == "leaf":
        return arrays[node["column"]]
    if kind == "dict":
        return {k: decode_column(v, arrays) for k, v in node["items"]}
    return tuple(decode_column(v, arrays) for v in node["items"])


def leaf_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The leaf nodes under ``node``, in column order."""
    if node["node"] == "leaf":
        return [node]
    items = node["items"] if node["node"] == "tuple" else [v for _, v in node["items"]]
    return [leaf for v in items for leaf in leaf_nodes(v)]
