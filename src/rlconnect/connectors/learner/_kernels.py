"""The compiled passes behind :mod:`rlconnect.connectors.learner.scan` and
:func:`rlconnect.connectors.learner.trajectories.find_trajectories`.

Each kernel walks the batch once: the scans from its last row back to its first,
trajectory by trajectory (``last_rows``: each trajectory's last row, in row order),
keeping the running sum in float64 and writing each output row once (``window_sums``
reads each row twice, a block at a time); ``trajectory_ends`` from the first row on.
numba compiles a kernel on its first call with each set of input dtypes; this module is
imported only then, so that ``import rlconnect`` does not load numba. The compiled code is
cached on disk (numba's ``cache=True``: next to this file in ``__pycache__``, else in the
user's cache folder, or in ``NUMBA_CACHE_DIR`` when set), so only the first process on a
machine compiles, and later ones load the machine code. Where no cache folder is writable
(a read-only install without ``NUMBA_CACHE_DIR``), every process compiles, as before.
"""

from __future__ import annotations

import numba
import numpy as np


def _compiled(fn):  # type: ignore[no-untyped-def]
    """``fn`` compiled (IEEE arithmetic as written, no fastmath; the GIL released), its
    machine code cached on disk where numba finds a writable folder."""
    try:
        return numba.njit(nogil=True, cache=True)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available": read-only
        return numba.njit(nogil=True)(fn)


@_compiled
def discounted_sums(x, discount, last_rows, after_last, out):  # type: ignore[no-untyped-def]
    """``out[t] = x[t] + discount * out[t+1]`` inside each trajectory, where the value
    after trajectory ``k``'s last row is ``after_last[k]``."""
    for k in range(len(last_rows) - 1, -1, -1):
        first = last_rows[k - 1] + 1 if k else 0
        run = np.float64(after_last[k])
        for t in range(last_rows[k], first - 1, -1):
            run = x[t] + discount * run
            out[t] = run


@_compiled
def linear_sums(x, coef, last_rows, out):  # type: ignore[no-untyped-def]
    """``out[t] = x[t] + coef[t] * out[t+1]`` inside each trajectory (nothing after its
    last row, whose ``coef`` is not read)."""
    for k in range(len(last_rows) - 1, -1, -1):
        first = last_rows[k - 1] + 1 if k else 0
        run = np.float64(x[last_rows[k]])
        out[last_rows[k]] = run
        for t in range(last_rows[k] - 1, first - 1, -1):
            run = x[t] + coef[t] * run
            out[t] = run


@_compiled
def gae(rewards, values, last_rows, after_last, gamma, decay, advantages, targets):  # type: ignore[no-untyped-def]
    """GAE's two columns: ``delta[t] = rewards[t] + gamma * V[t+1] - values[t]`` (``V``
    after trajectory ``k``'s last row: ``after_last[k]``), ``advantages[t] = delta[t] +
    decay * advantages[t+1]`` and ``targets = advantages + values``."""
    for k in range(len(last_rows) - 1, -1, -1):
        first = last_rows[k - 1] + 1 if k else 0
        following, run = np.float64(after_last[k]), 0.0
        for t in range(last_rows[k], first - 1, -1):
            value = np.float64(values[t])
            run = (rewards[t] + gamma * following - value) + decay * run
            advantages[t] = run
            targets[t] = run + value
            following = value


#: what :func:`trajectory_ends` found wrong at its ``bad`` row
GOES_ON_AFTER_END, T_NOT_GROWING = 1, 2


@_compiled
def trajectory_ends(keys, agents, t, terminateds, truncateds, ends):  # type: ignore[no-untyped-def]
    """Writes the last row of each run of rows with one ``(keys, agents)`` key into ``ends``
    (``agents`` and ``t`` may be None) and returns ``(count, bad, what)``: ``bad`` is -1,
    or the first row, inside a run, that ends its episode (``what``: GOES_ON_AFTER_END) or
    whose ``t`` is not below the next row's (T_NOT_GROWING); the scan stops there."""
    count = 0
    for i in range(1, len(keys)):
        if keys[i] != keys[i - 1] or (agents is not None and agents[i] != agents[i - 1]):
            ends[count] = i - 1
            count += 1
        elif terminateds[i - 1] or (truncateds is not None and truncateds[i - 1]):
            return count, i - 1, GOES_ON_AFTER_END
        elif t is not None and t[i] <= t[i - 1]:
            return count, i - 1, T_NOT_GROWING
    if len(keys):
        ends[count] = len(keys) - 1
        count += 1
    return count, -1, 0


@_compiled
def window_sums(x, powers, last_rows, out):  # type: ignore[no-untyped-def]
    """``out[t] = sum_{i < n} powers[i] * x[t+i]`` over the rows of ``t``'s trajectory,
    ``n = len(powers) - 1`` (``powers[i]``: the discount to the ``i``-th power).

    Each trajectory is cut into blocks of ``n`` rows from its first row, visited from the
    last. A window starting at a block's first row is that block; any other is the rest of
    its block (the running suffix sum) and, scaled by the power that reaches it, the start
    of the next block (whose prefix sums the previous step kept): every term is added once
    with its own power, no subtraction."""
    n = len(powers) - 1
    prefix = np.empty(len(x))
    for k in range(len(last_rows)):
        first, last = (last_rows[k - 1] + 1 if k else 0), last_rows[k]
        for start in range(first + (last - first) // n * n, first - 1, -n):
            end = min(start + n - 1, last)
            run = 0.0
            for t in range(end, start - 1, -1):
                run = x[t] + powers[1] * run
                out[t] = run
                if t > start and end < last:  # the window reaches into the next block
                    out[t] += powers[end + 1 - t] * prefix[min(t + n - 1, last)]
            run = 0.0
            for t in range(start, end + 1):
                run += powers[t - start] * x[t]
                prefix[t] = run
