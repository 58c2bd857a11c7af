"""Env steps as ``rlconnect sample`` goes: inside a batch, for the progress display (which
must move even when one batch takes many seconds), and at each episode's end, for the x
axis of the returns plot.

Nothing here runs per env step: the runner already counts its polls (``perf_stats``
divides by that count), and :class:`LiveSteps` turns that count into env steps only when
it is read, by rich's refresh thread (10 times a second).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LiveSteps:
    """Env steps collected so far: exact after each batch (``batch_done``); within a batch,
    the runner's polls since then times the env steps a poll made in the batches before
    (``per_poll`` sub-envs before the first: a poll that only resets makes none), capped
    at the batch's size so the count never runs ahead of the batch being sampled.

    Args:
        polls: the runner's count of polls so far (``runner.timers.steps``).
        per_poll: sub-envs one poll steps (``env_poll_size``, or ``num_envs``).
        batch: env steps in one batch (``rollout_fragment_length * num_envs``).
    """

    def __init__(self, polls: Callable[[], int], per_poll: int, batch: int) -> None:
        self._polls = polls
        self._batch = batch
        self._first_polls = polls()
        #: (exact steps after the last batch, the poll count then, steps per poll): one
        #: tuple, so a reader on another thread never sees it half updated
        self._base = (0, self._first_polls, float(per_poll))

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
        """The estimate now: steps of finished batches plus the current batch's share so far,
        never past the batch's size."""
        done, polls, rate = self._base
        return done + min(int((self._polls() - polls) * rate), self._batch)

    def batch_done(self, steps: int) -> None:
        """``steps`` env steps are collected, exactly (a batch was returned)."""
        polls = self._polls()
        rate = steps / max(polls - self._first_polls, 1)
        self._base = (steps, polls, rate)


class EpisodeClock:
    """The env step at which each episode ended, from the episodes' own lengths: a sub-env's
    episodes follow one another, so the lengths of its episodes so far (faulty ones too)
    are the steps it has made; its ``num_envs`` sub-envs step together, so the run had made
    ``num_envs`` times that many (exact for synchronous polls, close for asynchronous ones).
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self._steps_of_env: dict[int, int] = {}

    def ended(self, env_id: int, length: int) -> int:
        """An episode of ``length`` steps ended in sub-env ``env_id``: the run's env step."""
        steps = self._steps_of_env.get(env_id, 0) + length
        self._steps_of_env[env_id] = steps
        return self.num_envs * steps
