"""The wire format: msgpack with numpy arrays and tuples as explicit extension types.

Nothing here can run code: the decoder builds only dicts, lists, strings, numbers, bytes,
tuples and numpy arrays of plain (bool, int, uint, float, complex) dtypes. An array travels
as ``ExtType(1, msgpack([dtype_str, shape, raw_bytes]))``, a tuple as ``ExtType(2, ...)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["WireError", "decode", "encode"]

_ARRAY, _TUPLE = 1, 2
_KINDS = set("biufc")


class WireError(ValueError):
    """A message that is not valid rlconnect wire format."""


def _msgpack() -> Any:
    """msgpack, imported on first use so ``import rlconnect`` works without the extra."""
    try:
        import msgpack
    except ImportError:
        raise ImportError("rlconnect.serve needs msgpack: pip install 'rlconnect[serve]'") from None
    return msgpack


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype.kind not in _KINDS:
            raise TypeError(f"cannot send arrays of dtype {arr.dtype} (only numbers and bools)")
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        msgpack = _msgpack()
        return msgpack.ExtType(
            _ARRAY, msgpack.packb([arr.dtype.str, list(arr.shape), arr.tobytes()])
        )
    if isinstance(obj, tuple):
        return _msgpack().ExtType(_TUPLE, encode(list(obj)))
    raise TypeError(f"cannot send a {type(obj).__name__} (send numbers, strings, arrays, dicts)")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _TUPLE:
        return tuple(decode(data))
    if code != _ARRAY:
        raise WireError(f"unknown extension type {code}")
    try:
        dtype_str, shape, raw = _msgpack().unpackb(data)
        dtype = np.dtype(dtype_str)
        if dtype.kind not in _KINDS:
            raise WireError(f"arrays of dtype {dtype} are not accepted")
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"bad array payload: {exc}") from None
    return arr.copy() if arr.ndim else arr[()]


def encode(obj: Any) -> bytes:
    """Bytes for ``obj`` (nests of dicts, lists, tuples, numbers, strings, numpy arrays)."""
    return _msgpack().packb(obj, default=_default, use_bin_type=True, strict_types=True)


def decode(data: bytes) -> Any:
    """The object ``encode`` made; WireError for anything else."""
    msgpack = _msgpack()
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"not a valid message: {type(exc).__name__}: {exc}") from None
