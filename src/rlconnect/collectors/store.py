"""Growable column-wise row storage: whole batches of rows appended per step, no per-row work."""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

__all__ = ["ColumnStore"]


def _alloc(like: np.ndarray, capacity: int) -> np.ndarray:
    return np.zeros((capacity, *like.shape[1:]), dtype=like.dtype)


class ColumnStore:
    """Named columns (arrays or nests of arrays) sharing one growing row axis.

    ``append`` adds rows to every given column at once; columns missing from a call are
    zero-filled for those rows. ``write`` fills a column for some existing rows (e.g. the
    actions of rows that acted). Capacity doubles, so appends are amortised O(rows).
    """

    def __init__(self, capacity: int = 64) -> None:
        self.size = 0
        self._capacity = capacity
        self._cols: dict[str, Any] = {}  # name -> array or nest of arrays

    def __len__(self) -> int:
        return self.size

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    @property
    def names(self) -> list[str]:
        """Column names."""
        return list(self._cols)

    def _grow(self, needed: int) -> None:
        cap = self._capacity
        while cap < needed:
            cap *= 2
        if cap == self._capacity:
            return

        def grow(a: np.ndarray) -> np.ndarray:
            out = _alloc(a, cap)
            out[: self.size] = a[: self.size]
            return out

        for name, col in self._cols.items():
            self._cols[name] = (
                grow(col) if isinstance(col, np.ndarray) else tree.map_structure(grow, col)
            )
        self._capacity = cap

    def _ensure(self, name: str, value: Any) -> Any:
        col = self._cols.get(name)
        if col is None:
            if isinstance(value, np.ndarray):
                col = _alloc(value, self._capacity)
            else:
                col = tree.map_structure(lambda v: _alloc(np.asarray(v), self._capacity), value)
            self._cols[name] = col
        return col

    def append(self, columns: dict[str, Any], n: int) -> np.ndarray:
        """Append ``n`` rows; returns their row indices."""
        start = self.size
        self._grow(start + n)
        stop = start + n
        for name, value in columns.items():
            col = self._ensure(name, value)
            if isinstance(col, np.ndarray):
                col[start:stop] = value
            else:
                tree.map_structure(lambda c, v: c.__setitem__(slice(start, stop), v), col, value)
        self.size = stop
        return np.arange(start, stop)

    def write(self, name: str, rows: np.ndarray, value: Any) -> None:
        """Set column ``name`` at existing ``rows`` (creating the column if new)."""
        col = self._ensure(name, value)
        if isinstance(col, np.ndarray):
            col[rows] = value
        else:
            tree.map_structure(lambda c, v: c.__setitem__(rows, v), col, value)

    def column(self, name: str) -> Any:
        """The live column (only the first ``size`` rows are meaningful)."""
        col = self._cols[name]
        if isinstance(col, np.ndarray):
            return col[: self.size]
        return tree.map_structure(lambda c: c[: self.size], col)

    def take(self, name: str, rows: np.ndarray) -> Any:
        """A copy of column ``name`` at ``rows``."""
        col = self._cols[name]
        if isinstance(col, np.ndarray):
            return col[rows]
        return tree.map_structure(lambda c: c[rows], col)

    def keep(self, rows: np.ndarray) -> None:
        """Keep only ``rows`` (in the given order); everything else is dropped."""
        n = len(rows)
        for col in self._cols.values():
            if isinstance(col, np.ndarray):
                col[:n] = col[rows]
            else:
                tree.map_structure(lambda c: c.__setitem__(slice(0, n), c[rows]), col)
        # drop references held by object columns beyond the kept rows
        for col in self._cols.values():
            for leaf in tree.flatten(col):
                if leaf.dtype == object:
                    leaf[n : self.size] = None
        self.size = n

    def nbytes(self) -> int:
        """Bytes allocated by all columns."""
        return sum(leaf.nbytes for col in self._cols.values() for leaf in tree.flatten(col))
