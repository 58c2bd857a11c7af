"""`FrameStackColumn`: stacked frames stored once each, plus an ``(n, k)`` index.

A frame stack ``(n, k, *frame)`` repeats every frame k times (row t is row t-1 shifted by
one frame), and ``new_obs[t]`` repeats ``obs[t + 1]``: a plain batch stores each frame
2k times. A `FrameStackColumn` holds a *pool* of distinct frames and, per row, the pool
position of each of its k frames; ``obs`` and ``new_obs`` share one pool. Reading the
column gathers ``pool[index]`` into a fresh array (a `LazyColumn`).

`share_frames` builds the pair from plain ``obs`` / ``new_obs`` arrays;
`transition_observations` builds it straight from a collector's rows, so a batch never
holds the stacks whole. Neither trusts the layout: a frame is shared only where the stored
values are equal, row by row, and any other row stores its k frames in full (the first row
of an episode, whose stack is padded with copies of one frame; a trajectory's first row in
the batch; anything not a frame stack).

>>> import numpy as np
>>> frames = np.arange(7 * 2 * 2, dtype=np.uint8).reshape(7, 2, 2)  # one trajectory
>>> obs = np.stack([frames[t : t + 4] for t in range(3)])           # (3, 4, 2, 2)
>>> new_obs = np.stack([frames[t + 1 : t + 5] for t in range(3)])
>>> col, new_col = share_frames(obs, new_obs)
>>> col.pool_frames, col.shape  # 7 distinct frames for the 24 of obs and new_obs
(7, (3, 4, 2, 2))
>>> np.array_equal(col.materialize(), obs) and np.array_equal(new_col.materialize(), new_obs)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rlconnect.batches.columns import IMAGE_COLUMNS, NEXT_OBS_OF
from rlconnect.batches.compressed import CompressedColumn, compressible
from rlconnect.batches.lazy import LazyColumn
from rlconnect.batches.take import take_rows

__all__ = [
    "FrameStackColumn",
    "pack_image_columns",
    "share_frames",
    "transition_observations",
]

Pool = np.ndarray | CompressedColumn
_ROWS_PER_PASS = 256  # rows compared at once: keeps the comparison's temporaries small


class FrameStackColumn(LazyColumn):
    """Rows ``pool[index[t]]`` of shape ``(k, *frame)``; immutable (a `LazyColumn`).

    Args:
        pool: the distinct frames ``(P, *frame)``, an array or a `CompressedColumn`.
        index: ``(n, k)`` positions in ``pool``, newest frame last.
    """

    __slots__ = ("dtype", "index", "pool", "shape")

    def __init__(self, pool: Pool, index: np.ndarray) -> None:
        index = _read_only(np.asarray(index))
        if index.ndim != 2 or not np.issubdtype(index.dtype, np.integer):
            raise ValueError(f"index must be an (n, k) int array, got {index.shape} {index.dtype}")
        if index.size and (index.min() < 0 or index.max() >= len(pool)):
            raise ValueError(f"index points outside the pool of {len(pool)} frames")
        if isinstance(pool, np.ndarray):
            pool = _read_only(pool)  # shared by columns and slices: never written
        self.pool, self.index = pool, index
        self.dtype = np.dtype(pool.dtype)
        self.shape = (index.shape[0], index.shape[1], *pool.shape[1:])

    @property
    def pool_frames(self) -> int:
        """Frames in the pool (shared with other columns and slices of the same batch)."""
        return len(self.pool)

    @property
    def nbytes(self) -> int:
        """Bytes of the pool plus the index (a pool shared with ``new_obs`` counts in both;
        ``SampleBatch.nbytes`` counts it once)."""
        return int(self.pool.nbytes) + int(self.index.nbytes)

    def storage(self) -> tuple[Any, ...]:
        """The pool and the index."""
        return (self.pool, self.index)

    def materialize(self) -> np.ndarray:
        """The stacks as a fresh ``(n, k, *frame)`` array."""
        pool = self.pool
        if isinstance(pool, CompressedColumn):
            if self.index.size < len(pool) // 2:  # a few rows (a slice): only their chunks
                return pool.rows(self.index.ravel()).reshape(self.shape)
            pool = pool.decompress()
        return pool[self.index]

    def take(self, index: Any) -> FrameStackColumn:
        """The rows at ``index``, sharing this column's pool (no frame is copied)."""
        return FrameStackColumn(self.pool, self.index[index])

    def compressed(self, memo: dict | None = None) -> FrameStackColumn:
        """The same rows with an LZ4-compressed pool (``memo`` compresses a shared pool
        once)."""
        if isinstance(self.pool, CompressedColumn):
            return self
        memo = {} if memo is None else memo
        key = ("lz4", id(self.pool))
        if key not in memo:
            memo[key] = (self.pool, CompressedColumn.compress(self.pool))
        return FrameStackColumn(memo[key][1], self.index)

    @classmethod
    def concat(
        cls, columns: Sequence[FrameStackColumn], memo: dict | None = None
    ) -> FrameStackColumn:
        """Rows of ``columns`` one after another. Their distinct pools are joined once
        (columns sharing a pool keep sharing it; ``memo`` shares the joined pool between
        the columns of one batch concatenation)."""
        first = columns[0]
        for c in columns[1:]:
            if c.shape[1:] != first.shape[1:] or c.dtype != first.dtype:
                raise ValueError(
                    f"cannot concatenate frame stacks of rows {first.shape[1:]} {first.dtype} "
                    f"and {c.shape[1:]} {c.dtype}"
                )
        pools = list({id(c.pool): c.pool for c in columns}.values())
        memo = {} if memo is None else memo
        key = ("concat", *(id(p) for p in pools))
        if key not in memo:
            memo[key] = (pools, _join_pools(pools))  # the pools are kept alive with their ids
        pool = memo[key][1]
        starts = np.cumsum([0, *(len(p) for p in pools)])
        offset = {id(p): int(s) for p, s in zip(pools, starts)}
        index = np.concatenate([c.index + offset[id(c.pool)] for c in columns])
        return FrameStackColumn(pool, index)

    def __repr__(self) -> str:
        ratio = self.raw_nbytes / max(self.nbytes, 1)
        frames = f"{len(self.pool)} frames"
        return f"FrameStackColumn({self.shape}, {self.dtype}, {frames}, {ratio:.1f}x)"


