"""The wire format: msgpack with numpy arrays and tuples as explicit extension types.

Nothing here can run code: the decoder builds only dicts, lists, strings, numbers, bytes,
tuples and numpy arrays of plain (bool, int, uint, float, complex) dtypes. An array travels
as ``ExtType(1, msgpack([dtype_str, shape, raw_bytes]))``, a tuple as ``ExtType(2, ...)``;
msgpack's own timestamp extension decodes to a float (seconds).

Bounds, checked before anything is built (a walk over the msgpack headers, which builds
nothing): a message holds at most ``MAX_VALUES`` values in all (list items, map keys and
values, tuple items); tuples nest at most ``MAX_TUPLE_DEPTH`` deep (each level is a nested
msgpack parse on the C stack, and a copy of its payload: their payloads hold at most
``TUPLE_COPIES`` times the message's bytes in all). So decoding ``n`` bytes allocates at
most about ``8 * n`` bytes (strings, bytes and arrays, tuple payloads, transient copies) plus
72 B per value (an empty dict in its list slot, the costliest value), whatever the body;
msgpack alone turns a byte into a 64 B dict. A body of at most ``INLINE_BYTES`` holds at
most that many values, so it needs no walk and decodes in well under a millisecond to a
few; the server decodes larger ones off its event loop (``PolicyServer``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "INLINE_BYTES",
    "MAX_TUPLE_DEPTH",
    "MAX_VALUES",
    "TUPLE_COPIES",
    "WireError",
    "decode",
    "encode",
]

MAX_TUPLE_DEPTH = 8
"""Deepest nesting of tuples (extension type 2) a message may hold."""
MAX_VALUES = 1 << 16
"""Most values (list items, map keys and values, tuple items) one message may hold."""
TUPLE_COPIES = 4
"""The bytes inside tuples, each nesting level counted, are at most this many times the
message's own."""
INLINE_BYTES = 8 << 10
"""Bodies up to this size hold so few values that the server decodes them on its event
loop; larger ones are walked and decoded in a thread of their own."""

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
        dtype_str, shape, raw = _msgpack().unpackb(data, max_array_len=64)
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
    """The object ``encode`` made; WireError for anything else (or beyond the bounds)."""
    if len(data) > INLINE_BYTES:  # a smaller body cannot hold more values than bytes
        _Walk(len(data)).values(memoryview(data), 0)
    return _decode(data, 0)


# msgpack type byte -> bytes after it that are skipped (fixed-size scalars), and the
# width of the length field of strings, bins and exts (big-endian)
_FIXED = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
_SIZED = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_EXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_SIZED = {0xC7: 1, 0xC8: 2, 0xC9: 4}


class _Walk:
    """A walk over the msgpack headers of a message (nested tuples included) that builds
    nothing: WireError once they declare more than ``MAX_VALUES`` values, tuples deeper
    than ``MAX_TUPLE_DEPTH`` or more tuple bytes than ``TUPLE_COPIES`` times the message.
    Malformed bytes are left for msgpack to reject."""

    def __init__(self, size: int) -> None:
        self.values_left = MAX_VALUES
        self.tuple_bytes_left = TUPLE_COPIES * size

    def values(self, data: memoryview, depth: int) -> None:
        pos, pending, end = 0, 1, len(data)
        while pending and pos < end:
            pending -= 1
            b = data[pos]
            pos += 1
            if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):  # fixint, nil, bool
                continue
            if 0xA0 <= b <= 0xBF:  # fixstr
                pos += b & 0x1F
            elif b in _FIXED:
                pos += _FIXED[b]
            elif b in _SIZED:
                w = _SIZED[b]
                pos += w + int.from_bytes(data[pos : pos + w], "big")
            elif b in _EXT or b in _EXT_SIZED:
                pos = self._ext(data, pos, b, depth)
            else:
                n = _items(data, pos, b)
                if n < 0:  # 0xC1, never used: msgpack rejects it
                    return
                pos += 0 if b <= 0x9F else 2 if b in (0xDC, 0xDE) else 4
                self.values_left -= n
                if self.values_left < 0:
                    raise WireError(f"the message holds more than {MAX_VALUES} values")
                pending += n

    def _ext(self, data: memoryview, pos: int, b: int, depth: int) -> int:
        """The position after the extension at ``pos``, its tuple payload walked."""
        w = _EXT_SIZED.get(b, 0)
        size = _EXT[b] if b in _EXT else int.from_bytes(data[pos : pos + w], "big")
        code, pos = data[pos + w : pos + w + 1].tobytes(), pos + w + 1
        if code == bytes([_TUPLE]):
            if depth >= MAX_TUPLE_DEPTH:
                raise WireError(f"tuples nested deeper than {MAX_TUPLE_DEPTH} levels")
            self.tuple_bytes_left -= size
            if self.tuple_bytes_left < 0:
                raise WireError(
                    f"nested tuples hold more than {TUPLE_COPIES} times the message's bytes"
                )
            self.values(data[pos : pos + size], depth + 1)
        return pos + size


def _items(data: memoryview, pos: int, b: int) -> int:
    """Values a list or map header at ``pos - 1`` declares (-1 for an unused byte)."""
    if 0x80 <= b <= 0x9F:  # fixmap, fixarray
        return (b & 0x0F) * (2 if b <= 0x8F else 1)
    if b in (0xDC, 0xDD, 0xDE, 0xDF):  # array16/32, map16/32
        w = 2 if b in (0xDC, 0xDE) else 4
        return int.from_bytes(data[pos : pos + w], "big") * (2 if b >= 0xDE else 1)
    return -1


def _same(obj: Any) -> Any:
    """The msgpack list and map hook: a call into Python per container, where another
    thread (the server's event loop) can take the interpreter lock."""
    return obj


def _decode(data: bytes, depth: int) -> Any:
    msgpack = _msgpack()
    try:
        return msgpack.unpackb(
            data,
            ext_hook=_ext_hook_at(depth),
            list_hook=_same,
            object_hook=_same,
            raw=False,
            strict_map_key=False,
            max_array_len=MAX_VALUES,
            max_map_len=MAX_VALUES // 2,
            timestamp=1,  # msgpack's own timestamp extension (-1): a float, not an object
        )
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"not a valid message: {type(exc).__name__}: {exc}") from None
