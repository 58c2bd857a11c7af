"""One checkpoint file: a safetensors file whose header carries a JSON structure.

Layout (a plain safetensors file, readable by any safetensors tool)::

    8 bytes   little-endian u64 N: length of the JSON header
    N bytes   JSON header: {"__metadata__": {...}, "arr_0": {dtype, shape, data_offsets}, ...}
    rest      raw little-endian array bytes

``__metadata__`` holds four strings: ``format`` (e.g. ``"rlconnect.pipeline"``) and
``format_version`` (a decimal integer), written and checked by the file's ``FileFormat``
(``rlconnect.checkpoints.formats``), ``structure`` (the nest as JSON, arrays replaced
by ``{"__array__": "arr_<i>"}``, see ``rlconnect.checkpoints.nest``) and ``sha256`` (a
digest over format, version, structure and every array's key, dtype, shape and bytes, so
flipped bytes anywhere are caught).

Reading never unpickles and never imports anything named in the file. Every check runs
before any array is built, and all arrays are slices of the bytes already read, so a
header claiming a huge size allocates nothing. Any defect raises ``CheckpointError`` naming
the file; a missing file raises ``FileNotFoundError`` (other ``OSError`` s propagate too).
A folder, a FIFO or a device is never read: ``CheckpointError`` (``checkpoints.files``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import safetensors.numpy

from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.damage import DIGEST_MISMATCH, EMPTY, TRUNCATED_OR_NOT, size_damage
from rlconnect.checkpoints.files import read_regular_file
from rlconnect.checkpoints.formats import FileFormat
from rlconnect.checkpoints.nest import decode_nest, encode_nest
from rlconnect.errors import CheckpointError

__all__ = ["content_digest", "load_nest", "save_nest"]

_LENGTH_BYTES = 8
_MAX_HEADER_BYTES = 100_000_000
_METADATA = "__metadata__"
_TENSOR_DTYPES = frozenset(
    {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64", "C64"}
)


def save_nest(
    path: str | os.PathLike[str],
    nest: Any,
    fmt: FileFormat,
    *,
    where: str = "nest",
) -> None:
    """Write ``nest`` (JSON values and numpy arrays) atomically to exactly ``path``.

    Raises ValueError / TypeError (naming ``where`` and the offending path) before touching
    the disk if the nest holds something that cannot be saved without pickle.
    """
    obj, arrays = encode_nest(nest, where=where)
    atomic_write_bytes(path, pack(obj, arrays, fmt))


def pack(obj: Any, arrays: dict[str, np.ndarray], fmt: FileFormat) -> bytes:
    """The file's bytes, in format ``fmt``, for an already encoded nest (``encode_nest``
    output)."""
    structure = json.dumps(obj, allow_nan=True, separators=(",", ":"))
    metadata = {
        **fmt.header(text=True),
        "structure": structure,
        "sha256": _digest(fmt.name, fmt.version, structure, arrays),
    }
    return safetensors.numpy.save(arrays, metadata=metadata)


def load_nest(path: str | os.PathLike[str], fmt: FileFormat) -> tuple[int, Any]:
    """Read a file written by ``save_nest``: ``(format_version, nest)``.

    A file of another format, or of a version ``fmt`` does not read, raises
    ``CheckpointError`` naming both and the supported versions. Only a regular file of at
    most ``MAX_FILE_BYTES`` is read (``rlconnect.checkpoints.files``): a folder, FIFO or
    device is a ``CheckpointError``.
    """
    source = os.fspath(path)
    data = read_regular_file(
        source,
        fail=lambda msg: CheckpointError(f"cannot load {fmt.name} file {source!r}: {msg}"),
    )
    return unpack(data, fmt, source=source)


def unpack(data: bytes, fmt: FileFormat, *, source: str = "<bytes>") -> tuple[int, Any]:
    """Parse and verify the bytes of a checkpoint file; see ``load_nest``."""

    def fail(msg: str) -> CheckpointError:
        return CheckpointError(f"cannot load {fmt.name} file {source!r}: {msg}")

    header = _read_header(data, fail)
    meta = header.pop(_METADATA, None)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise fail("no rlconnect metadata in the header (not an rlconnect checkpoint)")
    version = fmt.check(meta, where=repr(source), text=True, fail=fail)
    structure, digest = meta.get("structure"), meta.get("sha256")
    if structure is None or digest is None:
        raise fail("the header lacks the 'structure' or 'sha256' entry")
    for key, entry in header.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not isinstance(dtype, str) or dtype not in _TENSOR_DTYPES:  # a list is unhashable
            raise fail(f"array {key[:40]!r} has a malformed entry or unsupported dtype")
    _check_length(data, header, fail)
    try:
        arrays = safetensors.numpy.load(data)
    except Exception as exc:  # a third-party parser: any failure means a damaged file
        raise fail(f"invalid array data ({exc})") from None
    arrays = {k: (a if a.flags.writeable else a.copy()) for k, a in arrays.items()}
    if _digest(fmt.name, version, structure, arrays) != digest:
        raise fail(DIGEST_MISMATCH)
    try:
        obj = json.loads(structure)
    except (ValueError, RecursionError) as exc:
        raise fail(f"the structure is not valid JSON ({type(exc).__name__})") from None
    try:
        return version, decode_nest(obj, arrays, where="structure")
    except CheckpointError as exc:
        raise fail(str(exc)) from None


def content_digest(data: bytes) -> str:
    """The SHA-256 recorded in a file's header (over its format, structure and arrays; the
    header's own key order may differ between writes of the same content). Call on bytes
    that ``unpack`` verified."""
    n = int.from_bytes(data[:_LENGTH_BYTES], "little")
    meta = json.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + n])[_METADATA]
    return str(meta["sha256"])


def _read_header(data: bytes, fail: Any) -> dict[str, Any]:
    if not data:
        raise fail(EMPTY)
    if len(data) < _LENGTH_BYTES:
        raise fail(TRUNCATED_OR_NOT.format(what="rlconnect file"))
    length = int.from_bytes(data[:_LENGTH_BYTES], "little")
    if length > _MAX_HEADER_BYTES:
        raise fail(f"not an rlconnect file (the header claims {length} bytes), or damaged")
    if length > len(data) - _LENGTH_BYTES:  # the header itself is cut: its JSON is incomplete
        raise fail(TRUNCATED_OR_NOT.format(what="rlconnect file"))
    try:
        header = json.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise fail("the header is not valid JSON (damaged, or not an rlconnect file)") from None
    if not isinstance(header, dict):
        raise fail(f"the header is a JSON {type(header).__name__}, expected an object")
    return header


def _check_length(data: bytes, header: dict[str, Any], fail: Any) -> None:
    """The file must end where its arrays' offsets say: shorter is a truncated file,
    longer has bytes appended (malformed offsets are left to the safetensors parser)."""
    ends = [
        e["data_offsets"][1]
        for e in header.values()
        if isinstance(e.get("data_offsets"), list)
        and len(e["data_offsets"]) == 2
        and all(type(x) is int for x in e["data_offsets"])
    ]
    if len(ends) != len(header):
        return
    length = int.from_bytes(data[:_LENGTH_BYTES], "little")
    want = _LENGTH_BYTES + length + max(ends, default=0)
    if len(data) != want:
        raise fail(size_damage(len(data), want))


def _digest(format_name: str, version: int, structure: str, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for part in (format_name, str(version), structure):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for key in sorted(arrays):
        a = arrays[key]
        h.update(f"{key}\0{a.dtype.name}\0{tuple(a.shape)}\0".encode("utf-8", "surrogatepass"))
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()
