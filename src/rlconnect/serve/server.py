"""PolicyServer: an ExternalEnv fed over HTTP, so served episodes become training batches.

Every endpoint is ``POST /v1/<name>`` with a msgpack body (``rlconnect.serve.wire``) and a
msgpack answer; errors are HTTP 4xx/5xx with ``{"error": kind, "message": text}``:

=================  ==========================================  ======================
endpoint           body                                        answer
=================  ==========================================  ======================
start_episode      episode_id (optional), training_enabled     episode_id
get_action         episode_id, obs                             action
log_action         episode_id, obs, action                     {}
log_returns        episode_id, reward, info (optional)         {}
end_episode        episode_id, obs                             {}
report             commands: [[name, {args}], ...]             applied (count)
checkpoint         {}                                          files: {path: bytes}
weights            {}                                          weights, connector_states
=================  ==========================================  ======================

``GET /v1/health`` answers ``{"ok": true, ...}``. The server is the stdlib
``ThreadingHTTPServer`` (one thread per connection, HTTP/1.1 keep-alive): no dependency,
and the work per request is tiny next to the runner's step. ``serve.handler`` holds the
HTTP side (size and Content-Type checks, statuses), ``serve.tasks`` the runner work a
request needs (``checkpoint``, ``weights``: done by the sampling thread between two steps),
``serve.envs`` the ServingEnvs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlconnect.envs.external import ExternalEnv, ExternalEnvAdapter
from rlconnect.envs.external_multi_agent import ExternalMultiAgentEnv
from rlconnect.policy import Policy
from rlconnect.serve.envs import ServingEnv, ServingMultiAgentEnv, _Idle
from rlconnect.serve.handler import BadRequest, HTTPServer, NoEndpoint, make_handler
from rlconnect.serve.tasks import run_in_sampler
from rlconnect.spaces import space_to_json

__all__ = ["PolicyServer", "ServingEnv", "ServingMultiAgentEnv"]


def _field(body: dict, name: str, kinds: tuple[type, ...] | None = None, default: Any = ...) -> Any:
    if name not in body:
        if default is ...:
            raise BadRequest(f"missing field {name!r}")
        return default
    value = body[name]
    if kinds is not None and not isinstance(value, kinds):
        raise BadRequest(f"field {name!r} must be {' or '.join(k.__name__ for k in kinds)}")
    return value


_EID = (str, int)


class PolicyServer:
    """Serve a runner's policies over HTTP; the episodes it serves fill the runner's batches.

    Args:
        runner_or_policy: an ``rc.EnvRunner`` built on an ExternalEnv (e.g. a
            ``ServingEnv``), or an ``rc.Policy``: the server then builds a ``ServingEnv``
            (spaces from ``observation_space`` / ``action_space``, default the policy's) and
            ``rc.EnvRunner(env, policy, config=config)``. Sample from ``server.runner``.
        address, port: where to listen (port 0 picks a free one; see ``server.port``).
        max_concurrent: episodes at once (when the server builds the env).
        episode_timeout_s: an episode without requests for this long is closed as
            truncated and listed in ``server.env.timed_out_episodes``.
        get_action_timeout_s: how long a ``get_action`` waits for the runner, and how
            long a ``checkpoint`` or ``weights`` request waits for a sampling step to take
            it (they run on the sampling thread between two steps, never beside one;
            HTTP 503 when no step comes).
        request_timeout_s: a connection silent for this long (mid-request, or idle
            between requests) is closed, so stalled clients cannot hold server threads;
            ``PolicyClient`` reconnects by itself. None waits forever.
    """

    def __init__(
        self,
        runner_or_policy: Any,
        address: str = "127.0.0.1",
        port: int = 9900,
        *,
        config: Any = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        max_concurrent: int = 100,
        episode_timeout_s: float | None = 60.0,
        get_action_timeout_s: float = 60.0,
        request_timeout_s: float | None = 120.0,
    ) -> None:
        from rlconnect.runner import EnvRunner

        if request_timeout_s is not None and not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {request_timeout_s!r}")

        if isinstance(runner_or_policy, Policy):
            env = ServingEnv(
                action_space or runner_or_policy.action_space,
                observation_space or runner_or_policy.observation_space,
                max_concurrent,
            )
            runner = EnvRunner(env, runner_or_policy, config=config)
        elif isinstance(runner_or_policy, EnvRunner):
            runner = runner_or_policy
        else:
            raise TypeError(
                f"PolicyServer takes an rc.EnvRunner or an rc.Policy, got "
                f"{type(runner_or_policy).__name__}"
            )
        if not isinstance(runner.env, ExternalEnvAdapter):
            raise TypeError(
                "PolicyServer needs a runner built on an ExternalEnv (e.g. "
                f"rc.serve.ServingEnv), but this runner's env is {type(runner.env).__name__}"
            )
        self.runner = runner
        self.env: ExternalEnv = runner.env.external
        self.env._hub.episode_timeout_s = episode_timeout_s
        self.env._hub.get_action_timeout_s = get_action_timeout_s
        self.requests = 0
        self.errors = 0
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._httpd = HTTPServer((address, port), make_handler(self, request_timeout_s))
        host, self.port = self._httpd.server_address[:2]
        self.address = host if isinstance(host, str) else host.decode()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name=f"PolicyServer-{self.port}",
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def stop(self) -> None:
        """Stop listening, fail waiting calls and close the env (the runner stays usable)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self.env._hub.close()
        with self._conns_lock:  # keep-alive connections would outlive the listener
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._conns.clear()
        if isinstance(self.env, _Idle):
            self.env.stop()

    close = stop

    def track(self, conn: socket.socket) -> None:
        """A connection opened (``stop`` shuts down the ones still open)."""
        with self._conns_lock:
            self._conns.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(conn)

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- requests ---------------------------------------------------------------------------
    def handle(self, name: str, body: Any) -> Any:
        """Answer one request (raises the errors mapped to HTTP statuses)."""
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a map")
        op = self._ops().get(name)
        if op is None:
            raise NoEndpoint(f"no endpoint POST /v1/{name}; known: {sorted(self._ops())}")
        return op(body)

    def _ops(self) -> dict[str, Callable[[dict], Any]]:
        return {
            "start_episode": self._start,
            "get_action": self._get_action,
            "log_action": self._log_action,
            "log_returns": self._log_returns,
            "end_episode": self._end,
            "report": self._report,
            "checkpoint": self._checkpoint,
            "weights": self._weights,
            "health": lambda body: self.health(),
        }

    def health(self) -> dict[str, Any]:
        return {
            "ok": True,
            "running_episodes": self.env.num_running_episodes,
            "max_concurrent": self.env.max_concurrent,
            "multi_agent": isinstance(self.env, ExternalMultiAgentEnv),
            "observation_space": space_to_json(self.env.observation_space)
            if isinstance(self.env.observation_space, gym.Space)
            else None,
            "action_space": space_to_json(self.env.action_space)
            if isinstance(self.env.action_space, gym.Space)
            else None,
        }

    def _start(self, body: dict) -> dict:
        eid = _field(body, "episode_id", (*_EID, type(None)), None)
        training = _field(body, "training_enabled", (bool,), True)
        return {"episode_id": self.env.start_episode(eid, training)}

    def _get_action(self, body: dict) -> dict:
        eid = _field(body, "episode_id", _EID)
        return {"action": self.env.get_action(eid, _field(body, "obs"))}

    def _log_action(self, body: dict) -> dict:
        eid = _field(body, "episode_id", _EID)
        self.env.log_action(eid, _field(body, "obs"), _field(body, "action"))
        return {}

    def _log_returns(self, body: dict) -> dict:
        eid = _field(body, "episode_id", _EID)
        reward = _field(body, "reward")
        info = _field(body, "info", (dict, type(None)), None)
        multi = isinstance(self.env, ExternalMultiAgentEnv)
        if not multi and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise BadRequest("field 'reward' must be a number")
        self.env.log_returns(eid, reward, info)
        return {}

    def _end(self, body: dict) -> dict:
        self.env.end_episode(_field(body, "episode_id", _EID), _field(body, "obs"))
        return {}

    def _report(self, body: dict) -> dict:
        """Experience a local-inference client collected: commands applied in order."""
        commands = _field(body, "commands", (list,))
        ops = {
            "start_episode": self._start,
            "log_action": self._log_action,
            "log_returns": self._log_returns,
            "end_episode": self._end,
        }
        for i, cmd in enumerate(commands):
            if not (isinstance(cmd, list) and len(cmd) == 2 and cmd[0] in ops):
                raise BadRequest(f"command {i} must be [name, args] with name in {sorted(ops)}")
            if not isinstance(cmd[1], dict):
                raise BadRequest(f"command {i}: args must be a map")
            ops[cmd[0]](cmd[1])
        return {"applied": len(commands)}

    def _in_runner(self, fn: Callable[[Any], Any], what: str) -> Any:
        """``fn(runner)`` on the sampling thread, between two steps (see ``serve.tasks``)."""
        hub = self.env._hub
        return run_in_sampler(hub, fn, what, hub.get_action_timeout_s)

    def _checkpoint(self, body: dict) -> dict:
        def save(runner: Any) -> dict[str, bytes]:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "ckpt"
                runner.save_checkpoint(path)
                return {
                    str(p.relative_to(path)).replace(os.sep, "/"): p.read_bytes()
                    for p in sorted(path.rglob("*"))
                    if p.is_file()
                }

        if isinstance(self.env, ExternalMultiAgentEnv):
            raise BadRequest("local inference is not supported for multi-agent serving yet")
        return {"files": self._in_runner(save, "checkpoint")}

    def _weights(self, body: dict) -> dict:
        return self._in_runner(
            lambda r: {"weights": r.get_weights(), "connector_states": r.get_connector_states()},
            "weights",
        )
