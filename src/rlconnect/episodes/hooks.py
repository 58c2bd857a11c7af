"""``EpisodeHooks``: the episode callbacks, with the arguments every call passes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rlconnect.episodes.episode import Episode

__all__ = ["EpisodeCallbacks", "EpisodeHooks"]


class EpisodeCallbacks(Protocol):
    """What the hooks call: ``rc.Callbacks`` (``overrides(name)`` says which hooks a
    subclass overrides) and its ``on_episode_*`` methods."""

    def overrides(self, name: str) -> bool:
        """Whether the user's callbacks override hook ``name`` (others are not called)."""

    def on_episode_created(self, **kwargs: Any) -> None:
        """An episode object was made for a sub-env, before its first observation."""

    def on_episode_start(self, **kwargs: Any) -> None:
        """An episode's first observation arrived."""

    def on_episode_step(self, **kwargs: Any) -> None:
        """An episode took a step."""

    def on_episode_end(self, **kwargs: Any) -> None:
        """An episode ended (terminated, truncated or cut by the horizon)."""

    def on_postprocess_trajectory(self, **kwargs: Any) -> None:
        """An agent's trajectory was postprocessed into rows."""


class EpisodeHooks:
    """The episode callbacks, with the arguments every call passes (``runner``,
    ``base_env``, ``policies``); hooks a subclass does not override are skipped."""

    def __init__(
        self,
        callbacks: EpisodeCallbacks,
        runner: Any,
        base_env: Any,
        policies: Mapping[str, Any],
    ) -> None:
        self.callbacks: Any = callbacks  #: (the runner's ``rc.Callbacks``)
        self.runner, self.base_env, self.policies = runner, base_env, policies
        self.on_created = callbacks.overrides("on_episode_created")
        self.on_start = callbacks.overrides("on_episode_start")
        self.on_step = callbacks.overrides("on_episode_step")
        self.on_end = callbacks.overrides("on_episode_end")

    def created(self, env_id: int, episode: Episode) -> None:
        """``on_episode_created`` (no ``policies``: RLlib's signature)."""
        if self.on_created:
            self.callbacks.on_episode_created(
                runner=self.runner, base_env=self.base_env, env_index=env_id, episode=episode
            )

    def call(self, hook: Callable[..., None], env_id: int, episode: Episode | None) -> None:
        """``hook`` with the arguments of the per-episode callbacks."""
        hook(
            runner=self.runner,
            base_env=self.base_env,
            policies=self.policies,
            env_index=env_id,
            episode=episode,
        )