def _read_only(array: np.ndarray) -> np.ndarray:
    """``array`` if it is read-only, else a read-only view of it (the caller's array keeps
    its flags; pools are shared by identity, so a read-only pool is kept as it is)."""
    if not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def _join_pools(pools: list[Pool]) -> Pool:
    if len(pools) == 1:
        return pools[0]
    compressed = [p for p in pools if isinstance(p, CompressedColumn)]
    if len(compressed) == len(pools):
        return CompressedColumn.concat(compressed)
    return _read_only(np.concatenate([np.asarray(p) for p in pools]))


def _words(stacks: np.ndarray) -> np.ndarray:
    """``(n, k, w)`` view of ``(n, k, *frame)`` with each frame as w machine words, so
    comparing frames compares up to 8 bytes at a time."""
    frame_bytes = stacks.dtype.itemsize * int(np.prod(stacks.shape[2:]))
    word = next(w for w in (8, 4, 2, 1) if frame_bytes % w == 0)
    flat = np.ascontiguousarray(stacks).reshape(len(stacks), stacks.shape[1], -1)
    return flat.view(f"u{word}")


def _equal(
    a: np.ndarray, a_rows: np.ndarray, a_frames: slice,
    b: np.ndarray, b_rows: np.ndarray, b_frames: slice,
) -> np.ndarray:  # fmt: skip
    """Per t: frames ``a_frames`` of row ``a_rows[t]`` of ``a`` equal frames ``b_frames`` of
    row ``b_rows[t]`` of ``b`` (word views), a few rows at a time."""
    out = np.empty(len(a_rows), dtype=bool)
    for s in range(0, len(a_rows), _ROWS_PER_PASS):
        part = a[a_rows[s : s + _ROWS_PER_PASS], a_frames]
        part = part == b[b_rows[s : s + _ROWS_PER_PASS], b_frames]
        out[s : s + _ROWS_PER_PASS] = part.reshape(len(part), -1).all(axis=1)
    return out


def _looks_stacked(a: Any, a_row: int, b: Any, b_row: int) -> bool:
    """``a`` / ``b``: frame stacks of images ``(n, k, H, W...)``, ``k >= 2``, with row
    ``b_row`` of ``b`` one frame on from row ``a_row`` of ``a`` (a cheap first test)."""
    if not (compressible(a) and isinstance(b, np.ndarray)) or a.ndim < 4 or a.shape[1] < 2:
        return False
    if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(b[b_row, :-1], a[a_row, 1:]))


