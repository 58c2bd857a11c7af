"""Column-wise row storage that appends a whole step in O(1) and concatenates lazily.

Recording appends one *chunk* per step: a dict of whole columns, kept by reference, which
is all the hot path does (no per-column work). Every ``MERGE_EVERY`` chunks are merged
into one array per column, so memory grows with rows and not with steps, and reading a
column merges what is left: one ``np.concatenate`` per column per merge, whatever the
number of sub-envs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import tree

from rlconnect.batches.take import take_rows

__all__ = ["MERGE_EVERY", "ColumnStore", "fill_rows", "zeros_like_rows"]


_MISSING: Any = object()
MERGE_EVERY = 256  # chunks appended one by one are merged in groups of this many
_SCALARS = {int, float, bool, np.int64, np.float64, np.bool_, np.int32, np.float32}
_NUMBERS_OR_ARRAYS = _SCALARS | {np.ndarray}
_DTYPE_OF = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64)}


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


def _no_rows(leaf: Any) -> np.ndarray:
    leaf = np.asarray(leaf)
    return np.empty((0, *leaf.shape[1:]), leaf.dtype)


def _template(value: Any) -> Any:
    """``value``'s dtype and row shape, as arrays of no rows (holding none of its data)."""
    if isinstance(value, np.ndarray):
        return _no_rows(value)
    if _is_nest(value):
        return tree.map_structure(_no_rows, value)
    return _no_rows(_expand(value if not isinstance(value, list) else value[:1], 1))


def zeros_like_rows(template: Any, n: int) -> Any:
    """``n`` zero rows shaped like ``template``'s rows (a leaf or a nest of leaves)."""
    if _is_leaf(template):
        return np.zeros((n, *template.shape[1:]), dtype=template.dtype)
    return tree.map_structure(lambda t: np.zeros((n, *t.shape[1:]), dtype=t.dtype), template)


def fill_rows(value: Any, where: np.ndarray, n: int) -> Any:
    """``n`` rows shaped like ``value``'s: ``value`` where ``where`` is true, zeros elsewhere."""
    if type(value) is np.ndarray:  # the common case, without the calls below
        col = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
        col[where] = value
        return col
    col = zeros_like_rows(_template(value), n)
    if _is_leaf(col):
        col[where] = value
    else:
        tree.map_structure(lambda c, v: c.__setitem__(where, v), col, value)
    return col


def _values_of(chunks: list[dict[str, Any]], name: str) -> list[Any]:
    """Column ``name``'s value in each chunk (``_MISSING`` where a chunk has none)."""
    try:
        return list(map(itemgetter(name), chunks))  # (a map: no Python loop per chunk)
    except KeyError:
        return [c.get(name, _MISSING) for c in chunks]


def _merge_column(values: list[Any], lengths: list[int], counts: np.ndarray, template: Any) -> Any:
    """One column as one array from its value in each chunk (``counts``: ``lengths`` as an
    array): a single numpy call in the common cases (all arrays, all lists, all numbers),
    chunk by chunk otherwise; a chunk without the column reads as zeros."""
    kinds = set(map(type, values))
    if kinds == {np.ndarray, object} and _is_leaf(template):  # arrays, and chunks without
        values = [
            zeros_like_rows(template, n) if v is _MISSING else v for v, n in zip(values, lengths)
        ]
        kinds = {np.ndarray}
    if kinds == {np.ndarray}:
        return np.concatenate(values) if len(values) > 1 else values[0]
    if kinds == {list}:
        return np.fromiter(chain.from_iterable(values), dtype=object, count=sum(lengths))
    if kinds <= _SCALARS:
        return np.repeat(_numbers(values, kinds), counts)
    if np.ndarray in kinds and kinds <= _NUMBERS_OR_ARRAYS and template.ndim == 1:
        return _numbers_and_arrays(values, lengths, counts, kinds - {np.ndarray})
    parts = [
        zeros_like_rows(template, n) if v is _MISSING else _expand(v, n)
        for v, n in zip(values, lengths)
    ]
    if len(parts) == 1:
        return parts[0]
    if _is_leaf(parts[0]):
        return np.concatenate(parts)
    return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def _numbers(values: list[Any], kinds: set[type]) -> np.ndarray:
    """Numbers as an array; Python numbers of one type are read without numpy having to
    discover their type one by one (several times cheaper)."""
    dtype = _DTYPE_OF.get(next(iter(kinds))) if len(kinds) == 1 else None
    if dtype is None:
        return np.asarray(values)
    return np.fromiter(values, dtype, len(values))


def _positions(items: list[Any], item: Any) -> list[int]:
    """Where ``item`` is in ``items``: found by ``list.index`` (a C loop), so a few hits in
    a long list cost little."""
    found: list[int] = []
    with suppress(ValueError):
        while True:
            found.append(items.index(item, found[-1] + 1 if found else 0))
    return found


