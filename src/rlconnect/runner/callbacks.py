"""Callbacks: hooks into the sampling loop, called with keyword arguments only."""

from __future__ import annotations

from typing import Any

__all__ = ["Callbacks"]


class Callbacks:
    """Override any hook; each receives keyword arguments, so ``**kwargs`` keeps it future-proof.

    - ``on_episode_created(runner, base_env, env_index, episode)``: before the first obs.
    - ``on_episode_start(runner, base_env, policies, env_index, episode)``: first obs seen.
    - ``on_episode_step(runner, base_env, policies, env_index, episode)``: after each step.
    - ``on_episode_end(runner, base_env, policies, env_index, episode)``: episode over
      (also for faulty episodes, with ``episode.faulty`` set).
    - ``on_postprocess_trajectory(runner, episode, agent_id, policy_id, policies,
      postprocessed_batch, original_batches)``: after ``policy.postprocess_trajectory``.
    - ``on_sample_end(runner, samples)``: a batch is about to be returned.
    """

    def on_episode_created(self, **kwargs: Any) -> None:
        """A new episode object exists; the env is about to give its first observation."""

    def on_episode_start(self, **kwargs: Any) -> None:
        """The episode's first observations were processed."""

    def on_episode_step(self, **kwargs: Any) -> None:
        """One env step of the episode was processed."""

    def on_episode_end(self, **kwargs: Any) -> None:
        """The episode ended (terminated, truncated, or faulty)."""

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        """One agent trajectory was postprocessed; ``postprocessed_batch`` may be edited."""

    def on_sample_end(self, **kwargs: Any) -> None:
        """``sample()`` is about to return ``samples``."""

    def overrides(self, name: str) -> bool:
        """True when a subclass implements hook ``name`` (the runner skips the others)."""
        return getattr(type(self), name) is not getattr(Callbacks, name)
