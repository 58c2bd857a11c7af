"""Column-wise row storage that appends a whole step in O(1) and concatenates lazily.

The hot path appends one *chunk* per step (a dict of whole arrays, kept by reference) and
may complete that chunk's columns afterwards (the policy's outputs). Reading consolidates
the chunks into one array per column with a single ``np.concatenate``, so the per-step cost
does not grow with the number of columns' rows, and the per-batch cost is one copy.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import tree

from rlconnect.batches.take import take_rows

__all__ = ["ColumnStore", "fill_rows"]


_MISSING = object()
MERGE_EVERY = 256  # chunks appended one by one are merged in groups of this many
_SCALARS = {int, float, bool, np.int64, np.float64, np.bool_, np.int32, np.float32}


def _is_leaf(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def _is_nest(value: Any) -> bool:
    return isinstance(value, dict | tuple)


def _expand(value: Any, n: int) -> Any:
    """A chunk's value as rows: arrays and nests as they are, a list as an object array,
    a scalar repeated ``n`` times (cheap to append, expanded only when read)."""
    if isinstance(value, np.ndarray) or _is_nest(value):
        return value
    if isinstance(value, list):
        out = np.empty(n, dtype=object)
        for i, v in enumerate(value):  # element-wise: numpy must not broadcast dicts
            out[i] = v
        return out
    return np.full(n, value)


def _template(value: Any) -> Any:
    """One row's worth of ``value``, remembering dtype and row shape."""
    if isinstance(value, np.ndarray) or _is_nest(value):
        return value
    return _expand(value if not isinstance(value, list) else value[:1], 1)


def _zeros_like_rows(template: Any, n: int) -> Any:
    """``n`` zero rows shaped like ``template``'s rows (a leaf or a nest of leaves)."""
    if _is_leaf(template):
        return np.zeros((n, *template.shape[1:]), dtype=template.dtype)
    return tree.map_structure(lambda t: np.zeros((n, *t.shape[1:]), dtype=t.dtype), template)


def fill_rows(value: Any, where: np.ndarray | None, n: int) -> Any:
    """``n`` rows shaped like ``value``'s: ``value`` where ``where`` is true, zeros elsewhere
    (all zeros for ``where=None``)."""
    if type(value) is np.ndarray:  # the common case, without the calls below
        col = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
        if where is not None:
            col[where] = value
        return col
    col = _zeros_like_rows(_template(value), n)
    if where is not None:
        if _is_leaf(col):
            col[where] = value
        else:
            tree.map_structure(lambda c, v: c.__setitem__(where, v), col, value)
    return col


def _merge_column(
    chunks: list[dict[str, Any]], lengths: list[int], name: str, template: Any
) -> Any:
    """One column of ``chunks`` as one array: a single numpy call per column in the common
    cases (all arrays, all lists, all scalars), chunk by chunk otherwise."""
    values = [c.get(name, _MISSING) for c in chunks]
    kinds = set(map(type, values))
    if kinds == {np.ndarray, object} and isinstance(template, np.ndarray):
        values = [
            _zeros_like_rows(template, n) if v is _MISSING else v for v, n in zip(values, lengths)
        ]
        kinds = {np.ndarray}
    if kinds == {np.ndarray}:
        return np.concatenate(values) if len(values) > 1 else values[0]
    if kinds == {list}:
        return np.fromiter(chain.from_iterable(values), dtype=object, count=sum(lengths))
    if kinds <= _SCALARS:
        return np.repeat(np.asarray(values), lengths)
    parts = [
        _zeros_like_rows(template, n) if v is _MISSING else _expand(v, n)
        for v, n in zip(values, lengths)
    ]
    return _concat(parts)


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if _is_leaf(parts[0]):
        return np.concatenate(parts)
    return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


