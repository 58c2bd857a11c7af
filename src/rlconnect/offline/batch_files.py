"""Batch files: one pickle-free file per sampled batch, read back in the order written.

>>> import os, tempfile, numpy as np
>>> from rlconnect import SampleBatch
>>> from rlconnect.offline import read_batches, write_batches
>>> d = tempfile.mkdtemp()
>>> b = SampleBatch({"obs": np.zeros((3, 2), np.float32), "infos": [{}, {"x": 1}, {}]})
>>> [os.path.basename(p) for p in write_batches([b, b], d)]
['batch-000000.rlb', 'batch-000001.rlb']
>>> [x["infos"][1] for x in read_batches(d)]
[{'x': 1}, {'x': 1}]

Writing
-------
``BatchWriter(dir)`` writes each batch to its own file ``dir/batch-000000.rlb``,
``batch-000001.rlb``, ... (six digits or more; numbering continues after the highest file
already in ``dir``, so reopening a folder appends). Every file is written atomically (temp
file, fsync, rename; see ``rlconnect.checkpoints.atomic``): a reader never sees half a
file, and ``batch-*.rlb`` never matches a temp file. Use one writer per folder.
``write_batches(batches, dir)`` is the one-call form.

Reading
-------
``read_batches(path)`` takes a folder (its ``batch-*.rlb`` files by number), one file, a
glob pattern (``"runs/*/batch-*.rlb"``; matches sorted by folder, then number), or a list
of these, and yields ``SampleBatch`` / ``MultiAgentBatch`` objects in the order written.
Paths are resolved when it is called (a missing path raises ``FileNotFoundError`` at once);
files are read lazily, one at a time. A damaged, truncated, foreign or hostile file raises
``rlconnect.CheckpointError`` naming the file and the defect. Reading never unpickles,
imports or evaluates anything.

File format (``"rlconnect.batch"``, version 1)
-----------------------------------------------
Each file is the rlconnect container (``rlconnect.checkpoints.container``): a plain
safetensors file whose ``__metadata__`` holds ``format="rlconnect.batch"``,
``format_version="1"``, the JSON ``structure`` below, and a SHA-256 over all of it and
every array's bytes. The structure is::

    {"kind": "SampleBatch", "index": 7, "batch": BATCH}
    {"kind": "MultiAgentBatch", "index": 7, "env_steps": 400,
     "policy_batches": [["policy_id", BATCH], ...]}

    BATCH  = {"count": rows, "meta": "<JSON text of batch.meta>",
              "columns": [["obs", COLUMN], ["infos", COLUMN], ...]}   # in column order
    COLUMN = {"node": "array", "dtype": "float32", "shape": [rows, 4],
              "data": {"__array__": "arr_0"}}       # stored as is (a safetensors tensor)
           | {"node": "raw", "dtype": "<c16", "shape": [rows, 2],
              "data": {"__array__": "arr_1"}}       # other fixed-size dtypes: the array's
                                                    # bytes as a uint8 tensor, dtype.str kept
           | {"node": "json", "shape": [rows], "data": {"__array__": "arr_2"}}
                                                    # object arrays (infos): UTF-8 JSON text
                                                    # of the flattened values, uint8 tensor
           | {"node": "dict", "items": [["key", COLUMN], ...]}      # nested columns
           | {"node": "tuple", "items": [COLUMN, ...]}

``index`` is the file's sequence number. Dtypes come back exactly, byte order included:
bool, (u)int8-64, float16/32/64 and complex64 in native order are plain tensors; any
other dtype without Python objects (complex128, datetime64, timedelta64, fixed-width
``U``/``S`` strings, non-native byte order) is stored as raw bytes plus its ``dtype.str``.

Objects (``infos``, any object-dtype column, and ``meta``) are stored as JSON text. What is
not JSON is converted on write (documented fallback, not reversible):

- numpy arrays become (nested) lists, numpy scalars Python scalars, tuples lists;
- dict keys that are not strings become ``str(key)``;
- floats NaN / inf are kept (written as ``NaN`` / ``Infinity``, as Python's ``json`` does);
- any other object (bytes, sets, custom classes, complex numbers ...) becomes its
  ``repr()`` string; so does anything nested deeper than 64 levels.

So an ``infos`` row ``{"pos": np.array([1, 2]), "tag": b"x"}`` reads back as
``{"pos": [1, 2], "tag": "b'x'"}``. Namedtuple columns come back as plain tuples.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.batches import MultiAgentBatch, SampleBatch
from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.container import load_nest, pack
from rlconnect.checkpoints.nest import ARRAY_KEY, SUPPORTED_DTYPES
from rlconnect.errors import CheckpointError

__all__ = [
    "BATCH_FILE_PATTERN",
    "BATCH_FORMAT",
    "BATCH_FORMAT_VERSION",
    "BATCH_FORMAT_VERSIONS",
    "BatchWriter",
    "batch_file_name",
    "read_batch_file",
    "to_json_value",
    "write_batches",
]

BATCH_FORMAT = "rlconnect.batch"
"""The format name recorded in every batch file."""

BATCH_FORMAT_VERSION = 1
"""The format version ``BatchWriter`` writes."""

BATCH_FORMAT_VERSIONS: frozenset[int] = frozenset({1})
"""The format versions ``read_batches`` reads."""

BATCH_FILE_PATTERN = "batch-*.rlb"
"""Glob of the batch files in a folder."""

_NAME_RE = re.compile(r"^batch-(\d{6,})\.rlb$")
_DTYPE_RE = re.compile(r"^[<>|=][a-zA-Z]\d+(\[\w+\])?$")
_MAX_JSON_DEPTH = 64

PathLike = str | os.PathLike[str]
Batch = SampleBatch | MultiAgentBatch


# --------------------------------------------------------------------------- JSON fallback
def to_json_value(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON values, converting what is not JSON (see the module docstring).

    >>> to_json_value({"a": np.arange(2), 3: (np.float32(0.5), b"x")})
    {'a': [0, 1], '3': [0.5, "b'x'"]}
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if _depth > _MAX_JSON_DEPTH:
        return repr(value)
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [to_json_value(v, _depth + 1) for v in value.tolist()]
        return to_json_value(value.tolist(), _depth + 1)
    if isinstance(value, np.generic):
        item = value.item()
        return to_json_value(item, _depth + 1) if not isinstance(item, np.generic) else repr(value)
    if isinstance(value, Mapping):
        return {
            (k if isinstance(k, str) else str(k)): to_json_value(v, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [to_json_value(v, _depth + 1) for v in value]
    return repr(value)


def _json_bytes(values: list[Any]) -> np.ndarray:
    text = json.dumps([to_json_value(v) for v in values], allow_nan=True, separators=(",", ":"))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


# --------------------------------------------------------------------------------- writing
def batch_file_name(index: int) -> str:
    """``batch-000042.rlb`` for ``index=42``."""
    return f"batch-{int(index):06d}.rlb"


def _encode_leaf(leaf: np.ndarray, arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    key = f"arr_{len(arrays)}"
    ref = {ARRAY_KEY: key}
    shape = [int(s) for s in leaf.shape]
    if leaf.dtype == object:
        arrays[key] = _json_bytes(list(leaf.reshape(-1)))
        return {"node": "json", "shape": shape, "data": ref}
    if leaf.dtype in SUPPORTED_DTYPES and leaf.dtype.isnative:
        arrays[key] = np.ascontiguousarray(leaf)
        return {"node": "array", "dtype": leaf.dtype.name, "shape": shape, "data": ref}
    dt = leaf.dtype
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None or dt.itemsize == 0:
        raise ValueError(f"{where}: arrays of dtype {dt} cannot be stored in a batch file")
    if not _DTYPE_RE.match(dt.str):
        raise ValueError(f"{where}: arrays of dtype {dt} ({dt.str}) cannot be stored")
    arrays[key] = np.frombuffer(np.ascontiguousarray(leaf).tobytes(), dtype=np.uint8).copy()
    return {"node": "raw", "dtype": dt.str, "shape": shape, "data": ref}


def _encode_column(value: Any, arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        return _encode_leaf(value, arrays, where)
    if isinstance(value, Mapping):
        items: list[Any] = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: nested column keys must be strings, got {k!r}")
            items.append([k, _encode_column(v, arrays, f"{where}/{k}")])
        return {"node": "dict", "items": items}
    if isinstance(value, tuple):
        members = [_encode_column(v, arrays, f"{where}/{i}") for i, v in enumerate(value)]
        return {"node": "tuple", "items": members}
    raise TypeError(f"{where}: cannot store a {type(value).__name__} column")


def _encode_batch(batch: SampleBatch, arrays: dict[str, np.ndarray], where: str) -> dict:
    columns = [
        [name, _encode_column(col, arrays, f"cannot store {where}column {name!r}")]
        for name, col in batch.items()
    ]
    meta = json.dumps(to_json_value(batch.meta), allow_nan=True, separators=(",", ":"))
    return {"count": len(batch), "meta": meta, "columns": columns}


def encode_batch(batch: Batch, index: int) -> bytes:
    """The bytes of one batch file (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    if isinstance(batch, SampleBatch):
        obj = {"kind": "SampleBatch", "index": index, "batch": _encode_batch(batch, arrays, "")}
    elif isinstance(batch, MultiAgentBatch):
        obj = {
            "kind": "MultiAgentBatch",
            "index": index,
            "env_steps": batch.env_steps(),
            "policy_batches": [
                [pid, _encode_batch(b, arrays, f"policy {pid!r} ")]
                for pid, b in batch.policy_batches.items()
            ],
        }
    else:
        raise TypeError(
            f"can only write rc.SampleBatch or rc.MultiAgentBatch, got {type(batch).__name__}"
        )
    return pack(obj, arrays, format_name=BATCH_FORMAT, format_version=BATCH_FORMAT_VERSION)


class BatchWriter:
    """Appends one file per batch to ``directory`` (created if missing); see the module doc.

    >>> import tempfile, numpy as np
    >>> with BatchWriter(tempfile.mkdtemp()) as w:
    ...     path = w.write(SampleBatch({"x": np.arange(3)}))
    >>> os.path.basename(path), w.num_written
    ('batch-000000.rlb', 1)
    """

    def __init__(self, directory: PathLike) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"batch output {str(self.directory)!r} is not a folder")
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = [_file_index(p) for p in self.directory.glob(BATCH_FILE_PATTERN)]
        numbered = [i for i in existing if i is not None]
        self._next = max(numbered) + 1 if numbered else 0
        self.paths: list[Path] = []
        self.env_steps = 0
        self.closed = False

    @property
    def num_written(self) -> int:
        """Files written by this writer."""
        return len(self.paths)

    def write(self, batch: Batch) -> Path:
        """Write ``batch`` to the next file, atomically; returns its path.

        Raises TypeError / ValueError before writing if the batch holds something that
        cannot be stored (e.g. a structured dtype holding objects).
        """
        if self.closed:
            raise ValueError("this BatchWriter is closed")
        data = encode_batch(batch, self._next)
        path = self.directory / batch_file_name(self._next)
        atomic_write_bytes(path, data)
        self._next += 1
        self.paths.append(path)
        self.env_steps += batch.env_steps() if isinstance(batch, MultiAgentBatch) else len(batch)
        return path

    def close(self) -> None:
        """Stop accepting batches (every written file is already complete)."""
        self.closed = True

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_batches(batches: Batch | Iterable[Batch], directory: PathLike) -> list[Path]:
    """Append ``batches`` (one batch or an iterable) to ``directory``; the paths written."""
    items: Iterable[Batch] = (
        [batches] if isinstance(batches, SampleBatch | MultiAgentBatch) else batches
    )
    with BatchWriter(directory) as writer:
        for b in items:
            writer.write(b)
    return writer.paths


