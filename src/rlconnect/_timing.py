"""Which polls, and which calls of a pipeline, are timed, and what each timing weighs.

Reading the clock costs about as much as a small connector (``time.perf_counter``: a few
hundred nanoseconds, and the runner reads it twice per stage of a poll), so after the
first ``EXACT_CALLS`` the stage and connector timings of ``perf_stats()`` and
``metrics()`` are measured on a random eighth of the polls (or calls), each weighing 8:
the weighted sum of the timed seconds estimates the seconds of all of them. The draw is
fixed, and not every eighth call: a workload with a period (a reset every eighth poll)
cannot fall in step with it. Call ``k`` weighs ``WEIGHT[k & TIMED_MASK]`` (0.0: untimed).

>>> WEIGHT[:EXACT_CALLS] == (1.0,) * EXACT_CALLS, sorted(set(WEIGHT))
(True, [0.0, 1.0, 8.0])
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXACT_CALLS", "TIMED_MASK", "WEIGHT"]

EXACT_CALLS = 64  #: the first calls of every 4,096 are all timed: short runs are measured
TIMED_MASK = 4095  #: the weights repeat every 4,096 calls
_SHARE = 8  #: after the first calls, one in this many (drawn) is timed
_drawn = np.random.default_rng(20261202).random(TIMED_MASK + 1) < 1 / _SHARE
_weights = np.where(_drawn, float(_SHARE), 0.0)
_weights[:EXACT_CALLS] = 1.0
WEIGHT: tuple[float, ...] = tuple(_weights.tolist())
