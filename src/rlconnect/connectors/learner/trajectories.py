"""Trajectories of a batch, found from ``eps_id`` / ``agent_index`` and never from row positions.

A trajectory is the rows of one ``eps_id`` and, in multi-agent policy batches, one
``agent_index``: contiguous and in ``t`` order, as a runner builds them (batches read back
from files or concatenated from several runners keep that). Its last row ends it by
termination (``terminateds``: the value after it is 0), or by truncation or a fragment cut
(the value after it is that of the row's ``new_obs``: a bootstrap value).

:func:`find_trajectories` finds where the keys change and checks the rows in between in
one compiled pass (:func:`._kernels.trajectory_ends`), then that no key comes back in a
later run (a sort of the trajectories' keys, not of the rows), and returns each
trajectory's last row and how it ended: the scans of
:mod:`rlconnect.connectors.learner.scan` need nothing else (n-step windows also ask for
``rem()``, the rows left in each row's trajectory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import numpy as np

from rlconnect.connectors.learner.scan import compiled_input, kernels

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch

__all__ = ["Trajectories", "find_trajectories"]


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


#: what each column every batch must have is needed for
_NEEDED = {
    "eps_id": "an 'eps_id' column to find trajectories",
    "terminateds": "a 'terminateds' column to tell terminations from cuts",
}


def _required(batch: SampleBatch, name: str, who: str) -> np.ndarray:
    col = _key_column(batch, name, who)
    if col is None:
        raise ValueError(f"{who} needs {_NEEDED[name]}; the batch has {sorted(batch.keys())}")
    return col


def _flags(batch: SampleBatch, name: str, who: str) -> np.ndarray | None:
    col = _key_column(batch, name, who)
    return None if col is None else col.astype(bool, copy=False)


def _comparable(col: np.ndarray | None) -> np.ndarray | None:
    """``col`` if it holds numbers, else the number of each row's run of equal values
    (strings and objects: the compiled scan compares numbers only)."""
    if col is None:
        return None
    if col.dtype.kind in "biuf":
        return compiled_input(col)
    out = np.zeros(len(col), dtype=np.int64)
    np.cumsum(col[1:] != col[:-1], out=out[1:])
    return out


def _describe(eps: np.ndarray, agent: np.ndarray | None, row: int) -> str:
    key = f"eps_id {np.asarray(eps[row]).item()!r}"  # (object arrays hold plain values)
    return key if agent is None else f"{key}, agent_index {np.asarray(agent[row]).item()!r}"


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


def _order_error(
    eps: np.ndarray, agent: np.ndarray | None, t: np.ndarray | None, row: int, what: int, who: str
) -> ValueError:
    """The error for ``row``, which :func:`._kernels.trajectory_ends` found ``what`` at."""
    key = _describe(eps, agent, row)
    if what == kernels().T_NOT_GROWING:
        assert t is not None
        return ValueError(
            f"{who}: rows {row} and {row + 1} of trajectory ({key}) are not in t order "
            f"(t={t[row].item()!r}, then {t[row + 1].item()!r}); a trajectory's rows must "
            "follow each other in t order, as the runner builds them"
        )
    return ValueError(
        f"{who}: row {row} ends its episode (terminateds or truncateds) but trajectory ({key}) "
        f"goes on at row {row + 1}: two episodes share one eps_id; give every episode its "
        "own eps_id"
    )


def find_trajectories(batch: SampleBatch, who: str) -> Trajectories:
    """The trajectories of ``batch``; ``who`` (a connector's name) prefixes every error.

    Raises:
        ValueError: no ``eps_id`` or ``terminateds`` column; a trajectory whose rows are
            not contiguous (its key in two separate runs), not in ``t`` order, or that
            goes on after a row that ended its episode.
    """
    eps = _required(batch, "eps_id", who)
    agent = _key_column(batch, "agent_index", who)
    terminateds = _required(batch, "terminateds", who).astype(bool, copy=False)
    t = _key_column(batch, "t", who)
    t = compiled_input(t) if t is not None and t.dtype.kind in "iuf" else None
    ends = np.empty(len(eps), dtype=np.int64)
    count, bad, what = kernels().trajectory_ends(
        _comparable(eps), _comparable(agent), t, terminateds, _flags(batch, "truncateds", who), ends
    )
    if bad >= 0:
        raise _order_error(eps, agent, t, bad, what, who)
    ends = ends[:count].copy()
    starts = np.concatenate(([0], ends[:-1] + 1)) if count else ends
    _check_unique_keys(eps, agent, starts, ends, who)
    return Trajectories(rows=len(eps), last_rows=ends, terminated=terminateds[ends])
