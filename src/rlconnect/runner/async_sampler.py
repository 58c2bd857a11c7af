"""``RunnerConfig(sample_async=True)``: sampling in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["AsyncSampler"]


class AsyncSampler:
    """Samples in a background thread; ``next()`` returns the next ready batch."""

    def __init__(self, sample: Callable[[], Any]) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sample,), daemon=True)
        self._thread.start()

    def _run(self, sample: Callable[[], Any]) -> None:
        while not self._stop.is_set():
            try:
                item: Any = sample()
            except BaseException as exc:  # handed to the caller of next()
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def next(self) -> Any:
        """The next batch the thread sampled, waiting for it; re-raises the thread's error."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """Ask the thread to stop and wait for it (up to 5 s) to finish its batch."""
        self._stop.set()
        self._thread.join(timeout=5)
