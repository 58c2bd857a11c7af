"""Trajectories of a batch, found from ``eps_id`` / ``agent_index`` and never from row positions.

A trajectory is the rows of one ``eps_id`` and, in multi-agent policy batches, one
``agent_index``: contiguous and in ``t`` order, as a runner builds them (batches read back
from files or concatenated from several runners keep that). Its last row ends it by
termination (``terminateds``: the value after it is 0), or by truncation or a fragment cut
(the value after it is that of the row's ``new_obs``: a bootstrap value).

:func:`find_trajectories` checks all of that over whole arrays and returns each
trajectory's last row and how it ended: the scans of
:mod:`rlconnect.connectors.learner.scan` need nothing else (n-step windows also ask for
``rem()``, the rows left in each row's trajectory).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import attrs
import numpy as np

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch

__all__ = ["PIECE_ROWS", "Piece", "Trajectories", "find_trajectories"]


#: rows per piece of work (see :meth:`Trajectories.pieces`)
PIECE_ROWS = 1 << 15


@attrs.frozen
class Piece:
    """Whole consecutive trajectories of a batch: ``rows`` of the batch, the ``trajs``-th
    trajectories (slices of ``Trajectories.last_rows`` / ``terminated``) and ``last``,
    their last rows counted from the piece's first row."""

    rows: slice
    trajs: slice
    last: np.ndarray

    @property
    def size(self) -> int:
        """Rows in the piece."""
        return int(self.rows.stop - self.rows.start)


@attrs.frozen
class Trajectories:
    """Where the trajectories of a batch end and how.

    Attributes:
        rows: N, the rows of the batch.
        last_rows: (S,) each trajectory's last row, in row order.
        terminated: (S,) bool, True for trajectories ended by termination.
    """

    rows: int
    last_rows: np.ndarray
    terminated: np.ndarray

    def rem(self) -> np.ndarray:
        """(N,) int32, for each row the number of rows after it in its trajectory (0 on
        each trajectory's last row); computed on each call, for the connectors that need
        it (n-step windows)."""
        lengths = np.diff(self.last_rows, prepend=-1)
        out = np.repeat(self.last_rows.astype(np.int32), lengths)
        out -= np.arange(self.rows, dtype=np.int32)
        return out

    @property
    def bootstrap_rows(self) -> np.ndarray:
        """Last rows of the trajectories that need a bootstrap value (truncated or cut)."""
        return self.last_rows[~self.terminated]

    @property
    def longest(self) -> int:
        """Rows of the longest trajectory (0 for an empty batch)."""
        return int(np.diff(self.last_rows, prepend=-1).max()) if self.rows else 0

    def pieces(self) -> list[Piece]:
        """The batch cut into pieces of whole trajectories, each at least PIECE_ROWS rows
        (but the last): connectors compute piece by piece so that their work arrays stay
        in cache (a batch of a million rows takes ~30 pieces, not a loop per row)."""
        n = self.rows
        if n == 0:
            return []
        ends = np.arange(PIECE_ROWS - 1, n - 1, PIECE_ROWS)
        cut = np.unique(np.searchsorted(self.last_rows, ends))  # trajectory ending a piece
        bounds = [0, *(cut + 1).tolist()]
        if bounds[-1] != len(self.last_rows):
            bounds.append(len(self.last_rows))
        out = []
        for ta, tb in itertools.pairwise(bounds):
            a = int(self.last_rows[ta - 1]) + 1 if ta else 0
            b = int(self.last_rows[tb - 1]) + 1
            out.append(Piece(slice(a, b), slice(ta, tb), self.last_rows[ta:tb] - a))
        return out

    def terminating_rows(self) -> np.ndarray:
        """(N,) bool: True on the last row of every terminated trajectory."""
        out = np.zeros(self.rows, dtype=bool)
        out[self.last_rows[self.terminated]] = True
        return out


def _key_column(batch: SampleBatch, name: str, who: str) -> np.ndarray | None:
    if name not in batch:
        return None
    col = batch[name]
    if not isinstance(col, np.ndarray) or col.ndim != 1:
        raise ValueError(f"{who}: column {name!r} must be a 1-D array, got {col!r:.80}")
    return col


def _flags(batch: SampleBatch, name: str, who: str, required: bool) -> np.ndarray:
    col = _key_column(batch, name, who)
    if col is None:
        if required:
            raise ValueError(
                f"{who} needs a {name!r} column to tell terminations from cuts; the batch has "
                f"{sorted(batch.keys())}"
            )
        return np.zeros(len(batch), dtype=bool)
    return col.astype(bool, copy=False)


def _describe(eps: np.ndarray, agent: np.ndarray | None, row: int) -> str:
    key = f"eps_id {eps[row].item()!r}"
    return key if agent is None else f"{key}, agent_index {agent[row].item()!r}"


