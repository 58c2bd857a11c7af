"""Segmented reverse scans over a whole batch: discounted sums within each trajectory.

Every built-in learner connector reduces to one of three sums over the rows that follow a
row in its trajectory (up to the trajectory's ``last`` row; ``rem[t]`` rows, see
:mod:`.trajectories`):

- :func:`discounted_suffix_sum`: ``y[t] = sum_{i=0..rem[t]} d**i * x[t+i]`` (GAE, returns);
- :func:`discounted_window_sum`: the same over at most ``n`` terms (n-step returns);
- :func:`linear_suffix_scan`: ``y[t] = x[t] + a[t] * y[t+1]`` with per-row ``a`` (V-trace).

:func:`discounted_suffix_sum` and :func:`linear_suffix_scan` are one recurrence, ``y[t] =
x[t] + c[t] * y[t+1]`` with ``c = 0`` on each trajectory's last row, run blockwise
(:func:`_blocked_scan`): the rows are cut into blocks of ``BLOCK`` consecutive rows and laid
out as ``BLOCK`` lanes (lane ``j`` holds row ``j`` of every block, contiguous), so that
stepping back through a block is ``BLOCK`` whole-array operations over all blocks at once;
then the sum at each block's first row is carried across blocks by recursive doubling over
``N / BLOCK`` blocks (``log2`` of the longest trajectory in blocks), and added back into
every row of a block with the product of the coefficients that reach it. That is ``O(N)``
work in a fixed number of whole-array passes plus ``O(N / BLOCK * log T)``, with no Python
loop over rows or trajectories. :func:`discounted_window_sum` runs recursive doubling (a
Kogge-Stone scan): after the step of span ``s`` each row holds the sum of its next ``2s``
terms, ``ceil(log2(longest trajectory))`` steps. Connectors run the scans piece by piece
(:meth:`.trajectories.Trajectories.pieces`: whole trajectories, ~32k rows a piece) so
that every work array stays in cache between steps.

Numerics: everything is float64. Every step adds terms scaled by products of discounts in
[0, 1] (no division, no growing powers such as ``d**-t``, no cancellation between a global
cumulative sum and its shifted copy), so each output is a sum of its exact terms with
a few float64 roundings per term (``BLOCK`` sequential steps inside a block, ``log2``
doubling steps across blocks), far below the float32 the connectors return.
tests/connectors/learner/test_learner_scan.py holds them to 1e-11 (relative to the largest
term) of sequential float64 loops, on trajectories of up to 5000 rows with terms spanning
six orders of magnitude.
"""

from __future__ import annotations

import numpy as np

__all__ = ["discounted_suffix_sum", "discounted_window_sum", "linear_suffix_scan"]


class _Scratch:
    """Work arrays of one scan (as long as its input), reused by every doubling step."""

    def __init__(self, rows: int) -> None:
        self.values = np.empty(rows)
        self.mask = np.empty(rows, dtype=bool)

    def reach(self, rem: np.ndarray, span: int) -> np.ndarray:
        """(len(rem) - span,) bool: row ``t + span`` is in row ``t``'s trajectory."""
        out = self.mask[: len(rem) - span]
        np.greater_equal(rem[:-span], span, out=out)
        return out


def _double(y: np.ndarray, rem: np.ndarray, span: int, factor: float, work: _Scratch) -> None:
    """In place: ``y[t] += factor * y[t + span]`` where row ``t + span`` is in ``t``'s
    trajectory (``rem[t] >= span``); the right side is read before anything is written."""
    ahead = work.values[: len(y) - span]
    np.multiply(y[span:], factor, out=ahead)
    np.add(y[:-span], ahead, out=y[:-span], where=work.reach(rem, span))


def discounted_suffix_sum(x: np.ndarray, last: np.ndarray, discount: float) -> np.ndarray:
    """``y[t] = sum_{i=0..rem[t]} discount**i * x[t+i]``, ``last`` being the rows that end
    the trajectories (all of them, in order): a new float64 (N,) array (``x`` is read,
    in any real dtype, and left alone)."""
    lanes = _Lanes(len(x))
    lanes.coef.fill(discount)
    return _blocked_scan(x, last, lanes)


