"""The ExternalEnvs a PolicyServer feeds: no ``run()`` to write, they idle until closed."""

from __future__ import annotations

import threading
from typing import Any

from rlconnect.envs.external import ExternalEnv, ExternalMultiAgentEnv

__all__ = ["ServingEnv", "ServingMultiAgentEnv"]


class _Idle:
    """``run()`` of an env fed by a server: wait until closed."""

    # not ``_stop``: that name is threading.Thread's own method (is_alive() calls it)
    _closed: threading.Event

    def run(self) -> None:
        self._closed.wait()

    def stop(self) -> None:
        self._closed.set()


class ServingEnv(_Idle, ExternalEnv):
    """An ExternalEnv whose episodes come from a PolicyServer (no ``run()`` to write)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._closed = threading.Event()
        super().__init__(*args, **kwargs)


class ServingMultiAgentEnv(_Idle, ExternalMultiAgentEnv):
    """The multi-agent ServingEnv: observations, actions and rewards by agent id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._closed = threading.Event()
        super().__init__(*args, **kwargs)
