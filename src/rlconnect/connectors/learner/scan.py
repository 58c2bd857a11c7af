"""Segmented reverse scans over a whole batch: discounted sums within each trajectory.

Every built-in learner connector reduces to one of three sums over the rows that follow a
row in its trajectory (``rem[t]`` of them, see :mod:`.trajectories`):

- :func:`discounted_suffix_sum`: ``y[t] = sum_{i=0..rem[t]} d**i * x[t+i]`` (GAE, returns);
- :func:`discounted_window_sum`: the same over at most ``n`` terms (n-step returns);
- :func:`linear_suffix_scan`: ``y[t] = x[t] + a[t] * y[t+1]`` with per-row ``a`` (V-trace).

They run as recursive doubling (a Kogge-Stone scan): after the step of span ``s`` each row
holds the sum of its next ``2s`` terms, made from its own ``s``-term sum and that of the row
``s`` ahead when that row is in the same trajectory. ``ceil(log2(longest trajectory))``
steps, each a few whole-array numpy operations, so the work is ``O(N log T)`` and there is
no Python loop over rows or trajectories. Connectors run them piece by piece
(:meth:`.trajectories.Trajectories.pieces`: whole trajectories, ~32k rows a piece) so
that every work array stays in cache between steps.

Numerics: everything is float64. Every step adds terms scaled by products of discounts in
[0, 1] (no division, no growing powers such as ``d**-t``, no cancellation between a global
cumulative sum and its shifted copy), so each output is a sum of its exact terms with
about ``log2(T)`` float64 roundings per term, far below the float32 the connectors
return. tests/connectors/learner/test_learner_scan.py holds them to 1e-11 (relative to
the largest term) of sequential float64 loops, on trajectories of up to 5000 rows with
terms spanning six orders of magnitude.
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


def discounted_suffix_sum(
    x: np.ndarray, rem: np.ndarray, discount: float, *, in_place: bool = False
) -> np.ndarray:
    """``y[t] = sum_{i=0..rem[t]} discount**i * x[t+i]``: float64 (N,); with ``in_place``
    a float64 ``x`` is overwritten and returned (no copy)."""
    y = x if in_place and x.dtype == np.float64 else np.array(x, dtype=np.float64)
    work = _Scratch(len(y))
    longest = int(rem.max()) + 1 if len(rem) else 0
    span, factor = 1, float(discount)
    while span < longest and factor != 0.0:
        _double(y, rem, span, factor, work)
        span, factor = 2 * span, factor * factor
    return y


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


def linear_suffix_scan(
    x: np.ndarray, coef: np.ndarray, rem: np.ndarray, *, in_place: bool = False
) -> np.ndarray:
    """``y[t] = x[t] + coef[t] * y[t+1]`` within each trajectory: float64 (N,); with
    ``in_place`` a float64 ``x`` is overwritten and returned.

    ``coef`` is ignored on each trajectory's last row (nothing follows it there). The
    products of coefficients over each span double along with the sums."""
    y = x if in_place and x.dtype == np.float64 else np.array(x, dtype=np.float64)
    mult = np.array(coef, dtype=np.float64)
    mult[rem == 0] = 0.0
    ahead = np.empty(len(y))
    longest = int(rem.max()) + 1 if len(rem) else 0
    span = 1
    while span < longest:
        buf = ahead[: len(y) - span]
        np.multiply(mult[:-span], y[span:], out=buf)
        y[:-span] += buf
        mult[:-span] *= mult[span:]
        span *= 2
    return y
