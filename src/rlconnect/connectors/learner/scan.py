"""Segmented reverse scans over a whole batch: discounted sums within each trajectory.

Every built-in learner connector reduces to one of three sums over the rows that follow a
row in its trajectory (up to the trajectory's ``last`` row; ``rem[t]`` rows, see
:mod:`.trajectories`):

- :func:`discounted_suffix_sum`: ``y[t] = sum_{i=0..rem[t]} d**i * x[t+i]`` (GAE, returns);
- :func:`discounted_window_sum`: the same over at most ``n`` terms (n-step returns);
- :func:`linear_suffix_scan`: ``y[t] = x[t] + a[t] * y[t+1]`` with per-row ``a`` (V-trace).

:func:`discounted_suffix_sum` and :func:`linear_suffix_scan` are one recurrence, ``y[t] =
x[t] + c[t] * y[t+1]`` with ``c = 0`` on each trajectory's last row, run blockwise: the
rows are cut into blocks of ``BLOCK`` consecutive rows, each block is summed inside
itself, and the sum at each block's first row is carried across blocks by recursive
doubling over ``N / BLOCK`` blocks (``log2`` of the longest trajectory in blocks). With
one discount (:class:`DiscountedSuffixSums`) a block's sums are one matrix product with
the ``BLOCK x BLOCK`` triangle of the discount's powers, as if no trajectory ended in it;
an end inside a block is then handled at its row alone, by taking off its term what the
product would add after it, and what follows a block is added to its last term, before a
second product. With per-row coefficients (:func:`_blocked_scan`) the rows are laid out
as ``BLOCK`` lanes (lane ``j`` holds row ``j`` of every block, contiguous), stepped
through back to front, and the carried sum is added back into every row of a block with
the product of the coefficients that reach it. Either is ``O(N)`` work in a fixed
number of whole-array passes plus ``O(N / BLOCK * log T)``, with no Python loop over
rows or trajectories. :func:`discounted_window_sum` runs recursive doubling (a
Kogge-Stone scan): after the step of span ``s`` each row holds the sum of its next ``2s``
terms, ``ceil(log2(longest trajectory))`` steps. Connectors run the scans piece by piece
(:meth:`.trajectories.Trajectories.pieces`: whole trajectories, ~32k rows a piece) so
that every work array stays in cache between steps; :class:`DiscountedSuffixSums` keeps one
set of work arrays for all the pieces of a batch and takes each piece's terms where the
scan reads them, so a connector that computes its terms (GAE's ``delta``) copies nothing.

Numerics: everything is float64. Every sum adds terms scaled by products of discounts in
[0, 1] (no division, no growing powers such as ``d**-t``, no cumulative sum over the
batch), so each output is a sum of its exact terms with a few float64 roundings per term
(at most ``BLOCK`` terms per product or sequential steps inside a block, ``log2``
doubling steps across blocks), far below the float32 the connectors return. The one
subtraction, at a trajectory's end inside a block, takes off the sum of the next rows
that the product adds after it; that sum is itself an output (the next trajectory's, at
its first row), so the rounding stays relative to the outputs next to it, never to a sum
over more rows. tests/connectors/learner/test_learner_scan.py holds them to 1e-11
(relative to the largest term) of sequential float64 loops, on trajectories of up to
5000 rows with terms spanning six orders of magnitude, and of 1 to 40 rows around block
edges.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
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
    sums = DiscountedSuffixSums([last], discount)
    sums.terms(0)[:] = x
    return sums.run(0)


class DiscountedSuffixSums:
    """:func:`discounted_suffix_sum` over a batch cut into pieces of whole trajectories,
    piece after piece in one set of work arrays, for a connector that computes each
    piece's terms itself: it writes piece ``k``'s terms into ``terms(k)`` and calls
    ``run(k)``, with no copy of the terms on the way.

    A piece's rows are cut into blocks of ``BLOCK`` consecutive rows (``(blocks, BLOCK)``,
    in row order), and ``sums = terms @ triangle`` with the ``BLOCK x BLOCK`` triangle of
    the discount's powers sums every row's terms to the end of its block, as if no
    trajectory ended there. The recurrence ``y[t] = x[t] + discount * y[t+1]`` holds at
    every row but a trajectory's last, where nothing follows; so a first product gives,
    for every trajectory's end ``e`` inside a block, the whole sum ``y[e+1]`` at the next
    row (from the sums at ``e+1`` and after the next end, see :class:`_BlockEnds`), and
    for every block the sum at its first row (carried across blocks by
    :func:`_carry_across_blocks`); then ``discount * y[e+1]`` is taken off the term of
    each such ``e``, ``discount * y`` of the next block's first row is added to the last
    term of each block whose trajectory goes on, and a second product gives every row its
    sum."""

    def __init__(self, lasts: Sequence[np.ndarray], discount: float) -> None:
        """``lasts``: each piece's trajectories' last rows, counted from the piece's first
        row (a piece's last row ends a trajectory); ``discount`` in [0, 1]."""
        self._powers = float(discount) ** np.arange(BLOCK + 1.0)  # discount**0..BLOCK
        self._pieces = _BlockEnds.of_pieces(lasts, self._powers)
        blocks = max((p.blocks for p in self._pieces), default=0)
        self._terms = np.empty((blocks, BLOCK))
        self._sums = np.empty((blocks, BLOCK))
        self._through = np.empty(blocks)
        gap = np.subtract.outer(np.arange(BLOCK), np.arange(BLOCK))  # [m, j]: m - j
        #: ``sums[:, j] = terms @ triangle[:, j]``: discount**(m - j) for rows m >= j
        self._triangle = np.where(gap >= 0, self._powers[np.maximum(gap, 0)], 0.0)

    def terms(self, piece: int) -> np.ndarray:
        """(rows,) float64, to be filled with the terms of piece ``piece``."""
        return self._terms.reshape(-1)[: self._pieces[piece].rows]

    def run(self, piece: int) -> np.ndarray:
        """The piece's sums (float64), valid until the next call."""
        p, discount = self._pieces[piece], self._powers[1]
        terms, sums = self._terms[: p.blocks], self._sums[: p.blocks]
        terms.reshape(-1)[p.rows :] = 0.0  # padding rows: nothing, after a last row
        np.matmul(terms, self._triangle, out=sums)
        flat = sums.reshape(-1)
        flat[p.head_rows] -= p.head_scale * flat[p.head_next]  # heads, to their end
        through = self._through[: p.blocks]  # the discount's power across a block, or 0
        through.fill(self._powers[BLOCK])
        through[p.ending] = 0.0
        carry = _carry_across_blocks(sums[:, 0], through, p.reach)
        carry[p.closing] = 0.0
        after = flat[p.next] - p.next_scale * flat[p.next_cut] + p.carry_scale * carry[p.block]
        terms.reshape(-1)[p.ends] -= discount * after
        carry *= discount
        terms[:, -1] += carry
        np.matmul(terms, self._triangle, out=sums)
        return flat[: p.rows]


@attrs.frozen
class _BlockEnds:
    """Where one piece's trajectories end among its blocks of ``BLOCK`` rows.

    For each end ``ends`` inside a block (before its last row), the whole sum at the
    ``next`` row is ``sums[next] - next_scale * sums[next_cut] + carry_scale *
    carry[block]``: minus what follows the next trajectory's end if that is inside the
    block too, plus what comes from the next block if that trajectory goes on into it.
    A block whose first trajectory ends inside it has the sum at its first row
    ``head_rows`` less ``head_scale * sums[head_next]``. ``ending``: the blocks where a
    trajectory ends (nothing carried through them); ``closing``: those where one ends on
    the last row (nothing carried into them); ``reach``: the most blocks a trajectory
    passes through."""

    rows: int
    ends: np.ndarray
    next: np.ndarray
    next_cut: np.ndarray
    block: np.ndarray
    next_scale: np.ndarray
    carry_scale: np.ndarray
    head_rows: np.ndarray
    head_next: np.ndarray
    head_scale: np.ndarray
    ending: np.ndarray
    closing: np.ndarray
    reach: int

    @property
    def blocks(self) -> int:
        """Blocks of the piece, the last one padded."""
        return -(-self.rows // BLOCK)

    @classmethod
    def of_pieces(cls, lasts: Sequence[np.ndarray], powers: np.ndarray) -> list[_BlockEnds]:
        """Every piece's, from whole-batch operations over the trajectories' ends (a few
        per batch, none per row): ``lasts`` as :class:`DiscountedSuffixSums` takes them."""
        last = np.concatenate([np.zeros(0, np.int64), *lasts]).astype(np.int64, copy=False)
        bounds = np.cumsum([0, *(len(x) for x in lasts)])  # each piece's trajectories
        first = bounds[:-1][bounds[:-1] < len(last)]  # each piece's first trajectory
        previous = np.concatenate(([-1], last[:-1]))
        previous[first] = -1  # each piece counts its rows from 0
        following = np.concatenate((last[1:], [-1]))
        following[first[1:] - 1] = -1  # none after a piece's last trajectory
        block, col = last >> BLOCK_BITS, last & (BLOCK - 1)  # floor division and remainder
        closes = col == BLOCK - 1
        inner = np.flatnonzero(~closes)  # the ends inside a block, before its last row
        e, f, b = last[inner], following[inner], block[inner]
        same = f >> BLOCK_BITS == b  # the next trajectory ends in this block too
        cut = same & (f & (BLOCK - 1) != BLOCK - 1)
        ints = np.stack((e, e + 1, np.where(cut, f + 1, e + 1), b))  # ends, next, next_cut, block
        scales = np.stack(
            (
                np.where(cut, powers[np.clip(f - e, 0, BLOCK)], 0.0),
                np.where(same, 0.0, powers[BLOCK - 1 - col[inner]]),
            )
        )
        head = inner[previous[inner] < b << BLOCK_BITS]  # a block's first trajectory ends in it
        head_ints = np.stack((block[head] << BLOCK_BITS, last[head] + 1))
        head_scale = powers[col[head] + 1]
        at_inner = np.searchsorted(inner, bounds).tolist()
        at_head = np.searchsorted(head, bounds).tolist()
        at_close = np.concatenate(([0], np.cumsum(closes)))[bounds].tolist()
        closing = block[closes]
        spans = ((last - previous) >> BLOCK_BITS) + 1  # the blocks a trajectory passes through
        filled = bounds[:-1] < bounds[1:]  # the pieces with trajectories
        reach = np.zeros(len(lasts), np.int64)  # each piece's most
        if filled.any():
            reach[filled] = np.maximum.reduceat(spans, bounds[:-1][filled])
        reach, rows = reach.tolist(), [int(x[-1]) + 1 if len(x) else 0 for x in lasts]
        at = bounds.tolist()
        out = []
        for k in range(len(lasts)):
            i, h = slice(at_inner[k], at_inner[k + 1]), slice(at_head[k], at_head[k + 1])
            (ends, nxt, next_cut, blk), (next_scale, carry_scale) = ints[:, i], scales[:, i]
            out.append(
                cls(
                    rows=rows[k],
                    ends=ends,
                    next=nxt,
                    next_cut=next_cut,
                    block=blk,
                    next_scale=next_scale,
                    carry_scale=carry_scale,
                    head_rows=head_ints[0, h],
                    head_next=head_ints[1, h],
                    head_scale=head_scale[h],
                    ending=block[at[k] : at[k + 1]],
                    closing=closing[at_close[k] : at_close[k + 1]],
                    reach=reach[k],
                )
            )
        return out


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
#: operations over N / BLOCK rows; the doubling across blocks works on N / BLOCK heads.
#: A power of two, so that a row's block and column are a shift and a mask (numpy's
#: ``//`` and ``%`` of int64 arrays are several times slower)
BLOCK_BITS = 4
BLOCK = 1 << BLOCK_BITS


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
    at = (last & (BLOCK - 1), last >> BLOCK_BITS)  # (column, block) of each last row
    kept = coef[at]
    coef[at] = 0.0
    step = np.empty(values.shape[1])
    for j in range(BLOCK - 2, -1, -1):  # inside every block at once, back to front
        np.multiply(coef[j], values[j + 1], out=step)
        values[j] += step
    reach = int(np.diff(last, prepend=-1).max()) // BLOCK + 1  # see _carry_across_blocks
    carry = _carry_across_blocks(values[0], np.prod(coef, axis=0), reach)
    for j in range(BLOCK - 1, -1, -1):  # what follows the block, reaching row j
        carry *= coef[j]
        values[j] += carry
    coef[at] = kept
    np.copyto(flat.reshape(-1, BLOCK), values.T)
    return flat[:rows]


def _carry_across_blocks(heads: np.ndarray, through: np.ndarray, reach: int) -> np.ndarray:
    """For each block, the full sum at the next block's first row (0 after the last):
    ``z[b] = heads[b] + through[b] * z[b+1]`` by recursive doubling, ``through[b]`` being
    the product of a block's coefficients (0 unless its first row's trajectory goes past
    it; ``through`` is overwritten). ``reach`` exceeds the most blocks in a row whose
    product is not 0: the doubling stops at a span of ``reach``, after ``log2(reach)``
    steps (``log2`` of the longest trajectory in blocks)."""
    n = len(heads)
    z = np.zeros(n + 1)  # z[n]: nothing after the last block
    z[:n] = heads
    ahead, mult = np.empty(n), through
    span = 1
    while span < min(n, reach):
        np.multiply(mult[:-span], z[span:n], out=ahead[:-span])
        np.add(z[: n - span], ahead[:-span], out=z[: n - span])
        if 2 * span < reach:
            np.multiply(mult[:-span], mult[span:], out=mult[:-span])
        span *= 2
    return z[1:]
