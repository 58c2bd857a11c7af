"""Python objects as JSON values: how both file formats store ``infos``, object columns
and ``meta``.

What is not JSON is converted on write (a documented fallback, not reversible):

- numpy arrays become (nested) lists, numpy scalars Python scalars, tuples lists;
- dict keys that are not strings become ``str(key)``;
- floats NaN / inf are kept (written as ``NaN`` / ``Infinity``, as Python's ``json`` does);
- any other object (bytes, sets, custom classes, complex numbers ...) becomes its
  ``repr()`` string; so does anything nested deeper than ``MAX_JSON_DEPTH`` levels.

So an ``infos`` row ``{"pos": np.array([1, 2]), "tag": b"x"}`` reads back as
``{"pos": [1, 2], "tag": "b'x'"}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["MAX_JSON_DEPTH", "json_bytes", "to_json_value"]

MAX_JSON_DEPTH = 64
"""Nesting below this depth is stored as ``repr()`` text (and refused when read back)."""


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
    if _depth > MAX_JSON_DEPTH:
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


def json_bytes(values: list[Any]) -> np.ndarray:
    """``values`` as the UTF-8 bytes of one JSON list (a uint8 array)."""
    text = json.dumps([to_json_value(v) for v in values], allow_nan=True, separators=(",", ":"))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()
