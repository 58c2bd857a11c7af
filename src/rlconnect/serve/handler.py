"""What a request turns into: its fields, its answer channel (``Call``), its error status.

An endpoint answers now (it returns the answer) or later (it returns ``PENDING`` and calls
``call.finish`` on the server's event loop when the runner's action comes). Its errors map
to HTTP statuses by ``STATUS`` (first match; anything else is a 500).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlconnect.envs.external import (
    BadActionError,
    BadObservationError,
    BadRewardError,
    EpisodeError,
    QueueFullError,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.errors import EnvError
from rlconnect.serve.http import CONTENT_TYPES, MAX_BODY_BYTES
from rlconnect.serve.tasks import RunnerUnavailable
from rlconnect.serve.wire import WireError

__all__ = [
    "CONTENT_TYPES",
    "MAX_BODY_BYTES",
    "PENDING",
    "STATUS",
    "BadRequest",
    "Call",
    "NoEndpoint",
    "RunnerFailed",
    "TooLarge",
    "field",
    "kind_of",
    "plain",
    "status_of",
]

PENDING = object()
"""What an endpoint returns when its answer comes later, through ``Call.finish``."""


class BadRequest(ValueError):
    """A request that is missing a field or has one of the wrong type."""


class TooLarge(ValueError):
    """A request that can never be served as sent, however long the client waits (413)."""


class RunnerFailed(RuntimeError):
    """The server's runner (or its served env) failed: no request that needs it will ever
    be served again (HTTP 503 that the client does not retry)."""


class NoEndpoint(Exception):
    """The request names no endpoint."""


#: errors of ``PolicyServer.handle`` -> HTTP status (first match); anything else is a 500
STATUS: list[tuple[type[BaseException], int]] = [
    (WireError, 400),
    (BadRequest, 400),
    (TooLarge, 413),
    (NoEndpoint, 404),
    (UnknownEpisodeError, 404),
    (TooManyEpisodesError, 429),
    (BadObservationError, 422),
    (BadActionError, 422),
    (BadRewardError, 422),
    (EpisodeError, 409),
    (TimeoutError, 504),
    (QueueFullError, 503),
    (RunnerUnavailable, 503),
    (RunnerFailed, 503),
    (EnvError, 503),
]


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an endpoint's error, None for an unexpected one (a 500)."""
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return None


def kind_of(exc: BaseException) -> str:
    """The ``error`` an answer names: the exception's class (``NotFound`` for a missing
    endpoint)."""
    return "NotFound" if isinstance(exc, NoEndpoint) else type(exc).__name__


class Call:
    """One request being answered: the episodes its client runs (its share of the
    lanes) and ``finish(answer, error)``, called once, on the event loop thread. An
    endpoint that answers ``PENDING`` sets ``wait_s`` when the server must give up
    waiting itself (504); runner work has timeouts of its own."""

    __slots__ = ("episodes", "finish", "wait_s")

    def __init__(
        self, episodes: set[Any], finish: Callable[[Any, BaseException | None], None]
    ) -> None:
        self.episodes = episodes
        self.finish = finish
        self.wait_s: float | None = None


def plain(action: Any) -> Any:
    """A numpy scalar action (a Discrete action's ``np.int64``) as a Python number, so a
    plain msgpack client reads an int, not an extension type; arrays stay arrays."""
    return action.item() if isinstance(action, np.generic) else action


def field(body: dict, name: str, kinds: tuple[type, ...] | None = None, default: Any = ...) -> Any:
    """``body[name]``, checked against ``kinds``; BadRequest when missing (without a
    default) or of another type."""
    if name not in body:
        if default is ...:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = body[name]
    if kinds is not None and not isinstance(value, kinds):
        raise BadRequest(f"field {name!r} must be {' or '.join(k.__name__ for k in kinds)}")
    return value
