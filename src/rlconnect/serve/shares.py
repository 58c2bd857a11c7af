"""The lane share of each client: how many episodes one client may run at once.

A client is named by the server (its peer address, or its ``PolicyClient`` token); its
requests share one set of the episodes it runs, whatever connection they come on, so a
client cannot multiply its share by opening connections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlconnect.envs.external import TooManyEpisodesError

__all__ = ["Shares"]


class Shares:
    """Episodes by client, at most ``share`` each. ``forget_ended(ids)`` removes from a
    set the episodes that no longer run (they ended or timed out)."""

    def __init__(self, share: int, lanes: int, forget_ended: Callable[[set], None]) -> None:
        self.share = share
        self.lanes = lanes
        self.forget_ended = forget_ended
        self.clients: dict[str, set[Any]] = {}

    def of(self, client: str) -> set[Any]:
        """The episodes ``client`` runs (a set its requests share). Clients that run none
        are forgotten once there are more than twice as many clients as lanes, so the
        table stays bounded whoever connects."""
        if client not in self.clients and len(self.clients) > 2 * self.lanes:
            for key, running in list(self.clients.items()):
                self.forget_ended(running)
                if not running:
                    del self.clients[key]
        return self.clients.setdefault(client, set())

    def check(self, episodes: set[Any], more: int) -> None:
        """TooManyEpisodesError when a client running ``episodes`` would run more than its
        share with ``more`` new ones."""
        if len(episodes) + more <= self.share:
            return
        self.forget_ended(episodes)  # those that ended (or timed out) since
        if len(episodes) + more > self.share:
            raise TooManyEpisodesError(
                f"this client already runs {len(episodes)} episodes, its share "
                f"(max_episodes_per_client={self.share}); end some first, or ask the "
                "server's owner for a larger share"
            )
