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
and the work per request is tiny next to the runner's step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlconnect.envs.external import (
    BadObservationError,
    EpisodeError,
    ExternalEnv,
    ExternalEnvAdapter,
    TooManyEpisodesError,
    UnknownEpisodeError,
    _Reply,
)
from rlconnect.envs.external_multi_agent import ExternalMultiAgentEnv
from rlconnect.errors import EnvError
from rlconnect.policy import Policy
from rlconnect.serve.wire import WireError, decode, encode
from rlconnect.spaces import space_to_json

__all__ = ["PolicyServer", "ServingEnv", "ServingMultiAgentEnv"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 20


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


class _HTTPServer(ThreadingHTTPServer):
    """Counts clients that vanish mid-request (``disconnects``) instead of printing them."""

    daemon_threads = True
    disconnects = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        # reset, broken pipe, ..., or silent past the request timeout (TimeoutError)
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            self.disconnects += 1
            log.debug("PolicyServer: %s disconnected or went silent mid-request", client_address)
        else:
            super().handle_error(request, client_address)


class BadRequest(ValueError):
    """A request that is missing a field or has one of the wrong type."""


class NoEndpoint(Exception):
    """The request names no endpoint."""


_STATUS: list[tuple[type[BaseException], int]] = [
    (WireError, 400),
    (BadRequest, 400),
    (UnknownEpisodeError, 404),
    (TooManyEpisodesError, 429),
    (BadObservationError, 422),
    (EpisodeError, 409),
    (TimeoutError, 504),
    (EnvError, 503),
]


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
        get_action_timeout_s: how long a ``get_action`` waits for the runner.
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
            if not isinstance(runner.env, ExternalEnvAdapter):
                raise TypeError(
                    "PolicyServer needs a runner built on an ExternalEnv (e.g. "
                    f"rc.serve.ServingEnv), but this runner's env is {type(runner.env).__name__}"
                )
        else:
            raise TypeError(
                f"PolicyServer takes an rc.EnvRunner or an rc.Policy, got "
                f"{type(runner_or_policy).__name__}"
            )
        self.runner = runner
        self.env: ExternalEnv = runner.env.external
        self.env._hub.episode_timeout_s = episode_timeout_s
        self.env._hub.get_action_timeout_s = get_action_timeout_s
        self.requests = 0
        self.errors = 0
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._httpd = _HTTPServer((address, port), _make_handler(self, request_timeout_s))
        self.address, self.port = self._httpd.server_address[:2]
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

    def _in_runner(self, fn: Callable[[Any], Any], timeout_s: float = 2.0) -> Any:
        """Run ``fn(runner)`` between sampling steps (directly if the runner is idle)."""
        hub, reply = self.env._hub, _Reply()
        with hub.cond:
            hub.tasks.append((fn, reply))
            hub.cond.notify_all()
        if reply.event.wait(timeout_s):
            if reply.error is not None:
                raise reply.error
            return reply.value
        with hub.cond:
            if (fn, reply) not in hub.tasks:  # taken by a poll just now: wait for it
                return reply.wait(timeout_s * 10, "a runner task")
            hub.tasks.remove((fn, reply))
        return fn(self.runner)

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
        return {"files": self._in_runner(save)}

    def _weights(self, body: dict) -> dict:
        return self._in_runner(
            lambda r: {"weights": r.get_weights(), "connector_states": r.get_connector_states()}
        )


def _make_handler(
    server: PolicyServer, request_timeout_s: float | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "rlconnect-serve/1"
        timeout = request_timeout_s  # socket timeout: a silent client cannot hold a thread

        def setup(self) -> None:
            super().setup()
            # answers are written as headers + body: without this, Nagle and delayed ACKs
            # add ~40 ms to every keep-alive request
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with server._conns_lock:
                server._conns.add(self.connection)

        def finish(self) -> None:
            with server._conns_lock:
                server._conns.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, payload: Any) -> None:
            data = encode(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/x-msgpack")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            server.errors += 1
            self._send(status, {"error": kind, "message": message})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/health":
                self._send(200, server.health())
            else:
                self._error(404, "NotFound", f"no endpoint GET {self.path}; try GET /v1/health")

        def do_POST(self) -> None:
            server.requests += 1
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                return self._error(411, "LengthRequired", "send a Content-Length header")
            if length < 0:
                self.close_connection = True
                return self._error(400, "BadRequest", f"negative Content-Length {length}")
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._error(413, "TooLarge", f"bodies are limited to {MAX_BODY_BYTES} B")
            try:
                raw = self.rfile.read(length)
            except TimeoutError:  # silent past request_timeout_s: drop it, quietly
                self.server.disconnects += 1  # type: ignore[attr-defined]
                self.close_connection = True
                return None
            name = self.path.removeprefix("/v1/").strip("/")
            try:
                result = server.handle(name, decode(raw) if raw else {})
            except NoEndpoint as exc:
                return self._error(404, "NotFound", str(exc))
            except Exception as exc:
                for cls, status in _STATUS:
                    if isinstance(exc, cls):
                        return self._error(status, type(exc).__name__, str(exc))
                log.exception("PolicyServer: %s failed", name)
                return self._error(500, type(exc).__name__, f"{name} failed: {exc}")
            try:
                self._send(200, result)
            except TypeError as exc:  # an action the wire format cannot carry
                self._error(500, "EncodeError", str(exc))

    return Handler