def _numbers_and_arrays(
    values: list[Any], lengths: list[int], counts: np.ndarray, kinds: set[type]
) -> np.ndarray:
    """A 1-D column whose chunks give either one number for all their rows or an array
    (a flag set in a few chunks only): the numbers repeated in one call, then each
    array written in place."""
    arrays = _positions(list(map(type, values)), np.ndarray)
    numbers = list(values)
    fill = next(v for v in values if type(v) is not np.ndarray)  # a number of the same kind
    for i in arrays:
        numbers[i] = fill
    repeated = _numbers(numbers, kinds)
    dtype = np.result_type(repeated.dtype, *{values[i].dtype for i in arrays})
    out = np.repeat(repeated.astype(dtype, copy=False), counts)
    starts = (np.cumsum(counts) - counts)[arrays].tolist()
    for i, start in zip(arrays, starts):
        out[start : start + lengths[i]] = values[i]
    return out


class ColumnStore:
    """Named columns (arrays or nests of arrays) sharing one row axis.

    Chunks passed to ``append`` are kept by reference until they are merged: callers hand
    over fresh dicts of fresh arrays and do not mutate them afterwards. A column missing
    from some chunk reads as zeros there.
    """

    def __init__(self) -> None:
        self.size = 0
        self._chunks: list[dict[str, Any]] = []
        self._lengths: list[int] = []
        self._merged = 0  # how many of the first chunks are merged ones
        self._templates: dict[str, Any] = {}  # one example per column: dtype and row shape

    def __len__(self) -> int:
        return self.size

    def __contains__(self, name: object) -> bool:
        return name in self.names

    @property
    def names(self) -> list[str]:
        """Column names, in order of first appearance."""
        self._learn(self._chunks[self._merged :])
        return list(self._templates)

    def append(self, columns: dict[str, Any], n: int) -> int:
        """Append ``n`` rows (one chunk, which the store now owns); returns the first row's index.

        A value is an array (or nest of arrays) of ``n`` rows, a list of ``n`` objects, or a
        scalar that every row shares.
        """
        start = self.size
        chunks = self._chunks
        chunks.append(columns)
        self._lengths.append(n)
        self.size = start + n
        if len(chunks) - self._merged >= MERGE_EVERY:
            self._merge_from(self._merged)
        return start

    def _learn(self, chunks: list[dict[str, Any]]) -> None:
        """Add the columns of ``chunks`` not seen before, in order, with their templates."""
        templates = self._templates
        for name in dict.fromkeys(chain.from_iterable(chunks)):
            if name not in templates:
                value = next(c[name] for c in chunks if name in c)
                templates[name] = _template(value)

    def _columns_of(self, chunks: list[dict[str, Any]]) -> list[Sequence[Any]]:
        """Each column's value in every chunk, in the order of ``self._templates``."""
        names = list(self._templates)
        if len(names) > 1 and sum(map(len, chunks)) == len(names) * len(chunks):
            try:  # each chunk has as many columns as are known, and all of them: no others
                return list(zip(*map(itemgetter(*names), chunks)))
            except KeyError:
                pass
        self._learn(chunks)
        return [_values_of(chunks, name) for name in self._templates]

    def _merge_from(self, first: int) -> dict[str, Any]:
        """Merge the chunks from index ``first`` on into one, one array per column."""
        chunks, lengths = self._chunks[first:], self._lengths[first:]
        columns = self._columns_of(chunks)
        counts = np.fromiter(lengths, np.int64, len(lengths))
        merged = {
            name: _merge_column(list(values), lengths, counts, template)
            for (name, template), values in zip(self._templates.items(), columns)
        }
        self._chunks[first:] = [merged]
        self._lengths[first:] = [sum(lengths)]
        self._merged = first + 1
        return merged

    def _consolidate(self) -> dict[str, Any]:
        """One merged chunk: the appended ones merged first (values of one kind per column),
        then with the merged ones (arrays only: one ``np.concatenate`` per column)."""
        if not self._chunks:
            return {}
        if len(self._chunks) > self._merged:
            self._merge_from(self._merged)
        if len(self._chunks) > 1:
            self._merge_from(0)
        return self._chunks[0]

    def column(self, name: str) -> Any:
        """The whole column (merges pending chunks)."""
        merged = self._consolidate()
        if name in merged:
            return merged[name]
        return zeros_like_rows(self._templates[name], self.size)

    def take(self, name: str, rows: np.ndarray) -> Any:
        """A copy of column ``name`` at ``rows``."""
        return take_rows(self.column(name), rows)

    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (in the given order); everything else is dropped."""
        merged = {name: self.take(name, rows) for name in self.names}
        self.size = len(rows)
        self._chunks = [merged] if self.size else []
        self._lengths = [self.size] if self.size else []
        self._merged = len(self._chunks)

    def nbytes(self) -> int:
        """Bytes referenced by all columns."""
        return sum(
            leaf.nbytes
            for chunk, n in zip(self._chunks, self._lengths)
            for col in chunk.values()
            for leaf in tree.flatten(_expand(col, n))
        )
