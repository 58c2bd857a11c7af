"""Env steps as ``rlconnect sample`` goes, also inside a batch: for the progress display
(which must move even when one batch takes many seconds) and for the env step at which
each episode ended (the x axis of the returns plot).

Nothing here runs per env step: the runner already counts its polls (``perf_stats``
divides by that count), and :class:`LiveSteps` turns that count into env steps when it is
read, by rich's refresh thread (10 times a second) or at an episode's end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlconnect.runner.callbacks import Callbacks


class LiveSteps:
    """Env steps collected so far: exact after each batch (``batch_done``); within a batch,
    estimated as the runner's polls since then times the sub-envs a poll steps, capped at
    the batch's size, so the estimate never runs ahead of the batch being sampled.

    Args:
        polls: the runner's count of polls so far (``runner.timers.steps``).
        per_poll: env steps one poll makes (``env_poll_size``, or ``num_envs``).
        batch: env steps in one batch (``rollout_fragment_length * num_envs``).
    """

    def __init__(self, polls: Callable[[], int], per_poll: int, batch: int) -> None:
        self._polls = polls
        self._per_poll = per_poll
        self._batch = batch
        #: (exact steps after the last batch, the poll count then): one tuple, so a reader
        #: on another thread never sees one half updated
        self._base = (0, polls())

    @classmethod
    def of(cls, runner: Any) -> LiveSteps:
        """The counter of an ``rc.EnvRunner``."""
        cfg = runner.config
        return cls(
            lambda: runner.timers.steps,
            cfg.env_poll_size or runner.num_envs,
            cfg.rollout_fragment_length * runner.num_envs,
        )

    def __call__(self) -> int:
        done, polls = self._base
        return done + min((self._polls() - polls) * self._per_poll, self._batch)

    def batch_done(self, steps: int) -> None:
        """``steps`` env steps are collected, exactly (a batch was returned)."""
        self._base = (steps, self._polls())


class EpisodeEnds(Callbacks):
    """Remembers the env step (read from ``steps``, set once the runner exists) at which
    each episode ended, by episode id."""

    def __init__(self) -> None:
        self.steps = LiveSteps(lambda: 0, 0, 0)
        self.ended: dict[int, int] = {}

    def on_episode_end(self, **kwargs: Any) -> None:
        self.ended[kwargs["episode"].episode_id] = self.steps()

    def pop(self, episode_id: int, default: int) -> int:
        """The step at which ``episode_id`` ended (``default`` if it was not seen)."""
        return self.ended.pop(episode_id, default)
