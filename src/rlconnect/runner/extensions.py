"""How upper layers plug into a runner without the runner importing them.

The runner sits below offline I/O, serving and Ray. A layer above it configures runners
with a *config section*: a frozen settings record that ``RunnerConfig`` holds as one of
its fields (``RunnerConfig.offline``, an ``rc.OfflineConfig``) and that attaches what
it configures to every runner built with it (``section.attach(runner)``, at the end of
``EnvRunner.__init__``). The section's class declares its settings, defaults and checks;
the runner layer never names them. A layer registers its section's class once
(``register_config_section(field, cls)``) so that ``RunnerConfig`` accepts the section
as a dict of its settings (config files, checkpoints) and each of its settings as a
keyword of its own (``RunnerConfig(output=DIR)`` is ``RunnerConfig(offline=
rc.OfflineConfig(output=DIR))``).

What a section attaches plugs in through two hooks:

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
from typing import Any, Protocol, runtime_checkable

import attrs

__all__ = [
    "BatchSink",
    "BatchSource",
    "ConfigSection",
    "config_sections",
    "register_config_section",
]

BatchSink = Callable[[Any, dict[str, Any]], None]


class BatchSource(Protocol):
    """Where ``sample()`` takes its batches from instead of the envs."""

    def next(self) -> Any:
        """The next batch."""

    def take_metrics(self) -> list[dict[str, Any]]:
        """Records the source made since the last call (``get_off_policy_metrics``)."""


@runtime_checkable
class ConfigSection(Protocol):
    """Settings an upper layer owns, held by ``RunnerConfig`` as one field."""

    def attach(self, runner: Any) -> None:
        """Plug what these settings ask for into ``runner`` (its sinks, its source)."""

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-able values (``cls(**to_dict())`` builds them again)."""

    def without_paths(self) -> ConfigSection:
        """These settings with every file path at its default (what a checkpoint's saved
        config keeps: a file must not choose where a rebuilt runner reads or writes)."""


_SECTIONS: dict[str, type] = {}


def register_config_section(field: str, cls: type) -> type:
    """Make ``cls`` (an attrs class, each instance a ``ConfigSection``) the kind of
    ``RunnerConfig.<field>``: a dict given there is built into a ``cls``, and each of
    ``cls``' settings is accepted as a keyword of ``RunnerConfig`` itself."""
    from rlconnect.runner.config import RunnerConfig

    fields = attrs.fields_dict(RunnerConfig)
    if field not in fields or fields[field].metadata.get("section") is not True:
        raise ValueError(f"RunnerConfig has no config section {field!r}")
    clash = sorted(set(attrs.fields_dict(cls)) & set(fields))
    if clash:
        raise ValueError(f"{cls.__name__} settings {clash} clash with RunnerConfig's own")
    _SECTIONS[field] = cls
    return cls


def config_sections() -> dict[str, type]:
    """``{RunnerConfig field: section class}`` of the registered sections."""
    return dict(_SECTIONS)
