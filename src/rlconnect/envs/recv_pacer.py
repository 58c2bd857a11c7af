"""``RecvPacer``: when to block in an engine's receive after sending it a step.

After the runner sends EnvPool its actions, it records the poll's rows and then blocks in
EnvPool's ``recv`` until the step is done. A thread that blocks sleeps, and on the virtual
machines these benchmarks run on waking it again costs tens of microseconds (an idle
virtual CPU halts: the guest's halt polling is off). EnvPool spins a little before it
sleeps, but its step of 64 CartPoles takes longer than that spin, so the runner slept in
nearly every poll and paid a wake-up each time (CartPole N=64, sync).

The pacer therefore keeps the runner awake, giving its CPU away at each look
(``yielding.yield_until``: EnvPool's threads go first where they share it), until a
learned delay after the send, and only then calls the blocking receive. It cannot see
when the step is done, so it learns the delay from how long each receive then took,
against the fastest receive seen (one whose results were ready):

- much longer, but within reach (``REACH_S``): the runner slept, so the next wait is
  longer (by ``UP_S``);
- not much longer: the results were there, or came while the engine itself spun, so the
  next wait is a little shorter (by ``DOWN_S``): waiting past the step's end only delays
  the poll;
- longer than reach (an Atari step, a slow simulator): waiting is no use; start from 0.

So the delay settles where about ``DOWN_S / (UP_S + DOWN_S)`` of the receives sleep: a
sleep costs a wake-up, a wait too long costs its overshoot in every poll.
``python benchmarks/bench_envpool_pacer.py`` compares it with fixed delays and with none
(CartPole N=64, sync: the best fixed delay was about 60 us after the send, 80 us already
did worse than a shorter one, and blocking at once slept in nearly every poll).

The receive is always called, so the pacer only ever moves the moment the runner blocks,
never what it receives; the worst a wrong delay costs is a sleep or a wait of
``MAX_WAIT_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from rlconnect.envs.yielding import yield_until

__all__ = ["DOWN_S", "MAX_WAIT_S", "REACH_S", "SLEPT_S", "UP_S", "RecvPacer"]

T = TypeVar("T")

MAX_WAIT_S = 150e-6
"""The longest the pacer waits after a send before it calls the blocking receive."""
REACH_S = 250e-6
"""A receive that took longer than this after the wait (beyond the fastest receive) means
the step costs far more than a wake-up: the pacer stops waiting."""
SLEPT_S = 25e-6
"""A receive longer than the fastest one by more than this slept (a wake-up costs tens of
microseconds; the engine's own spin catches results within a few)."""
UP_S, DOWN_S = 8e-6, 1e-6
"""How much longer the next wait is after a sleep, and how much shorter after none."""


class RecvPacer:
    """Call ``sent()`` after each send and receive with ``recv(fn)`` (see the module
    docstring); ``wait_s`` is the delay it has learned."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self._sent_at = 0.0
        self._fastest = float("inf")  # the quickest receive seen, results ready

    def sent(self) -> None:
        """The step was just sent."""
        self._sent_at = time.perf_counter()

    def recv(self, receive: Callable[[], T]) -> T:
        """``receive()``, called once the learned delay after the last send has passed."""
        clock = time.perf_counter
        if self.wait_s:
            yield_until(self._sent_at + self.wait_s)
        t0 = clock()
        out = receive()
        self.learn(clock() - t0)
        return out

    def learn(self, took_s: float) -> None:
        """Adjust the delay to how long a receive took after it."""
        self._fastest = fastest = min(self._fastest, took_s)
        extra = took_s - fastest
        if extra > REACH_S:
            self.wait_s = 0.0
        elif extra > SLEPT_S:
            self.wait_s = min(self.wait_s + UP_S, MAX_WAIT_S)
        else:
            self.wait_s = max(self.wait_s - DOWN_S, 0.0)
