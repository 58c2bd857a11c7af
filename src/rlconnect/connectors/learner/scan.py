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
that every work array stays in cache between steps; :class:`DiscountedSuffixSums` keeps one
set of work arrays for all the pieces of a batch and takes each piece's terms where the
scan reads them, so a connector that computes its terms (GAE's ``delta``) copies nothing.

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

__all__ = [
    "DiscountedSuffixSums",
    "discounted_suffix_sum",
    "discounted_window_sum",
    "linear_suffix_scan",
]


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
    sums = DiscountedSuffixSums(len(x), discount)
    sums.terms(len(x))[:] = x
    return sums.run(last)


class DiscountedSuffixSums:
    """:func:`discounted_suffix_sum` piece after piece (of at most ``rows`` rows) in one set
    of work arrays, for a connector that computes each piece's terms itself: it writes them
    into ``terms(rows)`` and calls ``run(last)``, with no copy of the terms on the way."""

    def __init__(self, rows: int, discount: float) -> None:
        self._lanes = _Lanes(rows)
        self._lanes.coef.fill(discount)
        self._rows = 0

    def terms(self, rows: int) -> np.ndarray:
        """(rows,) float64, to be filled with the next piece's terms."""
        self._rows = rows
        return self._lanes.flat[:rows]

    def run(self, last: np.ndarray) -> np.ndarray:
        """The piece's sums (float64, ``last``: its trajectories' last rows), in place of its
        terms: valid until the next piece's terms are written."""
        return _blocked_scan(self._lanes, self._rows, last)


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
    n = len(x)
    lanes = _Lanes(n)
    _, lane_coef, flat = lanes.part(n)
    flat[:n] = coef
    flat[n:] = 0.0
    np.copyto(lane_coef, flat.reshape(-1, BLOCK).T)
    flat[:n] = x
    return _blocked_scan(lanes, n, last)


#: rows per block of :func:`_blocked_scan`: steps inside a block are whole-array
#: operations over N / BLOCK rows; the doubling across blocks works on N / BLOCK heads
BLOCK = 16


class _Lanes:
    """Work arrays of blocked scans of up to ``capacity`` rows: ``values`` and ``coef`` as
    ``(BLOCK, blocks)`` lanes (``lanes[j, b]`` is row ``b * BLOCK + j``), ``flat`` the rows
    in order; a scan of fewer rows uses the first blocks (:meth:`part`)."""

    def __init__(self, capacity: int) -> None:
        blocks = -(-capacity // BLOCK)
        self.values = np.empty((BLOCK, blocks))
        self.coef = np.empty((BLOCK, blocks))
        self.flat = np.empty(blocks * BLOCK)

    def part(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(values, coef, flat)`` of the blocks that hold ``rows`` rows."""
        blocks = -(-rows // BLOCK)
        return self.values[:, :blocks], self.coef[:, :blocks], self.flat[: blocks * BLOCK]


def _blocked_scan(lanes: _Lanes, rows: int, last: np.ndarray) -> np.ndarray:
    """``y[t] = x[t] + coef[t] * y[t+1]`` from the last row back (float64), for ``x`` in
    ``lanes.flat[:rows]`` and ``coef`` in ``lanes.coef`` (taken as 0 on every ``last`` row,
    and left as it was): the result replaces ``x`` in ``lanes.flat``."""
    if not rows:
        return np.zeros(0)
    values, coef, flat = lanes.part(rows)
    flat[rows:] = 0.0  # padding rows: nothing, after a last row
    np.copyto(values, flat.reshape(-1, BLOCK).T)
    at = (last % BLOCK, last // BLOCK)
    kept = coef[at]
    coef[at] = 0.0
    step = np.empty(values.shape[1])
    for j in range(BLOCK - 2, -1, -1):  # inside every block at once, back to front
        np.multiply(coef[j], values[j + 1], out=step)
        values[j] += step
    carry = _carry_across_blocks(values[0], np.prod(coef, axis=0))
    for j in range(BLOCK - 1, -1, -1):  # what follows the block, reaching row j
        carry *= coef[j]
        values[j] += carry
    coef[at] = kept
    np.copyto(flat.reshape(-1, BLOCK), values.T)
    return flat[:rows]


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
