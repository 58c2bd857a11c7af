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
safetensors file whose ``__metadata__`` holds the header of ``BATCH_FILE``
(``rlconnect.checkpoints.formats``: ``"rlconnect.batch"``, version ``"1"``), the JSON
``structure`` below, and a SHA-256 over all of it and every array's bytes. The
structure is::

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

Objects (``infos``, any object-dtype column, and ``meta``) are stored as JSON text; what
is not JSON is converted on write as ``rlconnect.offline.json_values`` describes (not
reversible: numpy arrays become lists, other objects their ``repr()``). Namedtuple
columns come back as plain tuples.

Modules: this one names and writes the files; ``batch_decode`` reads a file's structure
back, checking every field; ``json_values`` is the JSON fallback both formats share.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.batches import MultiAgentBatch, SampleBatch
from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.container import load_nest, pack
from rlconnect.checkpoints.formats import BATCH_FILE
from rlconnect.checkpoints.nest import ARRAY_KEY, SUPPORTED_DTYPES
from rlconnect.errors import CheckpointError
from rlconnect.offline._common import Malformed
from rlconnect.offline.batch_decode import RAW_DTYPE_RE, decode_structure
from rlconnect.offline.json_values import json_bytes, to_json_value

__all__ = [
    "BATCH_FILE_PATTERN",
    "BatchWriter",
    "batch_file_name",
    "read_batch_file",
    "to_json_value",
    "write_batches",
]

BATCH_FILE_PATTERN = "batch-*.rlb"
"""Glob of the batch files in a folder."""

_NAME_RE = re.compile(r"^batch-(\d{6,})\.rlb$")

PathLike = str | os.PathLike[str]
Batch = SampleBatch | MultiAgentBatch


# --------------------------------------------------------------------------------- writing
def batch_file_name(index: int) -> str:
    """``batch-000042.rlb`` for ``index=42``."""
    return f"batch-{int(index):06d}.rlb"


def _encode_leaf(leaf: np.ndarray, arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    key = f"arr_{len(arrays)}"
    ref = {ARRAY_KEY: key}
    shape = [int(s) for s in leaf.shape]
    if leaf.dtype == object:
        arrays[key] = json_bytes(list(leaf.reshape(-1)))
        return {"node": "json", "shape": shape, "data": ref}
    if leaf.dtype in SUPPORTED_DTYPES and leaf.dtype.isnative:
        arrays[key] = np.ascontiguousarray(leaf)
        return {"node": "array", "dtype": leaf.dtype.name, "shape": shape, "data": ref}
    dt = leaf.dtype
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None or dt.itemsize == 0:
        raise ValueError(f"{where}: arrays of dtype {dt} cannot be stored in a batch file")
    if not RAW_DTYPE_RE.match(dt.str):
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
    return pack(obj, arrays, BATCH_FILE)


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
    _, obj = load_nest(path, BATCH_FILE)
    source = os.fspath(path)
    try:
        return decode_structure(obj)
    except Malformed as exc:
        raise CheckpointError(f"cannot load {BATCH_FILE.name} file {source!r}: {exc}") from None