def discounted_window_sum(x: np.ndarray, rem: np.ndarray, discount: float, n: int) -> np.ndarray:
    """``y[t] = sum_{i < min(n, rem[t] + 1)} discount**i * x[t+i]``: float64 (N,).

    ``n`` is split into powers of two: windows of ``span`` terms are doubled as in
    :func:`discounted_suffix_sum`, and each one whose bit is set in ``n`` is added at the
    offset the smaller ones already cover."""
    window = np.array(x, dtype=np.float64)
    out = np.zeros_like(window)
    work = _Scratch(len(window))
    longest = int(rem.max()) + 1 if len(rem) else 0
    span, factor, offset = 1, float(discount), 0
    while n and offset < longest:
        if n & 1:
            if offset == 0:
                out += window
            else:
                ahead = work.values[: len(window) - offset]
                np.multiply(window[offset:], discount**offset, out=ahead)
                np.add(out[:-offset], ahead, out=out[:-offset], where=work.reach(rem, offset))
            offset += span
        n >>= 1
        if n and span < longest:
            _double(window, rem, span, factor, work)
            span, factor = 2 * span, factor * factor
    return out


def linear_suffix_scan(x: np.ndarray, coef: np.ndarray, last: np.ndarray) -> np.ndarray:
    """``y[t] = x[t] + coef[t] * y[t+1]`` within each trajectory (``last``: the rows that
    end them): a new float64 (N,) array.

    ``coef`` is ignored on each trajectory's last row (nothing follows it there)."""
    lanes = _Lanes(len(x))
    lanes.load(lanes.coef, coef)
    return _blocked_scan(x, last, lanes)


#: rows per block of :func:`_blocked_scan`: steps inside a block are whole-array
#: operations over N / BLOCK rows; the doubling across blocks works on N / BLOCK heads
BLOCK = 16


class _Lanes:
    """Work arrays of one blocked scan over ``rows`` rows: ``values`` and ``coef`` as
    ``(BLOCK, blocks)`` lanes (``lanes[j, b]`` is row ``b * BLOCK + j``, zero past the end)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.blocks = -(-rows // BLOCK)
        self.values = np.empty((BLOCK, self.blocks))
        self.coef = np.empty((BLOCK, self.blocks))
        self.flat = np.zeros(self.blocks * BLOCK)  # rows in block order, zero-padded

    def load(self, lanes: np.ndarray, x: np.ndarray) -> None:
        """``lanes`` (values or coef) from the per-row ``x``."""
        self.flat[: self.rows] = x
        np.copyto(lanes, self.flat.reshape(self.blocks, BLOCK).T)

    def store(self, lanes: np.ndarray) -> np.ndarray:
        """Per-row float64 ``(rows,)`` from ``lanes`` (a view of ``flat``)."""
        np.copyto(self.flat.reshape(self.blocks, BLOCK), lanes.T)
        return self.flat[: self.rows]


def _blocked_scan(x: np.ndarray, last: np.ndarray, lanes: _Lanes) -> np.ndarray:
    """``y[t] = x[t] + coef[t] * y[t+1]`` from the last row back (float64), with
    ``lanes.coef`` holding ``coef`` and set to 0 here on every ``last`` row."""
    if not len(x):
        return np.zeros(0)
    lanes.coef[last % BLOCK, last // BLOCK] = 0.0  # padding rows follow a last row
    lanes.load(lanes.values, x)
    values, coef = lanes.values, lanes.coef
    step = np.empty(lanes.blocks)
    for j in range(BLOCK - 2, -1, -1):  # inside every block at once, back to front
        np.multiply(coef[j], values[j + 1], out=step)
        values[j] += step
    carry = _carry_across_blocks(values[0], np.prod(coef, axis=0))
    for j in range(BLOCK - 1, -1, -1):  # what follows the block, reaching row j
        carry *= coef[j]
        values[j] += carry
    return lanes.store(values)


def _carry_across_blocks(heads: np.ndarray, through: np.ndarray) -> np.ndarray:
    """For each block, the full sum at the next block's first row (0 after the last):
    ``z[b] = heads[b] + through[b] * z[b+1]`` by recursive doubling, ``through[b]`` being
    the product of a block's coefficients (0 unless its first row's trajectory goes past
    it). The doubling stops when no product is left: after ``log2`` of the longest
    trajectory in blocks."""
    z, mult = heads.copy(), through.copy()
    step = np.empty(len(z))
    span = 1
    while span < len(z) and mult[: len(z) - span].any():
        buf = step[: len(z) - span]
        np.multiply(mult[:-span], z[span:], out=buf)
        z[:-span] += buf
        mult[:-span] *= mult[span:]
        span *= 2
    carry = np.zeros(len(z))
    carry[:-1] = z[1:]
    return carry
