"""The decoder thread of a PolicyServer: large bodies decoded one at a time, fairly.

A body above ``wire.INLINE_BYTES`` is walked and decoded off the event loop, in one thread.
Each peer (the client's IP address) has its own queue, and the thread takes one body from
each peer with work in turn (round-robin), so a peer that sends many costly bodies makes
another peer's body wait for at most one of its bodies, not for all of them. The bodies
waiting here stay charged to the server's body budget (and their peer's share of it), so
the queues are bounded by that budget.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FairDecoder"]

Done = Callable[[Any, BaseException | None], None]


class FairDecoder:
    """``submit(peer, body, done)`` decodes ``body`` with ``decode`` in the decoder thread
    and calls ``done(value, error)`` there; peers take turns."""

    def __init__(self, decode: Callable[[bytes], Any], name: str = "PolicyServer-decode") -> None:
        self._decode = decode
        self._lock = threading.Condition()
        self._queues: dict[str, collections.deque[tuple[bytes, Done]]] = {}
        self._turns: collections.deque[str] = collections.deque()  # peers with work, in turn
        self._stopped = False
        self.decoded = 0  # bodies decoded so far
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Bodies waiting for the thread."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def submit(self, peer: str, body: bytes, done: Done) -> None:
        """Queue ``body`` behind ``peer``'s others; RuntimeError once the decoder is stopped."""
        with self._lock:
            if self._stopped:
                raise RuntimeError("the decoder is stopped")
            queue = self._queues.get(peer)
            if queue is None:
                queue = self._queues[peer] = collections.deque()
                self._turns.append(peer)
            queue.append((body, done))
            self._lock.notify()

    def _next(self) -> tuple[bytes, Done] | None:
        """The next body to decode (the next peer's turn), None once stopped."""
        with self._lock:
            while not self._turns and not self._stopped:
                self._lock.wait()
            if self._stopped:
                return None
            peer = self._turns.popleft()
            queue = self._queues[peer]
            job = queue.popleft()
            if queue:
                self._turns.append(peer)  # its next body waits for every other peer's
            else:
                del self._queues[peer]
            return job

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            body, done = job
            try:
                value = self._decode(body)
            except Exception as exc:
                done(None, exc)
            else:
                done(value, None)
            self.decoded += 1

    def stop(self) -> None:
        """No more bodies; the ones waiting are dropped (their server is going)."""
        with self._lock:
            self._stopped = True
            self._queues.clear()
            self._turns.clear()
            self._lock.notify_all()
