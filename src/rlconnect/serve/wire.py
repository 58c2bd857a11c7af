"""The wire format: msgpack with numpy arrays and tuples as explicit extension types.

Nothing here can run code: the decoder builds only dicts, lists, strings, numbers, bytes,
tuples and numpy arrays of plain (bool, int, uint, float, complex) dtypes. An array travels
as ``ExtType(1, msgpack([dtype_str, shape, raw_bytes]))``, a tuple as ``ExtType(2, ...)``;
msgpack's own timestamp extension decodes to a float (seconds).

Bounds, checked before anything is built: tuples nest at most ``MAX_TUPLE_DEPTH`` deep
(each level is a nested msgpack parse on the C stack: a few hundred levels would crash the
process), and a message holds at most ``MAX_VALUES`` values in all (list items, map keys
and values, tuple items), so decoding allocates at most about 64 B per value plus the
array bytes, whatever the body (msgpack alone turns a byte into a 64 B empty dict).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MAX_TUPLE_DEPTH", "MAX_VALUES", "WireError", "decode", "encode"]

MAX_TUPLE_DEPTH = 32
"""Deepest nesting of tuples (extension type 2) a message may hold."""
MAX_VALUES = 1 << 19
"""Most values (list items, map keys and values, tuple items) one message may hold."""

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


def _ext_hook_at(depth: int) -> Any:
    """The msgpack ``ext_hook`` for extension types met ``depth`` tuples deep."""

    def ext_hook(code: int, data: bytes) -> Any:
        if code == _TUPLE:
            if depth >= MAX_TUPLE_DEPTH:
                raise WireError(f"tuples nested deeper than {MAX_TUPLE_DEPTH} levels")
            return tuple(_decode(data, depth + 1))
        return _array(code, data)

    return ext_hook


def _array(code: int, data: bytes) -> Any:
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
    _count_values(data, 0, [MAX_VALUES])
    return _decode(data, 0)


# msgpack type byte -> bytes after it that are skipped (fixed-size scalars), and the
# width of the length field of strings, bins and exts (big-endian)
_FIXED = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_EXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_SIZED = {0xC7: 1, 0xC8: 2, 0xC9: 4}


def _count_values(data: bytes, depth: int, budget: list[int]) -> None:
    """Walk the msgpack headers of ``data`` (nested tuples included) without building
    anything; WireError once they declare more than ``budget`` values. Malformed bytes
    are left for msgpack to reject."""
    pos, pending, end = 0, 1, len(data)
    while pending and pos < end:
        pending -= 1
        b = data[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):  # fixint, nil, bool
            continue
        if 0xA0 <= b <= 0xBF:  # fixstr
            pos += b & 0x1F
            continue
        if b in _FIXED:
            pos += _FIXED[b]
            continue
        if b in _SIZED:
            w = _SIZED[b]
            pos += w + int.from_bytes(data[pos : pos + w], "big")
            continue
        if b in _EXT or b in _EXT_SIZED:
            w = _EXT_SIZED.get(b, 0)
            size = _EXT[b] if b in _EXT else int.from_bytes(data[pos : pos + w], "big")
            code, pos = data[pos + w : pos + w + 1], pos + w + 1
            if code == bytes([_TUPLE]):
                if depth >= MAX_TUPLE_DEPTH:
                    raise WireError(f"tuples nested deeper than {MAX_TUPLE_DEPTH} levels")
                _count_values(data[pos : pos + size], depth + 1, budget)
            pos += size
            continue
        if 0x80 <= b <= 0x9F:  # fixmap, fixarray
            n = (b & 0x0F) * (2 if b <= 0x8F else 1)
        elif b in (0xDC, 0xDD, 0xDE, 0xDF):  # array16/32, map16/32
            w = 2 if b in (0xDC, 0xDE) else 4
            n = int.from_bytes(data[pos : pos + w], "big") * (2 if b >= 0xDE else 1)
            pos += w
        else:  # 0xC1, never used: msgpack rejects it
            return
        budget[0] -= n
        if budget[0] < 0:
            raise WireError(f"the message holds more than {MAX_VALUES} values")
        pending += n


def _decode(data: bytes, depth: int) -> Any:
    msgpack = _msgpack()
    try:
        return msgpack.unpackb(
            data,
            ext_hook=_ext_hook_at(depth),
            raw=False,
            strict_map_key=False,
            timestamp=1,  # msgpack's own timestamp extension (-1): a float, not an object
        )
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"not a valid message: {type(exc).__name__}: {exc}") from None
