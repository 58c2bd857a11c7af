"""Callbacks: hooks into the sampling loop, called with keyword arguments only."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rlconnect.errors import CallbackError, describe_exception

__all__ = ["Callbacks"]

HOOKS = (
    "on_episode_created",
    "on_episode_start",
    "on_episode_step",
    "on_episode_end",
    "on_postprocess_trajectory",
    "on_sample_end",
)


def _where(kwargs: dict[str, Any]) -> str:
    parts = []
    if "env_index" in kwargs:
        parts.append(f"env_index={kwargs['env_index']}")
    episode = kwargs.get("episode")
    if episode is not None and hasattr(episode, "episode_id"):
        parts.append(f"episode_id={episode.episode_id}")
    if "agent_id" in kwargs:
        parts.append(f"agent_id={kwargs['agent_id']!r}")
    return f" ({', '.join(parts)})" if parts else ""


def _guarded(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose errors become a CallbackError naming the class, the hook and where."""

    @functools.wraps(fn)
    def hook(self: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, **kwargs)
        except CallbackError:
            raise
        except Exception as exc:
            raise CallbackError(
                f"callback {type(self).__name__}.{name}{_where(kwargs)} raised "
                f"{describe_exception(exc)}"
            ) from exc

    hook._rlconnect_guarded = True  # type: ignore[attr-defined]
    return hook


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

    An exception in a hook reaches the caller of ``sample()`` as ``rlconnect.errors.
    CallbackError`` naming the class and hook (the original as ``__cause__``); the
    runner then refuses to sample on (``RunnerStateError``), as after any error midway.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in HOOKS:
            fn = cls.__dict__.get(name)
            if callable(fn) and not getattr(fn, "_rlconnect_guarded", False):
                setattr(cls, name, _guarded(name, fn))

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