class ColumnStore:
    """Named columns (arrays or nests of arrays) sharing one row axis.

    Arrays passed to ``append`` / ``write_last`` are kept by reference until the next
    consolidation: callers hand over fresh arrays and do not mutate them afterwards.
    A column missing from some chunk reads as zeros there.
    """

    def __init__(self) -> None:
        self.size = 0
        self._chunks: list[dict[str, Any]] = []
        self._lengths: list[int] = []
        self._merged_upto = 0  # chunks before this index are already merged ones
        self._templates: dict[str, Any] = {}  # one example per column: dtype and row shape

    def __len__(self) -> int:
        return self.size

    def __contains__(self, name: object) -> bool:
        return name in self._templates

    @property
    def names(self) -> list[str]:
        """Column names, in order of first appearance."""
        return list(self._templates)

    def append(self, columns: dict[str, Any], n: int) -> int:
        """Append ``n`` rows (one chunk, which the store now owns); returns the first row's index.

        A value is an array (or nest of arrays) of ``n`` rows, a list of ``n`` objects, or a
        scalar that every row shares.
        """
        start = self.size
        templates = self._templates
        for name, value in columns.items():
            if name not in templates:
                templates[name] = _template(value)
        if len(self._chunks) - self._merged_upto > MERGE_EVERY:
            self._merge_tail()
        self._chunks.append(columns)
        self._lengths.append(n)
        self.size = start + n
        return start

    def write_last(self, name: str, value: Any, where: np.ndarray | None = None) -> None:
        """Set column ``name`` of the last chunk: all its rows, or the rows ``where`` is true."""
        chunk, n = self._chunks[-1], self._lengths[-1]
        if name not in self._templates:
            self._templates[name] = _template(value)
        if where is None:
            chunk[name] = value
            return
        col = chunk.get(name)
        if col is None:
            col = _zeros_like_rows(value, n)
            chunk[name] = col
        if _is_leaf(col):
            col[where] = value
        else:
            tree.map_structure(lambda c, v: c.__setitem__(where, v), col, value)

    def _merge(self, chunks: list[dict[str, Any]], lengths: list[int]) -> dict[str, Any]:
        """One chunk holding the rows of ``chunks``, one array per column."""
        merged: dict[str, Any] = {"__merged__": True}
        for name, template in self._templates.items():
            merged[name] = _merge_column(chunks, lengths, name, template)
        return merged

    def _merge_tail(self) -> None:
        """Merge the chunks appended since the last merge (called before an append, so
        ``write_last`` is done with them): memory grows with rows, not with steps."""
        lo, hi = self._merged_upto, len(self._chunks)
        merged = self._merge(self._chunks[lo:hi], self._lengths[lo:hi])
        self._chunks[lo:hi] = [merged]
        self._lengths[lo:hi] = [sum(self._lengths[lo:hi])]
        self._merged_upto = lo + 1

    def _consolidate(self) -> dict[str, Any]:
        if not self._chunks:
            return {}
        if len(self._chunks) == 1 and self._chunks[0].get("__merged__"):
            return self._chunks[0]
        merged = self._merge(self._chunks, self._lengths)
        self._chunks = [merged]
        self._lengths = [self.size]
        self._merged_upto = 1
        return merged

    def column(self, name: str) -> Any:
        """The whole column (consolidates pending chunks)."""
        merged = self._consolidate()
        if name in merged:
            return merged[name]
        return _zeros_like_rows(self._templates[name], self.size)

    def take(self, name: str, rows: np.ndarray) -> Any:
        """A copy of column ``name`` at ``rows``."""
        return take_rows(self.column(name), rows)

    def update_last(self, columns: dict[str, Any]) -> None:
        """Set several columns for all rows of the last chunk."""
        templates = self._templates
        for name, value in columns.items():
            if name not in templates:
                templates[name] = _template(value)
        self._chunks[-1].update(columns)

    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (in the given order); everything else is dropped."""
        merged: dict[str, Any] = {name: self.take(name, rows) for name in self._templates}
        merged["__merged__"] = True
        self.size = len(rows)
        self._chunks = [merged] if self.size else []
        self._lengths = [self.size] if self.size else []
        self._merged_upto = len(self._chunks)

    def nbytes(self) -> int:
        """Bytes referenced by all columns."""
        return sum(
            leaf.nbytes
            for chunk, n in zip(self._chunks, self._lengths)
            for name, col in chunk.items()
            if name != "__merged__"
            for leaf in tree.flatten(_expand(col, n))
        )
