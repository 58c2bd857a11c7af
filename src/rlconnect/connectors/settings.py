"""ConnectorSettings: the config keys the default pipelines read, declared and checked once.

``RunnerConfig`` takes these keys as its own fields (each field's default and check come
from here) and hands them to the pipelines as ``ctx.config``
(``RunnerConfig.connector_config()``); ``default_agent_pipeline`` and
``default_action_pipeline`` read them back with :meth:`ConnectorSettings.from_config`, so
a hand-built ``ConnectorContext`` gets the same checks and messages.

>>> s = ConnectorSettings.from_config({"framestack": 4, "num_envs": 8})  # others ignored
>>> s.framestack, s.observation_filter
(4, 'NoFilter')
>>> ConnectorSettings(framestack=0)
Traceback (most recent call last):
...
ValueError: connector setting framestack=0: must be None or an int >= 1
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = [
    "OBSERVATION_FILTERS",
    "OBSERVATION_FILTER_SYNCS",
    "PRESETS",
    "ConnectorSettings",
    "setting_field",
]

OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")
"""Values of ``observation_filter``."""
OBSERVATION_FILTER_SYNCS = ("immediate", "frozen")
"""Values of ``observation_filter_sync``."""
PRESETS = ("atari",)
"""Values of ``preset`` besides None."""


def _one_of(allowed: tuple[str, ...], *, optional: bool = False) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not (optional and value is None) and value not in allowed:
            prefix = "None or " if optional else ""
            raise ValueError(f"must be {prefix}one of {list(allowed)}")

    return check


def _true_or_false(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError("must be True or False")


def _reward_clip(value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, numbers.Real) or not float(value) > 0:
        raise ValueError(
            "must be None or False (off), True (keep the sign) or a positive number "
            "(clip to [-x, x])"
        )


def _frame_count(value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError("must be None or an int >= 1")


def _python_number(value: Any) -> Any:
    """NumPy scalars as Python ints / floats (so configs stay JSON-able); other values
    unchanged, for the check to judge."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


#: name -> (default, check); the one declaration every user of these keys reads
_SETTINGS: dict[str, tuple[Any, Callable[[Any], None]]] = {
    "observation_filter": ("NoFilter", _one_of(OBSERVATION_FILTERS)),
    "observation_filter_sync": ("immediate", _one_of(OBSERVATION_FILTER_SYNCS)),
    "clip_rewards": (None, _reward_clip),
    "framestack": (None, _frame_count),
    "clip_actions": (False, _true_or_false),
    "normalize_actions": (True, _true_or_false),
    "preset": (None, _one_of(PRESETS, optional=True)),
}

_NUMBERS = ("clip_rewards", "framestack")  # numbers from numpy arrive as numpy scalars


def setting_field(name: str, owner: str) -> Any:
    """An attrs field with the default and the check of connector setting ``name``; a bad
    value raises ValueError ``"{owner}{name}={value!r}: <what is allowed>"``.

    ``RunnerConfig`` declares its connector fields with it (``owner="RunnerConfig."``), so
    they stay flat, typed fields of the config while their rules live here. Typed ``Any``
    like ``attrs.field`` itself: the class annotation gives the attribute its type.
    """
    default, check = _SETTINGS[name]

    def validate(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        try:
            check(value)
        except ValueError as exc:
            raise ValueError(f"{owner}{attribute.name}={value!r}: {exc}") from None

    converter = _python_number if name in _NUMBERS else None
    return attrs.field(default=default, validator=validate, converter=converter)


_OWNER = "connector setting "


@attrs.frozen(kw_only=True)
class ConnectorSettings:
    """The keys of ``ctx.config`` that shape the default pipelines (see
    ``rlconnect.connectors.defaults`` for the chains they build)."""

    #: "NoFilter" or "MeanStdFilter": normalise observations with running statistics
    observation_filter: str = setting_field("observation_filter", _OWNER)
    #: what MeanStdFilter normalises with between syncs: "immediate" (the last sync plus
    #: this runner's own data so far) or "frozen" (the statistics of the last sync point;
    #: docs/scaling.md)
    observation_filter_sync: str = setting_field("observation_filter_sync", _OWNER)
    #: None or False (off), True (keep the reward's sign) or a number x > 0 (clip to [-x, x])
    clip_rewards: bool | float | None = setting_field("clip_rewards", _OWNER)
    #: stack this many frames (None: no stacking; the Atari preset's default is 4)
    framestack: int | None = setting_field("framestack", _OWNER)
    #: clip actions into the Box bounds (action pipeline)
    clip_actions: bool = setting_field("clip_actions", _OWNER)
    #: map policy outputs in [-1, 1] to the Box bounds (action pipeline)
    normalize_actions: bool = setting_field("normalize_actions", _OWNER)
    #: preprocessing preset: None or "atari" (the DeepMind Atari chain)
    preset: str | None = setting_field("preset", _OWNER)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ConnectorSettings:
        """The settings among ``config``'s keys (other keys are ignored: the config is
        shared with the runner); missing ones take their defaults."""
        return cls(**{k: config[k] for k in _SETTINGS if k in config})

    @property
    def reward_limit(self) -> tuple[bool, float | None]:
        """``(clip?, limit)``: ``(False, None)`` off, ``(True, None)`` sign, ``(True, x)``."""
        value = self.clip_rewards
        if value is None or value is False:
            return False, None
        if value is True:
            return True, None
        return True, float(value)

    def to_config(self) -> dict[str, Any]:
        """The settings as ``ctx.config`` keys."""
        return attrs.asdict(self)