# --------------------------------------------------------------------------------- reading
def _file_index(path: PathLike) -> int | None:
    m = _NAME_RE.match(os.path.basename(os.fspath(path)))
    return int(m.group(1)) if m else None


def read_batch_file(path: PathLike) -> Batch:
    """The batch stored in one file; ``CheckpointError`` naming the file if it is damaged."""
    _, obj = load_nest(path, format_name=BATCH_FORMAT, versions=BATCH_FORMAT_VERSIONS)
    source = os.fspath(path)
    try:
        return _decode_file(obj)
    except _Malformed as exc:
        raise CheckpointError(f"cannot load {BATCH_FORMAT} file {source!r}: {exc}") from None


class _Malformed(Exception):
    """A structure that ``encode_batch`` cannot have produced."""


def _expect(cond: bool, msg: str) -> None:
    if not cond:
        raise _Malformed(msg)


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    _expect(isinstance(obj, dict), f"{where} is not an object")
    _expect(key in obj, f"{where} lacks {key!r}")
    value = obj[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is int)
    _expect(ok, f"{where}.{key} has the wrong type ({type(value).__name__})")
    return value


def _pairs(value: Any, where: str) -> list[tuple[str, Any]]:
    _expect(isinstance(value, list), f"{where} is not a list")
    out = []
    for i, item in enumerate(value):
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
        _expect(ok, f"{where}[{i}] is not a [name, value] pair")
        out.append((item[0], item[1]))
    names = [k for k, _ in out]
    _expect(len(set(names)) == len(names), f"{where} repeats a name")
    return out


