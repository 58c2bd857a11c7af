"""Split a nest of JSON values and numpy arrays into a JSON object plus a flat array table.

The convention, shared by every rlconnect checkpoint::

    >>> import numpy as np
    >>> obj, arrays = encode_nest({"count": np.int64(3), "mean": np.zeros(2), "ids": (1, 2)})
    >>> obj
    {'count': 3, 'mean': {'__array__': 'arr_0'}, 'ids': [1, 2]}
    >>> sorted(arrays)
    ['arr_0']
    >>> decode_nest(obj, arrays)["mean"]
    array([0., 0.])

Encoding turns numpy scalars into Python scalars and tuples into lists; dict keys must be
strings; non-finite floats are kept. Every array becomes ``{"__array__": key}`` with a
generated key; only numeric and bool dtypes are accepted (see ``SUPPORTED_DTYPES``).
Decoding is strict, because its input comes from a file: it raises ``CheckpointError`` for
anything encoding could not have produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.errors import CheckpointError

__all__ = ["ARRAY_KEY", "MAX_DEPTH", "SUPPORTED_DTYPES", "decode_nest", "encode_nest"]

ARRAY_KEY = "__array__"
"""The only key of the JSON object that stands for an array: ``{"__array__": key}``."""

MAX_DEPTH = 64
"""Deepest nesting of dicts and lists accepted when encoding or decoding."""

SUPPORTED_DTYPES: frozenset[np.dtype] = frozenset(
    np.dtype(t)
    for t in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
    )
)
"""Array dtypes a checkpoint can hold (those safetensors stores), in any byte order."""

JsonValue = Any


def check_array_dtype(array: np.ndarray, where: str) -> np.ndarray:
    """``array`` as a contiguous little-endian array; ValueError naming ``where`` if unsupported."""
    if array.dtype.newbyteorder("=") not in SUPPORTED_DTYPES:
        names = ", ".join(sorted(d.name for d in SUPPORTED_DTYPES))
        raise ValueError(
            f"{where}: arrays of dtype {array.dtype} cannot be saved (no pickle); "
            f"supported dtypes: {names}"
        )
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)


def encode_nest(nest: Any, *, where: str = "nest") -> tuple[JsonValue, dict[str, np.ndarray]]:
    """Split ``nest`` into a JSON-ready object and ``{key: array}``; see the module docstring.

    ``where`` prefixes the path in error messages (ValueError / TypeError), e.g.
    ``"connector 'MeanStdFilter' param"``.
    """
    arrays: dict[str, np.ndarray] = {}
    return encode_into(nest, arrays, where=where), arrays


def encode_into(nest: Any, arrays: dict[str, np.ndarray], *, where: str) -> JsonValue:
    """Like ``encode_nest`` but adds arrays to an existing table (keys stay unique)."""
    return _encode(nest, arrays, where, 0)


def _encode(value: Any, arrays: dict[str, np.ndarray], path: str, depth: int) -> JsonValue:
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.ndarray):
        key = f"arr_{len(arrays)}"
        arrays[key] = check_array_dtype(value, path)
        return {ARRAY_KEY: key}
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_ | np.number | np.str_) and not isinstance(
            value, np.complexfloating
        ):
            return value.item()
        raise ValueError(f"{path}: numpy scalar of dtype {value.dtype} cannot be saved")
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{path}: dict keys must be strings, got {k!r}")
            if k == ARRAY_KEY:
                raise ValueError(f"{path}: the key {ARRAY_KEY!r} is reserved for array references")
            out[k] = _encode(v, arrays, f"{path}.{k}", depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_encode(v, arrays, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise TypeError(
        f"{path}: cannot save a {type(value).__module__}.{type(value).__qualname__}; "
        "use JSON values (None, bool, int, float, str, list, dict) and numpy arrays"
    )


def decode_nest(obj: JsonValue, arrays: Mapping[str, np.ndarray], *, where: str = "nest") -> Any:
    """Rebuild the nest from ``encode_nest``'s output; CheckpointError on anything malformed.

    Every array must be referenced exactly once; arrays are returned as they are in
    ``arrays`` (not copied).
    """
    used: set[str] = set()
    out = _decode(obj, arrays, used, where, 0)
    unused = sorted(set(arrays) - used)
    if unused:
        raise CheckpointError(f"{where}: arrays {unused[:5]} are stored but never referenced")
    return out


def _decode(
    value: JsonValue, arrays: Mapping[str, np.ndarray], used: set[str], path: str, depth: int
) -> Any:
    if depth > MAX_DEPTH:
        raise CheckpointError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_decode(v, arrays, used, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if ARRAY_KEY in value:
            return _lookup_array(value, arrays, used, path)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{path}: dict key {k!r} is not a string")
            out[k] = _decode(v, arrays, used, f"{path}.{k}", depth + 1)
        return out
    raise CheckpointError(f"{path}: unexpected {type(value).__name__} in the structure")


def _lookup_array(
    ref: dict, arrays: Mapping[str, np.ndarray], used: set[str], path: str
) -> np.ndarray:
    key = ref[ARRAY_KEY]
    if len(ref) != 1 or not isinstance(key, str):
        raise CheckpointError(f"{path}: malformed array reference {_short(ref)}")
    if key not in arrays:
        raise CheckpointError(f"{path}: references array {key!r}, which the file does not hold")
    if key in used:
        raise CheckpointError(f"{path}: array {key!r} is referenced more than once")
    array = arrays[key]
    if not isinstance(array, np.ndarray) or array.dtype.newbyteorder("=") not in SUPPORTED_DTYPES:
        raise CheckpointError(f"{path}: array {key!r} has an unsupported type")
    used.add(key)
    return array


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
