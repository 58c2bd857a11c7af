"""How upper layers plug into a runner without the runner importing them.

The runner sits below offline I/O, serving and Ray. Those layers configure a runner
through three public hooks:

- ``register_runner_extension(fn)``: ``fn(runner)`` runs at the end of every
  ``EnvRunner.__init__`` (``rlconnect.offline`` registers the one that honours
  ``RunnerConfig(output=..., input=...)``);
- ``runner.add_batch_sink(sink)``: ``sink(batch, agent_ids)`` receives every batch that
  ``sample()`` is about to return from live sampling, with the agent id of every row per
  policy (multi-agent; ``{}`` for single-agent runners);
- ``runner.set_batch_source(source)``: ``sample()`` returns ``source.next()`` instead of
  sampling (the source may call ``runner.sample_envs()`` for live batches); the source
  runs ``runner.apply_learner_pipelines(batch)`` itself, before anything that breaks
  trajectories apart (offline input's shuffle buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["BatchSink", "BatchSource", "register_runner_extension", "runner_extensions"]

BatchSink = Callable[[Any, dict[str, Any]], None]


class BatchSource(Protocol):
    """Where ``sample()`` takes its batches from instead of the envs."""

    def next(self) -> Any:
        """The next batch."""

    def take_metrics(self) -> list[dict[str, Any]]:
        """Records the source made since the last call (``get_off_policy_metrics``)."""


_EXTENSIONS: list[Callable[[Any], None]] = []


def register_runner_extension(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Run ``fn(runner)`` at the end of every runner's construction (once per function)."""
    if fn not in _EXTENSIONS:
        _EXTENSIONS.append(fn)
    return fn


def runner_extensions() -> list[Callable[[Any], None]]:
    """The registered extensions, in registration order."""
    return list(_EXTENSIONS)