def _decode_file(obj: Any) -> Batch:
    kind = _field(obj, "kind", str, "the structure")
    _field(obj, "index", int, "the structure")
    if kind == "SampleBatch":
        return _decode_batch(_field(obj, "batch", dict, "the structure"), "batch")
    if kind == "MultiAgentBatch":
        env_steps = _field(obj, "env_steps", int, "the structure")
        _expect(env_steps >= 0, "env_steps is negative")
        pairs = _pairs(_field(obj, "policy_batches", list, "the structure"), "policy_batches")
        return MultiAgentBatch(
            {pid: _decode_batch(b, f"policy batch {pid!r}") for pid, b in pairs}, env_steps
        )
    raise _Malformed(f"unknown batch kind {kind[:40]!r}")


def _decode_batch(obj: Any, where: str) -> SampleBatch:
    count = _field(obj, "count", int, where)
    meta_text = _field(obj, "meta", str, where)
    try:
        meta = json.loads(meta_text)
    except (ValueError, RecursionError):
        raise _Malformed(f"{where}: meta is not valid JSON") from None
    _expect(isinstance(meta, dict), f"{where}: meta is not a JSON object")
    pairs = _pairs(_field(obj, "columns", list, where), f"{where} columns")
    columns = {name: _decode_column(col, f"{where} column {name!r}", 0) for name, col in pairs}
    try:
        batch = SampleBatch(columns, meta=meta)
    except (ValueError, TypeError) as exc:
        raise _Malformed(f"{where}: {exc}") from None
    _expect(len(batch) == count, f"{where}: holds {len(batch)} rows, not {count}")
    return batch