def _check_unique_keys(
    eps: np.ndarray, agent: np.ndarray | None, starts: np.ndarray, ends: np.ndarray, who: str
) -> None:
    """A key in two separate runs of rows: the batch is not trajectory-contiguous."""
    ke = eps[starts]
    if agent is None:  # one key: a sort finds repeats (what lexsort does, ~10x the time)
        try:
            keys = np.sort(ke)
        except TypeError:  # (mixed kinds: named below)
            keys = None
        if keys is not None and not np.count_nonzero(keys[1:] == keys[:-1]):
            return
    ka = agent[starts] if agent is not None else np.zeros(len(starts), dtype=np.int64)
    try:
        order = np.lexsort((ka, ke))
    except TypeError:
        raise ValueError(f"{who}: eps_id / agent_index must be numbers or strings") from None
    ke, ka = ke[order], ka[order]
    dup = np.flatnonzero((ke[1:] == ke[:-1]) & (ka[1:] == ka[:-1]))
    if not len(dup):
        return
    a, b = sorted((int(order[dup[0]]), int(order[dup[0] + 1])))
    raise ValueError(
        f"{who}: the rows of trajectory ({_describe(eps, agent, int(starts[a]))}) are not "
        f"contiguous: rows {starts[a]}-{ends[a]} and rows {starts[b]}-{ends[b]} are separated "
        "by other trajectories. Learner connectors find trajectories from eps_id / agent_index "
        "and need each one's rows together and in t order, as the runner builds them "
        "(concatenate whole batches, or sort by eps_id, agent_index, t)"
    )


def _only_at(flags: np.ndarray, allowed: np.ndarray) -> bool:
    """Whether every True of ``flags`` is at one of the rows ``allowed`` (two counts, no
    pass that builds a mask)."""
    return bool(np.count_nonzero(flags) == np.count_nonzero(flags[allowed]))


def _check_order(
    batch: SampleBatch, starts_mask: np.ndarray, ends: np.ndarray, flags: list[np.ndarray], who: str
) -> None:
    """Inside a trajectory ``t`` grows, and no row but the last (``ends``) ends the
    episode (``flags``: terminateds, truncateds). Each is checked by counting, and only a
    batch that fails is searched for its first bad row."""
    eps = batch["eps_id"]
    agent = _key_column(batch, "agent_index", who)
    t = _key_column(batch, "t", who)
    if t is not None and t.dtype.kind in "iuf" and len(t) > 1:
        falls = t[1:] <= t[:-1]  # allowed only where the next row starts a trajectory
        if not _only_at(falls, ends[:-1]):
            i = int(np.flatnonzero(falls & ~starts_mask[1:])[0])
            raise ValueError(
                f"{who}: rows {i} and {i + 1} of trajectory ({_describe(eps, agent, i)}) are "
                f"not in t order (t={t[i].item()!r}, then {t[i + 1].item()!r}); a trajectory's "
                "rows must follow each other in t order, as the runner builds them"
            )
    for ending in flags:
        if _only_at(ending, ends):
            continue
        i = int(np.flatnonzero(ending[:-1] & ~starts_mask[1:])[0])  # the next row goes on
        raise ValueError(
            f"{who}: row {i} ends its episode (terminateds or truncateds) but trajectory "
            f"({_describe(eps, agent, i)}) goes on at row {i + 1}: two episodes share one "
            "eps_id; give every episode its own eps_id"
        )


def find_trajectories(batch: SampleBatch, who: str) -> Trajectories:
    """The trajectories of ``batch``; ``who`` (a connector's name) prefixes every error.

    Raises:
        ValueError: no ``eps_id`` or ``terminateds`` column; a trajectory whose rows are
            not contiguous (its key in two separate runs), not in ``t`` order, or that
            goes on after a row that ended its episode.
    """
    eps = _key_column(batch, "eps_id", who)
    if eps is None:
        raise ValueError(
            f"{who} needs an 'eps_id' column to find trajectories; the batch has "
            f"{sorted(batch.keys())}"
        )
    agent = _key_column(batch, "agent_index", who)
    n = len(eps)
    if n == 0:
        _flags(batch, "terminateds", who, True)
        empty = np.zeros(0, dtype=np.int64)
        return Trajectories(rows=0, last_rows=empty, terminated=np.zeros(0, dtype=bool))
    starts_mask = np.ones(n, dtype=bool)
    starts_mask[1:] = eps[1:] != eps[:-1]
    if agent is not None:
        starts_mask[1:] |= agent[1:] != agent[:-1]
    starts = np.flatnonzero(starts_mask)
    ends = np.append(starts[1:], n) - 1
    _check_unique_keys(eps, agent, starts, ends, who)
    terminateds = _flags(batch, "terminateds", who, True)
    truncateds = _flags(batch, "truncateds", who, False)
    _check_order(batch, starts_mask, ends, [terminateds, truncateds], who)
    return Trajectories(rows=n, last_rows=ends, terminated=terminateds[ends])
