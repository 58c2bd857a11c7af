"""Wall-clock bounds that scale with how fast this machine runs right now.

A test that must check that something is *prompt* (a deadline cut a connection, a stop
did not wait for a kill deadline) cannot use a fixed number of seconds: on a CI machine
shared with busy neighbours every step takes several times longer. ``scaled(s)`` is ``s``
times the machine's current slowness: how much longer a fixed piece of pure-Python work
takes now than it takes on an idle reference core (never below 1). Prefer a condition
polled with a deadline (see ``wait_until``) wherever the test can observe one.

``RLCONNECT_TEST_SLOWNESS`` (a float) sets a floor on the factor, for machines known to be
slow (emulated, sanitised or throttled builds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

# seconds the calibration work takes on an idle core of the project's 2-core VM (measured
# 6.8-7.9 ms; 16-48 ms beside four busy loops); a faster machine gets factor 1
REFERENCE_S = 0.007
_ROUNDS = 5


def _work() -> float:
    """Seconds taken by a fixed loop of interpreter work (what most tests wait on)."""
    start = time.perf_counter()
    total = 0
    for i in range(60_000):
        total += i * i % 7
    assert total > 0
    return time.perf_counter() - start


def slowness() -> float:
    """How many times slower than the reference this machine runs now (at least 1).

    The median of a few rounds: one unlucky time slice does not decide it, a machine whose
    cores are shared with busy neighbours does."""
    times = sorted(_work() for _ in range(_ROUNDS))
    floor = float(os.environ.get("RLCONNECT_TEST_SLOWNESS", "1") or 1)
    return max(1.0, floor, times[_ROUNDS // 2] / REFERENCE_S)


def scaled(seconds: float) -> float:
    """``seconds`` stretched by the machine's current slowness."""
    return seconds * slowness()


def wait_until(condition: Callable[[], object], within_s: float = 10.0) -> bool:
    """Poll ``condition`` until it is true or ``scaled(within_s)`` has passed."""
    deadline = time.monotonic() + scaled(within_s)
    while not condition():
        if time.monotonic() > deadline:
            return bool(condition())
        time.sleep(0.02)
    return True
