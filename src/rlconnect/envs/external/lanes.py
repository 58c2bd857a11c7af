"""The lanes of an external env: one event queue per sub-env id, and which lane goes next.

A running episode that is recorded holds one lane (a sub-env id, ``0 .. n - 1``) and queues
its events there; a poll takes at most one event of every lane that has some, so each lane
is a sequence of episodes exactly like a stepped sub-env. A new episode gets the lowest
empty free lane when there is one, and only otherwise a lane whose ended episode still has
events queued (a *draining* lane), so backlogs spread over the lanes and drain in parallel.

``Lanes`` is plain data: the episode hub's lock guards every call.
"""

from __future__ import annotations

import collections
import heapq
import time
from typing import Any

__all__ = ["Lanes"]


class Lanes:
    """The event queues of ``n`` lanes; ``ready`` lists the lanes with queued events
    (oldest first), ``ready_since`` when the first of them came, ``queued`` counts the
    events."""

    def __init__(self, n: int) -> None:
        self.queues: list[collections.deque[Any]] = [collections.deque() for _ in range(n)]
        self.free = list(range(n))  # a heap: the lowest lane first
        self.draining: set[int] = set()  # free lanes whose ended episodes have events queued
        self.ready: dict[int, None] = {}
        self.ready_since = 0.0
        self.queued = 0

    @property
    def in_use(self) -> int:
        """Lanes not free: held by a running episode, or draining an ended one's events."""
        return len(self.queues) - len(self.free)

    def assign(self) -> int:
        """The lowest empty free lane, else the lowest one still draining an ended episode
        (the caller checked that the running episodes leave one)."""
        if self.free:
            return heapq.heappop(self.free)
        lane = min(self.draining)
        self.draining.discard(lane)
        return lane

    def release(self, lane: int) -> None:
        """A lane's episode ended: the lane is free (draining while events are queued)."""
        if self.queues[lane]:
            self.draining.add(lane)
        else:
            heapq.heappush(self.free, lane)

    def push(self, lane: int, event: Any) -> bool:
        """Queue ``event`` on ``lane``; True when it is the first event any lane holds."""
        self.queues[lane].append(event)
        self.queued += 1
        first = not self.ready
        if first:
            self.ready_since = time.monotonic()
        self.ready[lane] = None
        return first

    def take(self) -> list[Any]:
        """One queued event of every ready lane; drained lanes are freed. What is left
        (a backlog) is due at once: ``ready_since`` goes back to the start of time."""
        events = []
        still: dict[int, None] = {}
        for lane in self.ready:
            queue = self.queues[lane]
            events.append(queue.popleft())
            if queue:
                still[lane] = None
            elif lane in self.draining:
                self.draining.discard(lane)
                heapq.heappush(self.free, lane)
        self.queued -= len(events)
        self.ready = still
        self.ready_since = float("-inf")
        return events

    def queued_events(self) -> list[Any]:
        """Every event still queued (to fail their replies on close)."""
        return [ev for queue in self.queues for ev in queue]
