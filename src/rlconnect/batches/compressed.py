"""`CompressedColumn`: an image column held as LZ4-compressed chunks of rows.

A `SampleBatch` may hold a `CompressedColumn` in place of an array (the runner does so for
image observations with ``RunnerConfig(compress_observations=True)``). Reading the column,
``batch["obs"]``, decompresses it into a fresh array each time, so code that reads batches
never sees the difference; row operations (slices, ``take``, ``concat_samples``) keep it
compressed and touch only the chunks they need.

Rows are compressed in chunks of about 1 MiB, each as one LZ4 block. LZ4 finds repeats up
to 64 KiB back, so the frames a stacked observation shares with the row before it (3 of 4
84x84 frames, 21 KiB back) cost a few bytes each: a stored batch does not pay the k-fold
copy of frame stacking.

>>> import numpy as np
>>> frames = np.zeros((100, 4, 84, 84), np.uint8)
>>> col = CompressedColumn.compress(frames)
>>> col.shape, col.nbytes < frames.nbytes // 100
((100, 4, 84, 84), True)
>>> np.array_equal(col.decompress(), frames)
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlconnect.batches.lazy import LazyColumn

__all__ = ["CHUNK_BYTES", "CompressedColumn", "compressible"]

CHUNK_BYTES = 1 << 20
"""Uncompressed bytes per chunk (at least one row per chunk)."""


def _lz4() -> Any:
    try:
        import lz4.block
    except ImportError as exc:  # a hard dependency; this guards broken installs only
        raise ImportError("compressed columns need the lz4 package: pip install lz4") from exc
    return lz4.block


def compressible(value: Any) -> bool:
    """True for arrays worth compressing: numeric images, ``(rows, H, W[, ...])``."""
    return (
        isinstance(value, np.ndarray)
        and value.ndim >= 3
        and value.dtype != object
        and value.dtype.kind in "uifb"
    )


class CompressedColumn(LazyColumn):
    """Rows of one array, LZ4-compressed in chunks; immutable (a `LazyColumn`).

    Build with `CompressedColumn.compress(array)`; get the array back with
    `decompress()` (or ``np.asarray(col)``). ``nbytes`` is the compressed size,
    ``raw_nbytes`` the size of the array it stands for.
    """

    __slots__ = ("_chunks", "_offsets", "dtype", "shape")

    def __init__(
        self,
        chunks: Sequence[bytes],
        counts: Sequence[int],
        row_shape: tuple[int, ...],
        dtype: Any,
    ) -> None:
        if len(chunks) != len(counts):
            raise ValueError(f"{len(chunks)} chunks but {len(counts)} row counts")
        self._chunks = tuple(chunks)
        self._offsets = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        self.dtype = np.dtype(dtype)
        self.shape = (int(self._offsets[-1]), *row_shape)

    @classmethod
    def compress(cls, array: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> CompressedColumn:
        """Compress ``array``'s rows (its first axis) in chunks of about ``chunk_bytes``."""
        array = np.ascontiguousarray(array)
        if array.ndim == 0 or array.dtype == object:
            raise ValueError(f"cannot compress an array of shape {array.shape}, {array.dtype}")
        row_bytes = max(int(np.prod(array.shape[1:])) * array.dtype.itemsize, 1)
        per_chunk = max(1, chunk_bytes // row_bytes)
        block = _lz4()
        chunks, counts = [], []
        for start in range(0, len(array), per_chunk):
            part = array[start : start + per_chunk]
            chunks.append(block.compress(part, store_size=False))
            counts.append(len(part))
        return cls(chunks, counts, array.shape[1:], array.dtype)

    @property
    def nbytes(self) -> int:
        """Compressed bytes held."""
        return sum(len(c) for c in self._chunks)

    def _chunk(self, i: int) -> np.ndarray:
        n = int(self._offsets[i + 1] - self._offsets[i])
        row_shape = self.shape[1:]
        size = n * int(np.prod(row_shape)) * self.dtype.itemsize
        raw = _lz4().decompress(self._chunks[i], uncompressed_size=size)
        return np.frombuffer(raw, self.dtype).reshape(n, *row_shape)

    def decompress(self) -> np.ndarray:
        """The whole column as a fresh, writable array."""
        out = np.empty(self.shape, self.dtype)
        for i in range(len(self._chunks)):
            out[self._offsets[i] : self._offsets[i + 1]] = self._chunk(i)
        return out

    materialize = decompress

    def rows(self, index: Any) -> np.ndarray:
        """The rows at ``index`` (slice, int array or bool mask), decompressing only the
        chunks they lie in."""
        idx = np.arange(len(self))[index]
        out = np.empty((len(idx), *self.shape[1:]), self.dtype)
        if not len(idx):
            return out
        which = np.searchsorted(self._offsets, idx, side="right") - 1
        for c in np.unique(which).tolist():
            at = which == c
            out[at] = self._chunk(c)[idx[at] - self._offsets[c]]
        return out

    def take(self, index: Any) -> CompressedColumn:
        """A compressed column of the rows at ``index``; whole chunks are reused as they are."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and start in self._offsets and (stop in self._offsets or stop <= start):
                return self._whole_chunks(start, max(start, stop))
        return CompressedColumn.compress(self.rows(index))

    def _whole_chunks(self, start: int, stop: int) -> CompressedColumn:
        first = int(np.searchsorted(self._offsets, start))
        last = int(np.searchsorted(self._offsets, stop))
        counts = np.diff(self._offsets[first : last + 1]).tolist()
        return CompressedColumn(self._chunks[first:last], counts, self.shape[1:], self.dtype)

    @classmethod
    def concat(
        cls, columns: Sequence[CompressedColumn], memo: dict | None = None
    ) -> CompressedColumn:
        """Rows of ``columns`` one after another, without recompressing."""
        first = columns[0]
        for c in columns[1:]:
            if c.shape[1:] != first.shape[1:] or c.dtype != first.dtype:
                raise ValueError(
                    f"cannot concatenate compressed columns of rows {first.shape[1:]} "
                    f"{first.dtype} and {c.shape[1:]} {c.dtype}"
                )
        chunks = [ch for c in columns for ch in c._chunks]
        counts = [int(n) for c in columns for n in np.diff(c._offsets)]
        return CompressedColumn(chunks, counts, first.shape[1:], first.dtype)

    def __repr__(self) -> str:
        ratio = self.raw_nbytes / max(self.nbytes, 1)
        return f"CompressedColumn({self.shape}, {self.dtype}, lz4 {ratio:.1f}x)"
