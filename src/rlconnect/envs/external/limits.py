"""How long an external env's episode hub waits and how much it holds: ``HubLimits``.

One frozen object, checked when it is made: an ``ExternalEnv`` builds its hub with the two
timeouts it takes, and a ``PolicyServer`` puts its own in force (derived from its
``ServerSettings`` by these fields' names).
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["HubLimits"]


def _positive(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) and value > 0):
        raise ValueError(f"{attr.name} must be a number > 0, got {value!r}")


def _count_or_none(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{attr.name} must be an int >= 0 or None, got {value!r}")


def _non_negative(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) and value >= 0):
        raise ValueError(f"{attr.name} must be >= 0, got {value!r}")


def _non_negative_or_none(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _non_negative(inst, attr, value)


@attrs.frozen(kw_only=True)
class HubLimits:
    """How long an ``EpisodeHub`` waits and how much it holds."""

    #: how long a blocking ``get_action`` waits for the runner
    get_action_timeout_s: float = attrs.field(default=300.0, validator=_positive)
    #: an episode without calls for this long is closed as truncated; None: never
    episode_timeout_s: float | None = attrs.field(default=None, validator=_non_negative_or_none)
    #: ready lanes that make a full batch; None (or 0): every lane
    max_batch: int | None = attrs.field(default=None, validator=_count_or_none)
    #: how long a poll waits for a full batch once the first event came
    batch_wait_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: events waiting for the runner at most (``admit``); None: 16 per lane, at least 4096
    max_queued_steps: int | None = attrs.field(default=None, validator=_count_or_none)
    #: a step that does not fit waits for room (up to ``get_action_timeout_s``, then
    #: ``QueueFullError``), as a simulator thread can; False refuses it at once (a server's
    #: event loop must not block: its clients retry the 503)
    wait_for_room: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def resolved(self, lanes: int) -> HubLimits:
        """These limits with the defaults that depend on the number of lanes filled in."""
        return attrs.evolve(
            self,
            max_batch=self.max_batch or lanes,
            max_queued_steps=(
                max(4096, 16 * lanes) if self.max_queued_steps is None else self.max_queued_steps
            ),
        )
