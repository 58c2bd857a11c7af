"""`LazyColumn`: a batch column stored in another form than one array, read as one.

A `SampleBatch` may hold a lazy column in place of an array. Reading it, ``batch["obs"]``,
*materialises* it: a fresh array each time, so code that reads batches never sees the
difference (and writing into that array does not change the batch: assign the column
back instead). Row operations (slices, ``take``, ``concat_samples``) keep columns lazy.

Two kinds exist:

- `rlconnect.batches.compressed.CompressedColumn`: rows LZ4-compressed in chunks
  (``RunnerConfig(compress_observations=True)``);
- `rlconnect.batches.frame_stacks.FrameStackColumn`: rows of stacked frames held as each
  distinct frame once plus an ``(n, k)`` index (what the runner stores for frame stacks).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["LazyColumn", "concat_lazy"]


class LazyColumn(abc.ABC):
    """A read-only column of ``shape[0]`` rows that becomes an array when read.

    Subclasses set ``shape`` and ``dtype`` (those of the array it stands for) and implement
    `materialize`, `take`, `nbytes` and `concat`.
    """

    __slots__ = ()

    shape: tuple[int, ...]
    dtype: np.dtype

    @abc.abstractmethod
    def materialize(self) -> np.ndarray:
        """The whole column as a fresh, writable array."""

    @abc.abstractmethod
    def take(self, index: Any) -> LazyColumn:
        """A column of the rows at ``index`` (slice, int array or bool mask), still lazy."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes held (what the column costs in memory, not what it stands for)."""

    @classmethod
    @abc.abstractmethod
    def concat(cls, columns: Sequence[Any], memo: dict | None = None) -> LazyColumn:
        """Rows of ``columns`` (all of this class) one after another, still lazy.

        ``memo`` is shared by the columns of one batch concatenation, so storage that
        several columns share (one frame pool for ``obs`` and ``new_obs``) stays shared.
        """

    def storage(self) -> tuple[Any, ...]:
        """The objects (with an ``nbytes``) holding the data; ``SampleBatch.nbytes`` counts
        one shared by several columns once."""
        return (self,)

    # -- array-like ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        """Dimensions of the array it stands for."""
        return len(self.shape)

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the materialised array."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.materialize()
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self) -> LazyColumn:
        """Itself: a lazy column is immutable."""
        return self


def concat_lazy(columns: Sequence[Any], memo: dict | None = None) -> LazyColumn | None:
    """``columns`` concatenated and still lazy when all are lazy columns of one class;
    None otherwise (the caller concatenates the materialised arrays)."""
    kinds = {type(c) for c in columns}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if not issubclass(kind, LazyColumn):
        return None
    return kind.concat(columns, memo)
