"""A safe JSON codec for spaces: `space_to_json`, and a strict `space_from_json` for hostile input.

Decoding validates every field, allows only numeric dtypes, and bounds nesting depth
(`MAX_JSON_DEPTH`), array sizes (`MAX_JSON_ELEMENTS`) and the bytes the decoded space's
arrays take in all (`MAX_SPACE_BYTES`), each checked before anything is allocated: a Box
whose bounds are one number each is a few bytes of JSON but allocates its whole shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tree
from gymnasium import spaces as gs

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_ELEMENTS",
    "MAX_SPACE_BYTES",
    "space_from_json",
    "space_to_json",
]

MAX_JSON_DEPTH = 32
MAX_JSON_ELEMENTS = 2**24
#: bytes the arrays of one decoded space may take in all (a Box: its low and high bounds
#: and gymnasium's two boolean masks, per element). 32 MiB holds the bounds of a float32
#: Box of 3.3 million values, e.g. a (1000, 1000, 3) frame.
MAX_SPACE_BYTES = 2**25
_INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_BOX_DTYPES = ("float16", "float32", "float64", *_INT_DTYPES)


def _enc_array(a: np.ndarray) -> Any:
    def num(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return v

    return tree.map_structure(num, a.tolist())


def space_to_json(space: gs.Space) -> dict[str, Any]:
    """Encode a space as pure JSON types (non-finite bounds as "inf", "-inf", "nan")."""
    kind = type(space).__name__
    if isinstance(space, gs.Box):
        return {
            "type": kind,
            "dtype": space.dtype.name,
            "shape": list(space.shape),
            "low": _enc_array(space.low),
            "high": _enc_array(space.high),
        }
    if isinstance(space, gs.Discrete):
        return {
            "type": kind,
            "n": int(space.n),
            "start": int(space.start),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gs.MultiDiscrete):
        return {
            "type": kind,
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": space.dtype.name,
        }
    if isinstance(space, gs.MultiBinary):
        return {"type": kind, "n": space.n if isinstance(space.n, int) else list(space.n)}
    if isinstance(space, gs.Tuple):
        return {"type": kind, "spaces": [space_to_json(s) for s in space.spaces]}
    if isinstance(space, gs.Dict):
        if not all(isinstance(k, str) for k in space.spaces):
            raise TypeError(f"only string Dict keys can be saved, got {list(space.spaces)}")
        return {"type": kind, "spaces": [[k, space_to_json(s)] for k, s in space.items()]}
    if isinstance(space, gs.Text):
        return {
            "type": kind,
            "min_length": space.min_length,
            "max_length": space.max_length,
            "charset": "".join(sorted(space.character_set)),
        }
    raise TypeError(f"cannot encode {space!r} as JSON")


# type -> (required fields, optional fields)
_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "Box": ({"shape", "low", "high"}, {"dtype"}),
    "Discrete": ({"n"}, {"start", "dtype"}),
    "MultiDiscrete": ({"nvec"}, {"start", "dtype"}),
    "MultiBinary": ({"n"}, set()),
    "Tuple": ({"spaces"}, set()),
    "Dict": ({"spaces"}, set()),
    "Text": ({"max_length"}, {"min_length", "charset"}),
}


class _Budget:
    """The bytes a decode may still allocate (``MAX_SPACE_BYTES`` for the whole space)."""

    def __init__(self) -> None:
        self.left = MAX_SPACE_BYTES

    def charge(self, nbytes: int, path: str, what: str) -> None:
        self.left -= nbytes
        if self.left < 0:
            raise ValueError(
                f"{path}: {what} would take {nbytes:,} bytes, beyond the "
                f"{MAX_SPACE_BYTES:,} bytes a decoded space may take in all "
                "(spaces.MAX_SPACE_BYTES); checked before allocating anything"
            )


def _int(v: Any, path: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{path}: expected an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ValueError(f"{path}: {v} is outside [{lo}, {hi}]")
    return v


def _float(v: Any, path: str) -> float:
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{path}: expected a number or 'inf'/'-inf'/'nan', got {type(v).__name__}")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{path}: number too large") from None


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{path}: expected a list, got {type(v).__name__}")
    return v


def _dtype(v: Any, path: str, allowed: Sequence[str]) -> np.dtype:
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{path}: dtype {v!r} is not allowed; allowed: {list(allowed)}")
    return np.dtype(v)


def _shape(v: Any, path: str) -> tuple[int, ...]:
    dims = _list(v, path)
    if len(dims) > MAX_JSON_DEPTH:
        raise ValueError(f"{path}: more than {MAX_JSON_DEPTH} dimensions")
    shape = tuple(_int(d, f"{path}[{i}]", 0, MAX_JSON_ELEMENTS) for i, d in enumerate(dims))
    if math.prod(shape) > MAX_JSON_ELEMENTS:
        raise ValueError(f"{path}: shape {shape} has more than {MAX_JSON_ELEMENTS} elements")
    return shape


def _infer_shape(v: Any, path: str) -> tuple[int, ...]:
    dims: list[int] = []
    while isinstance(v, list):
        if len(dims) >= MAX_JSON_DEPTH:
            raise ValueError(f"{path}: lists nested deeper than {MAX_JSON_DEPTH}")
        dims.append(len(v))
        if not v:
            break
        v = v[0]
    return tuple(dims)


def _nested(v: Any, shape: tuple[int, ...], path: str, leaf: Any) -> np.ndarray:
    """Parse nested lists that must have exactly ``shape``, leaf by leaf, into a float/int array."""
    items = [v]
    for depth, size in enumerate(shape):
        nxt: list[Any] = []
        for it in items:
            if not isinstance(it, list) or len(it) != size:
                raise ValueError(f"{path}: does not match shape {shape} at depth {depth}")
            nxt.extend(it)
        items = nxt
    vals = [leaf(x, path) for x in items]
    return np.array(vals, np.float64 if leaf is _float else object).reshape(shape)


def _array(v: Any, shape: tuple[int, ...], dtype: np.dtype, path: str) -> np.ndarray:
    """Bounds or counts of a declared shape, in ``dtype``; a scalar is broadcast."""
    leaf = _float if dtype.kind == "f" else _int
    if shape and not isinstance(v, list):
        return np.full(shape, _array(v, (), dtype, path), dtype)
    raw = _nested(v, shape, path, leaf)
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            arr = raw.astype(dtype)
        if np.any(np.isfinite(raw) & ~np.isfinite(arr)):
            raise ValueError(f"{path}: values do not fit {dtype}")
        return arr
    info = np.iinfo(dtype)
    if raw.size and (raw.min() < info.min or raw.max() > info.max):
        raise ValueError(f"{path}: values do not fit {dtype}")
    return raw.astype(dtype)


def _decode_leaf(kind: str, obj: dict[str, Any], path: str, budget: _Budget) -> gs.Space:
    if kind == "Box":
        dtype = _dtype(obj.get("dtype", "float32"), f"{path}.dtype", _BOX_DTYPES)
        shape = _shape(obj["shape"], f"{path}.shape")
        what = f"a {dtype} Box of shape {shape}"
        budget.charge(math.prod(shape) * (2 * dtype.itemsize + 2), path, what)
        low = _array(obj["low"], shape, dtype, f"{path}.low")
        return gs.Box(low, _array(obj["high"], shape, dtype, f"{path}.high"), shape, dtype)
    if kind == "Discrete":
        dtype = _dtype(obj.get("dtype", "int64"), f"{path}.dtype", _INT_DTYPES)
        n = _int(obj["n"], f"{path}.n", 1)
        return gs.Discrete(n, start=_int(obj.get("start", 0), f"{path}.start"), dtype=dtype)
    if kind == "MultiDiscrete":
        dtype = _dtype(obj.get("dtype", "int64"), f"{path}.dtype", _INT_DTYPES)
        shape = _infer_shape(obj["nvec"], f"{path}.nvec")
        budget.charge(math.prod(shape) * 2 * dtype.itemsize, path, f"a MultiDiscrete of {shape}")
        nvec = _array(_list(obj["nvec"], f"{path}.nvec"), shape, dtype, f"{path}.nvec")
        start = _array(obj.get("start", 0), shape, dtype, f"{path}.start")
        return gs.MultiDiscrete(nvec, dtype=dtype, start=start)
    if kind == "MultiBinary":
        n = obj["n"]
        if isinstance(n, list):
            return gs.MultiBinary(list(_shape(n, f"{path}.n")))
        return gs.MultiBinary(_int(n, f"{path}.n", 1, MAX_JSON_ELEMENTS))
    charset = obj.get("charset")
    if charset is not None and (not isinstance(charset, str) or len(charset) > 2**16):
        raise ValueError(f"{path}.charset: expected a string of at most 65536 characters")
    max_length = _int(obj["max_length"], f"{path}.max_length", 0, MAX_JSON_ELEMENTS)
    min_length = _int(obj.get("min_length", 1), f"{path}.min_length", 0)
    if charset is None:
        return gs.Text(max_length, min_length=min_length)
    return gs.Text(max_length, min_length=min_length, charset=charset)


def _decode(obj: Any, path: str, depth: int, budget: _Budget) -> gs.Space:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{path}: spaces nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected an object with a 'type', got {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise ValueError(
            f"{path}.type: unknown space type {kind!r}; known types: {sorted(_FIELDS)}"
        )
    required, optional = _FIELDS[kind]
    keys = set(obj) - {"type"}
    if required - keys:
        raise ValueError(f"{path}: {kind} is missing field(s) {sorted(required - keys)}")
    if keys - required - optional:
        raise ValueError(
            f"{path}: {kind} has unexpected field(s) "
            f"{sorted(map(repr, keys - required - optional))}"
        )
    if kind == "Tuple":
        subs = _list(obj["spaces"], f"{path}.spaces")
        return gs.Tuple(
            [_decode(s, f"{path}.spaces[{i}]", depth + 1, budget) for i, s in enumerate(subs)]
        )
    if kind == "Dict":
        pairs = _list(obj["spaces"], f"{path}.spaces")
        items: list[tuple[str, gs.Space]] = []
        for i, pair in enumerate(pairs):
            p = f"{path}.spaces[{i}]"
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise ValueError(f"{p}: expected a [key, space] pair with a string key")
            if any(pair[0] == k for k, _ in items):
                raise ValueError(f"{p}: duplicate key {pair[0]!r}")
            items.append((pair[0], _decode(pair[1], f"{p}[1]", depth + 1, budget)))
        return gs.Dict(items)
    try:
        return _decode_leaf(kind, obj, path, budget)
    except ValueError as e:
        if str(e).startswith(path):  # our own message, already names the field
            raise
        raise ValueError(f"{path}: invalid {kind}: {e}") from None
    except Exception as e:  # gymnasium's own checks (AssertionError, TypeError, ...)
        raise ValueError(f"{path}: invalid {kind}: {e}") from None


def space_from_json(obj: Any) -> gs.Space:
    """Decode `space_to_json` output, strictly: this input may come from a hostile file.

    Raises ValueError naming the JSON path for unknown types, missing/extra/wrong-typed fields,
    dtypes outside a numeric allow-list, nesting deeper than 32, shapes over 2**24 elements,
    or arrays over ``MAX_SPACE_BYTES`` in all.
    """
    return _decode(obj, "$", 1, _Budget())