def _decode_column(obj: Any, where: str, depth: int) -> Any:
    _expect(depth <= _MAX_JSON_DEPTH, f"{where}: nested too deeply")
    node = _field(obj, "node", str, where)
    if node == "dict":
        items = _pairs(_field(obj, "items", list, where), where)
        return {k: _decode_column(v, f"{where}/{k}", depth + 1) for k, v in items}
    if node == "tuple":
        items = _field(obj, "items", list, where)
        return tuple(_decode_column(v, f"{where}/{i}", depth + 1) for i, v in enumerate(items))
    shape_list = _field(obj, "shape", list, where)
    _expect(
        len(shape_list) >= 1
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape_list),
        f"{where}: malformed shape",
    )
    shape = tuple(shape_list)
    data = _field(obj, "data", np.ndarray, where)
    if node == "array":
        dtype = _field(obj, "dtype", str, where)
        _expect(data.dtype.name == dtype, f"{where}: stored as {data.dtype.name}, not {dtype}")
        _expect(data.shape == shape, f"{where}: stored with shape {data.shape}, not {shape}")
        return data
    _expect(data.dtype == np.uint8 and data.ndim == 1, f"{where}: data is not a byte array")
    if node == "raw":
        dtype_str = _field(obj, "dtype", str, where)
        _expect(bool(_DTYPE_RE.match(dtype_str)), f"{where}: malformed dtype {dtype_str[:20]!r}")
        try:
            dt = np.dtype(dtype_str)
        except (TypeError, ValueError):
            raise _Malformed(f"{where}: unknown dtype {dtype_str!r}") from None
        _expect(
            not dt.hasobject and dt.fields is None and dt.itemsize > 0,
            f"{where}: dtype {dtype_str!r} is not allowed",
        )
        _expect(
            data.size == math.prod(shape) * dt.itemsize,
            f"{where}: {data.size} bytes do not make an array of {dt} and shape {shape}",
        )
        return data.view(dt).reshape(shape)
    if node == "json":
        try:
            values = json.loads(data.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise _Malformed(f"{where}: the stored JSON text is damaged") from None
        _expect(
            isinstance(values, list) and len(values) == math.prod(shape),
            f"{where}: the stored JSON is not a list of {math.prod(shape)} values",
        )
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            out[i] = v
        return out.reshape(shape)
    raise _Malformed(f"{where}: unknown node {node[:40]!r}")
