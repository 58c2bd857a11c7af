"""The limits of a ``PolicyServer``, as one frozen object: ``ServerSettings``.

Each limit is spelled once, as a field here; ``PolicyServer`` takes them as keyword
arguments (or a whole ``settings=``), and hands each layer its share: the episode hub gets
``hub_limits()`` (the fields named as ``HubLimits``' fields), the HTTP layer
``http_limits()``, the endpoints the per-connection share of lanes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from rlconnect.envs.external import HubLimits
from rlconnect.serve.http import MAX_BODY_BYTES, Limits

__all__ = ["ServerSettings"]


def _count(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attr.name} must be a positive int, got {value!r}")


def _count_or_none(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _count(inst, attr, value)


def _timeout_or_none(inst: Any, attr: attrs.Attribute, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
    ):
        raise ValueError(f"{attr.name} must be > 0 or None, got {value!r}")


@attrs.frozen(kw_only=True)
class ServerSettings:
    """How much a ``PolicyServer`` takes and how long it waits (see docs/serving.md).

    The hub's share (``batch_wait_s``, ``max_batch``, ``max_queued_steps``, the two
    timeouts) is checked by ``HubLimits`` when the settings are made."""

    #: episodes at once (when the server builds the env; a given runner's env keeps its own
    #: number of lanes)
    max_concurrent: int = attrs.field(default=100, validator=_count)
    #: episodes one client may run at once (None: a quarter of the lanes, at least 1), so
    #: no client takes every lane, however many connections it opens; more answer 429
    #: ``TooManyEpisodesError``
    max_episodes_per_client: int | None = attrs.field(default=None, validator=_count_or_none)
    #: who a client is: ``"peer"``, its IP address (a client cannot multiply its share
    #: by opening connections), or ``"token"``, the ``X-Rlconnect-Client`` header that
    #: each ``PolicyClient`` sends (its peer address without one), for trusted simulators
    #: that share an address (a hostile client can make up tokens)
    client_key: str = attrs.field(default="peer", validator=attrs.validators.in_(("peer", "token")))
    #: the batching window: a sampling step waits for observations until ``max_batch``
    #: episodes (None: all lanes) have one, or every running episode has one, or
    #: ``batch_wait_s`` passed since the first came; all of them then go through one
    #: forward pass
    max_batch: int | None = None
    batch_wait_s: float = 0.002
    #: steps waiting for the runner at most (None: 16 per lane, at least 4096); a
    #: ``report`` that does not fit is answered 503 and retried
    max_queued_steps: int | None = None
    #: an episode without requests for this long is closed as truncated and listed in
    #: ``server.env.timed_out_episodes``; None: never
    episode_timeout_s: float | None = 60.0
    #: how long a ``get_action`` waits for the runner (then 504), and how long a
    #: ``checkpoint`` or ``weights`` request waits for a sampling step to take it (they
    #: run on the sampling thread between two steps; 503 when none comes)
    get_action_timeout_s: float = 60.0
    #: a request must arrive whole within this long of its first byte, and a connection
    #: idle this long is closed, so stalled or trickling clients hold nothing
    #: (``PolicyClient`` reconnects by itself); None: no limit. ``PolicyClient``'s default
    #: ``retry_timeout_s`` outlasts it, so a client retries a refusal for capacity longer
    #: than any request can hold that capacity
    request_timeout_s: float | None = attrs.field(default=60.0, validator=_timeout_or_none)
    #: a request whose bytes stop coming for this long is cut (a client that declares a
    #: body and sends nothing more); None: no limit
    stall_timeout_s: float | None = attrs.field(default=10.0, validator=_timeout_or_none)
    #: largest request body (413 above it); the bodies received and not yet answered may
    #: hold twice that in all, counted in bytes that arrived (503 above it, retried)
    max_body_bytes: int = attrs.field(default=MAX_BODY_BYTES, validator=_count)
    #: body bytes the requests of one peer (IP address) may hold at once (None:
    #: ``max_body_bytes``, half of the budget of all bodies), so one peer's trickling or
    #: stalled bodies leave the rest to the others; beyond it 503, retried
    max_body_bytes_per_peer: int | None = attrs.field(default=None, validator=_count_or_none)
    #: connections one peer (IP address) may hold open; more are answered 503 and closed
    #: as they open, so one peer cannot take every file descriptor
    max_connections_per_peer: int = attrs.field(default=64, validator=_count)
    #: bytes of answers a connection may leave unread beside the one being sent (a client
    #: that pipelines requests and never reads): past it the connection is cut
    max_unread_answer_bytes: int = attrs.field(default=4 << 20, validator=_count)
    #: connections the kernel queues before they are accepted
    backlog: int = attrs.field(default=1024, validator=_count)

    def __attrs_post_init__(self) -> None:
        self.hub_limits()  # the hub's validators check its share now, not at serving time
        share = self.max_body_bytes_per_peer
        if share is not None and share < self.max_body_bytes:
            raise ValueError(
                f"max_body_bytes_per_peer={share} is below max_body_bytes="
                f"{self.max_body_bytes}: a body that large could never fit; raise it or "
                "lower max_body_bytes"
            )

    @classmethod
    def of(cls, settings: ServerSettings | None, overrides: Mapping[str, Any]) -> ServerSettings:
        """``settings`` (default: the defaults) with ``overrides`` (keyword arguments of
        ``PolicyServer``) put in; TypeError naming the known settings for any other."""
        known = attrs.fields_dict(cls)
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise TypeError(
                f"PolicyServer got unknown keyword arguments {unknown}; its settings are "
                f"{sorted(known)} (see rlconnect.serve.ServerSettings)"
            )
        return attrs.evolve(settings or cls(), **overrides)

    def hub_limits(self) -> HubLimits:
        """The episode hub's share: the settings named as ``HubLimits``' fields (steps
        that do not fit the queue are refused, never waited for)."""
        shared = set(attrs.fields_dict(HubLimits)) & set(attrs.fields_dict(ServerSettings))
        # the event loop queues steps: one that does not fit is refused (503), never waited for
        return HubLimits(wait_for_room=False, **{name: getattr(self, name) for name in shared})

    def http_limits(self) -> Limits:
        """The HTTP layer's share: body sizes, the request deadlines, what one peer and
        one connection may hold."""
        return Limits(
            self.max_body_bytes,
            2 * self.max_body_bytes,
            self.request_timeout_s,
            self.stall_timeout_s,
            self.max_body_bytes_per_peer or self.max_body_bytes,
            self.max_connections_per_peer,
            self.max_unread_answer_bytes,
        )

    def share(self, lanes: int) -> int:
        """Episodes one client may run at once, on a served env of ``lanes`` lanes."""
        return self.max_episodes_per_client or max(1, lanes // 4)
