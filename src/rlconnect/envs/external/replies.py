"""How the runner's answer to one call comes back: a ``Reply``.

A simulator thread blocks on a reply's event; a server's event loop gives each reply a
``notify`` callback instead, and the episode hub's delivery (``notify_each`` by default)
calls them, so a server can have one sampling step's answers handed to its loop at once.
Work done on the sampling thread between two steps (a ``Task``) carries its reply too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rlconnect.envs.base import ServedInference

__all__ = ["Reply", "Task", "notify_each"]


class Reply:
    """Where the runner's answer to one call is delivered: ``value`` or ``error``.

    A thread blocks on ``event``; a server passes ``notify`` instead (called with the reply
    once it is done, through the hub's delivery) and no event is made.
    """

    __slots__ = ("done", "error", "event", "notify", "value")

    def __init__(self, notify: Callable[[Reply], None] | None = None) -> None:
        self.notify = notify
        self.event = threading.Event() if notify is None else None
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float, what: str) -> Any:
        """Block until the answer is set and return it; ``TimeoutError`` naming ``what`` after
        ``timeout`` seconds."""
        assert self.event is not None, "a reply with a notify callback is not waited on"
        if not self.event.wait(timeout):
            raise TimeoutError(f"{what}: no action within {timeout:g} s (is the runner sampling?)")
        if self.error is not None:
            raise self.error
        return self.value


def notify_each(replies: list[Reply]) -> None:
    """The default delivery: call each reply's ``notify`` on the completing thread."""
    for reply in replies:
        assert reply.notify is not None
        reply.notify(reply)


Task = tuple[Callable[[ServedInference], Any], Reply]
"""Work for the sampling thread: ``fn(inference)``, given the runner's ``ServedInference``
(what a served episode needs of the runner), run between two steps; its result in the
reply."""