def _last_frames(rows: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """Frame numbers (row * k + frame) of the last ``counts[t]`` frames of each row t."""
    total = int(counts.sum())
    first = rows * k + k - counts
    return np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(total)


def _pack(
    a: np.ndarray, a_rows: np.ndarray, b: np.ndarray, b_rows: np.ndarray,
    same: np.ndarray | None,
) -> tuple[FrameStackColumn, FrameStackColumn] | None:  # fmt: skip
    """The obs ``a[a_rows]`` and new_obs ``b[b_rows]`` sharing one pool, or None when that
    saves less than half. ``same[t]``: new_obs[t] is known to be obs[t + 1] (None: compare)."""
    n, k = len(a_rows), a.shape[1]
    aw = _words(a)
    bw = aw if b is a else _words(b)
    head, tail = slice(0, k - 1), slice(1, k)
    # cont[t]: obs[t] continues obs[t-1] (its first k-1 frames are obs[t-1]'s last k-1)
    cont = np.zeros(n, dtype=bool)
    maybe = np.arange(1, n) if same is None else np.flatnonzero(same[:-1]) + 1
    cont[maybe] = _equal(aw, a_rows[maybe], head, aw, a_rows[maybe - 1], tail)
    counts = np.where(cont, 1, k)  # a row that continues adds its newest frame only
    last = np.cumsum(counts) - 1  # pool position of each row's newest frame
    obs_index = last[:, None] - (k - 1) + np.arange(k)
    if same is None:  # new_obs[t] is obs[t+1] where it is obs[t] shifted and the newest agree
        shift = _equal(bw, b_rows, head, aw, a_rows, tail)
        same = np.zeros(n, dtype=bool)
        maybe = np.flatnonzero(shift[:-1] & cont[1:])
        last_frame = slice(k - 1, k)
        same[maybe] = _equal(bw, b_rows[maybe], last_frame, aw, a_rows[maybe + 1], last_frame)
    else:
        shift = np.zeros(n, dtype=bool)
        ends = np.flatnonzero(~same)
        shift[ends] = _equal(bw, b_rows[ends], head, aw, a_rows[ends], tail)
    # new_obs rows other than obs[t+1]: one new frame if obs[t] shifted, else k
    extra = np.where(same, 0, np.where(shift, 1, k))
    pool_size = int(last[-1]) + 1 + int(extra.sum())
    if pool_size > n * k:  # saves less than half of the 2nk frames of obs + new_obs
        return None
    new_index = np.empty_like(obs_index)
    new_index[same] = obs_index[np.flatnonzero(same) + 1]
    extra_last = int(last[-1]) + np.cumsum(extra)  # pool position of its newest extra frame
    one = shift & ~same
    new_index[one, :-1] = obs_index[one, 1:]
    new_index[one, -1] = extra_last[one]
    full = extra == k
    new_index[full] = extra_last[full, None] - (k - 1) + np.arange(k)
    a_frames = a.reshape(-1, *a.shape[2:])
    b_frames = b.reshape(-1, *b.shape[2:])
    pool = np.concatenate(
        [a_frames[_last_frames(a_rows, counts, k)], b_frames[_last_frames(b_rows, extra, k)]]
    )
    dtype = np.int32 if pool_size < 2**31 else np.int64
    pool = _read_only(pool)  # one pool object for both columns
    return (
        FrameStackColumn(pool, obs_index.astype(dtype)),
        FrameStackColumn(pool, new_index.astype(dtype)),
    )


def share_frames(obs: Any, new_obs: Any) -> tuple[FrameStackColumn, FrameStackColumn] | None:
    """``obs`` and ``new_obs`` as two `FrameStackColumn` sharing one pool of frames, or
    None when they are not frame stacks of images or sharing saves less than half.

    Row t of ``obs`` reuses row t-1's last k-1 frames where they are equal to its first
    k-1; row t of ``new_obs`` is row t+1 of ``obs`` where the two are equal, else row t of
    ``obs`` shifted by one where that matches, else stored in full.
    """
    if not (isinstance(obs, np.ndarray) and len(obs) and _looks_stacked(obs, 0, new_obs, 0)):
        return None
    if obs.shape != new_obs.shape:
        return None
    rows = np.arange(len(obs))
    return _pack(obs, rows, new_obs, rows, None)


def transition_observations(column: Any, rows: np.ndarray, nxt: np.ndarray) -> tuple[Any, Any]:
    """A batch's ``obs`` (``column[rows]``) and ``new_obs`` (``column[nxt]``) from the
    column of observation rows that a collector holds (trajectories contiguous: a row
    ``nxt[t] == rows[t + 1]`` is both).

    Frame stacks of images become two `FrameStackColumn` sharing one pool: no stack is
    copied whole, only the frames not seen in the row before (verified by value, row by
    row, as in `share_frames`). Anything else is taken as arrays (or nests of arrays).
    """
    if len(rows) and _looks_stacked(column, rows[0], column, nxt[0]):
        same = np.zeros(len(rows), dtype=bool)
        same[:-1] = nxt[:-1] == rows[1:]  # the same stored row: equal without comparing
        packed = _pack(column, rows, column, nxt, same)
        if packed is not None:
            return packed
    return take_rows(column, rows), take_rows(column, nxt)


def pack_image_columns(
    columns: dict[str, Any],
    image_columns: Iterable[str] = IMAGE_COLUMNS,
    *,
    compress: bool = False,
) -> dict[str, Any]:
    """Store a built batch's image columns compactly, in place: frame-stacked ``obs`` /
    ``new_obs`` (each pair of ``NEXT_OBS_OF``) as `FrameStackColumn` (always, where
    `share_frames` applies), and with ``compress`` every image column (or its frame pool)
    LZ4-compressed."""
    for name, next_name in NEXT_OBS_OF.items():
        packed = share_frames(columns.get(name), columns.get(next_name))
        if packed is not None:
            columns[name], columns[next_name] = packed
    if compress:
        memo: dict = {}
        for name in image_columns:
            value = columns.get(name)
            if isinstance(value, FrameStackColumn):
                columns[name] = value.compressed(memo)
            elif isinstance(value, np.ndarray) and compressible(value):
                columns[name] = CompressedColumn.compress(value)
    return columns
