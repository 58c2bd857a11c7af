"""``Leftovers``: what the runner no longer needs, let go of a little at every poll.

Building a batch leaves things to free: the recorder's per-poll arrays (hundreds of small
numpy arrays per batch) and the episodes of trajectories handed out whole. Freed at once,
they lengthen the pause at every batch boundary, on the runner's critical path. Held
here, they go a few at each poll once its actions are out: with an env that steps on
threads of its own (EnvPool) in time the runner would otherwise spend waiting for the
step. Elsewhere the runner's work between polls is what the envs wait for, so there
nothing is held (``hold=False``): freeing at once costs no more.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["Leftovers"]


class Leftovers:
    """References to let go of gradually: ``put`` them, ``release()`` once per poll
    (``hold=False``: ``put`` keeps nothing, so they go at once)."""

    def __init__(self, *, hold: bool = True, per_poll: int = 16) -> None:
        self.hold = hold
        self.per_poll = per_poll
        self._items: list[Any] = []

    def __len__(self) -> int:
        return len(self._items)

    def put(self, items: Iterable[Any]) -> None:
        """Keep ``items`` until released (their last references, usually)."""
        if self.hold:
            self._items.extend(items)

    def release(self) -> None:
        """Let go of ``per_poll`` items, or a 32nd of them if that is more: however many
        come per batch, they never pile up."""
        items = self._items
        if items:
            del items[-max(self.per_poll, len(items) // 32) :]
