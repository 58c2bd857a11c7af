"""PolicyClient: drive episodes against a PolicyServer, remotely or with a local policy copy.

``inference_mode="remote"`` asks the server for every action. ``"local"`` fetches the
server runner's checkpoint (policy spec, weights, both connector pipelines with their
statistics), computes actions here through the same pipelines, refreshes weights and
connector statistics every ``update_interval`` seconds and ships the episodes back as
batches of ``log_action`` commands (``report``), which the server's runner records like any
episode (``actions`` = what the client's policy chose).

Connection failures (server down or restarting) are retried with exponential backoff for
up to ``retry_timeout_s``; an episode the restarted server does not know raises
``UnknownEpisodeError`` and the caller starts a new one.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import os
import socket
import tempfile
import threading
import time
import urllib.parse
import uuid
from typing import Any

from rlconnect.checkpoints.files import write_folder
from rlconnect.envs.external import (
    BadActionError,
    BadObservationError,
    BadRewardError,
    EpisodeError,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.serve.http import MAX_BODY_BYTES
from rlconnect.serve.wire import decode, encode

__all__ = [
    "AnswerTooLargeError",
    "BadRequestError",
    "InternalServerError",
    "NotFoundError",
    "PolicyClient",
    "RequestTooLargeError",
    "RunnerFailedError",
    "ServerBusyError",
    "ServerError",
    "ServerTimeoutError",
]


class ServerError(RuntimeError):
    """The server answered with an error status (``status``, ``kind``, message)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status, self.kind = status, kind


class BadRequestError(ServerError, ValueError):
    """HTTP 400, 411 or 415: the request was malformed (a bug in the caller)."""


class NotFoundError(ServerError, LookupError):
    """HTTP 404 for a path that names no endpoint."""


class RequestTooLargeError(ServerError, ValueError):
    """HTTP 413, or a body above the server's limit caught before it was sent."""


class ServerBusyError(ServerError, ConnectionError):
    """HTTP 503 for longer than ``retry_timeout_s``: the server kept asking to slow down."""


class RunnerFailedError(ServerError):
    """HTTP 503 ``RunnerFailed``: the server's runner (or served env) failed for good, so
    nothing it is asked will be served again; raised at once, never retried."""


class ServerTimeoutError(ServerError, TimeoutError):
    """HTTP 504: the runner gave no answer in time (is it sampling?), or the client's own
    deadline for the call (``max(timeout_s, retry_timeout_s)``, retries included) passed."""


class AnswerTooLargeError(ServerError, ValueError):
    """An answer larger than the client's ``max_answer_bytes``: it is not read."""


class InternalServerError(ServerError):
    """HTTP 500 (or any other status): the server failed on this request."""


_BY_STATUS: dict[int, type[ServerError]] = {
    400: BadRequestError,
    411: BadRequestError,
    415: BadRequestError,
    404: NotFoundError,
    413: RequestTooLargeError,
    503: ServerBusyError,
    504: ServerTimeoutError,
}
_KNOWN = {
    "UnknownEpisodeError": UnknownEpisodeError,
    "TooManyEpisodesError": TooManyEpisodesError,
    "BadObservationError": BadObservationError,
    "BadActionError": BadActionError,
    "BadRewardError": BadRewardError,
    "EpisodeError": EpisodeError,
}
_RETRY = (
    ConnectionError,
    http.client.RemoteDisconnected,
    http.client.CannotSendRequest,
    http.client.BadStatusLine,
    http.client.ImproperConnectionState,
)


def _error(status: int, payload: Any) -> Exception:
    """The typed exception of an error answer: an episode error by its kind, else by status."""
    kind = payload.get("error", "Error") if isinstance(payload, dict) else "Error"
    msg = payload.get("message", "") if isinstance(payload, dict) else str(payload)
    cls = _KNOWN.get(kind)
    if cls is not None:
        return cls(msg)
    if kind == "RunnerFailed":
        return RunnerFailedError(status, kind, msg)
    return _BY_STATUS.get(status, InternalServerError)(status, kind, msg)


class _Unavailable(Exception):
    """HTTP 503 (its body in ``args[0]``): retried like a connection failure."""


MAX_ANSWER_BYTES = 1 << 30
"""Largest answer body a ``PolicyClient`` reads by default (``max_answer_bytes``)."""
_MSGPACK = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")


def _not_msgpack(status: int, content_type: str, payload: bytes) -> ServerError:
    """The error of an answer that is not the server's msgpack (a proxy's HTML page)."""
    snippet = payload[:200].decode("utf-8", "replace")
    cls = _BY_STATUS.get(status, InternalServerError) if status >= 400 else InternalServerError
    return cls(
        status,
        "NotMsgpack",
        f"the answer is not a policy server's (Content-Type {content_type or 'none'!r}, "
        f"{len(payload)} B): {snippet!r}; is a proxy or another server at this address?",
    )


class _Http:
    """One keep-alive connection per thread; retries connection failures with backoff."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        retry_timeout_s: float,
        max_body_bytes: int,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s, self.retry_timeout_s = timeout_s, retry_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_answer_bytes = max_answer_bytes
        self.headers = {
            "Content-Type": "application/x-msgpack",
            "X-Rlconnect-Client": uuid.uuid4().hex,  # who we are, for client_key="token"
        }
        self._local = threading.local()
        self.retries = 0

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _post(self, name: str, data: bytes, deadline: float) -> tuple[int, bytes]:
        """One attempt, cut at ``deadline`` (its socket is shut down then, whatever the
        server sends or holds back): ``(status, msgpack body)``."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Late()
        conn = self._conn()
        conn.sock.settimeout(min(self.timeout_s, left))
        token = _WATCHDOG.cut_at(deadline, conn.sock)
        try:
            # refused before the body was read (413): its answer may still be there to read
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.request("POST", f"/v1/{name}", data, self.headers)
            resp = conn.getresponse()
            payload = self._read(resp, name)
        except (OSError, http.client.HTTPException):
            if time.monotonic() >= deadline:
                raise _Late() from None
            raise
        finally:
            in_time = token is None or _WATCHDOG.cancel(token)
        if not in_time:  # cut at the deadline: what was read is not a whole answer
            raise _Late()
        if resp.will_close:
            self._drop()
        content_type = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if payload and content_type not in _MSGPACK:
            self._drop()
            if resp.status == 503:  # e.g. a proxy while the server restarts: retried
                raise _Unavailable(payload)
            raise _not_msgpack(resp.status, content_type, payload)
        return resp.status, payload

    def _read(self, resp: http.client.HTTPResponse, name: str) -> bytes:
        """The answer's body, at most ``max_answer_bytes`` read (RequestTooLargeError past
        it: the connection is dropped, nothing more is read)."""
        limit = self.max_answer_bytes
        declared = resp.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            self._drop()
            raise AnswerTooLargeError(
                resp.status,
                "AnswerTooLarge",
                f"the {name} answer declares {int(declared)} B; this client reads at most "
                f"{limit} B (PolicyClient(max_answer_bytes=...))",
            )
        payload = resp.read(limit + 1)
        if len(payload) > limit:
            self._drop()
            raise AnswerTooLargeError(
                resp.status,
                "AnswerTooLarge",
                f"the {name} answer holds more than {limit} B (PolicyClient(max_answer_bytes=...))",
            )
        return payload

    def call(self, name: str, body: dict) -> Any:
        data = encode(body)
        if len(data) > self.max_body_bytes:
            raise RequestTooLargeError(
                413,
                "TooLarge",
                f"the {name} body has {len(data)} B; the server takes at most "
                f"{self.max_body_bytes} B (PolicyClient(max_body_bytes=...))",
            )
        start = time.monotonic()
        deadline = start + self.retry_timeout_s  # for retries
        last = start + max(self.timeout_s, self.retry_timeout_s)  # for the whole call
        delay = 0.05
        while True:
            try:
                status, payload = self._post(name, data, last)
                # busy, shutting down or not sampling: may answer later (not a failed runner)
                if status == 503 and _kind(payload) != "RunnerFailed":
                    raise _Unavailable(payload)
                break
            except _Late:
                self._drop()
                raise ServerTimeoutError(
                    504,
                    "ClientTimeout",
                    f"{name}: no whole answer within {last - start:g} s, retries included "
                    "(max(timeout_s, retry_timeout_s) of PolicyClient)",
                ) from None
            except (*_RETRY, _Unavailable) as exc:
                self._drop()
                if time.monotonic() + delay > min(deadline, last):
                    raise self._gave_up(exc) from exc
                self.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except BaseException:
                self._drop()
                raise
        out = decode(payload) if payload else {}
        if status >= 400:
            raise _error(status, out)
        return out

    def _gave_up(self, exc: BaseException) -> Exception:
        why = f"{self.retry_timeout_s:g} s"
        if isinstance(exc, _Unavailable):
            err = _error(503, _decoded(exc.args[0]))
            return ServerBusyError(
                503, getattr(err, "kind", "ServerBusy"), f"retried for {why}: {err}"
            )
        return ConnectionError(
            f"policy server {self.host}:{self.port} unavailable for {why} ({exc!r})"
        )

    def close(self) -> None:
        self._drop()


class _Late(Exception):
    """The call's deadline passed during an attempt."""


class _Watchdog:
    """One thread for every client of the process: shuts down a request's socket at its
    call's deadline, so a server that trickles or holds back its answer cannot hold the
    call longer (a socket timeout only bounds each read)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: dict[int, tuple[float, socket.socket]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def cut_at(self, deadline: float, sock: socket.socket | None) -> int | None:
        """Shut ``sock`` down at ``deadline`` unless cancelled; the token to cancel it."""
        if sock is None:
            return None
        token = next(self._ids)
        with self._lock:
            self._due[token] = (deadline, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="rc-client")
                self._thread.start()
            self._lock.notify()
        return token

    def cancel(self, token: int) -> bool:
        """Take back a cut not made yet (True); False when the socket was cut already."""
        with self._lock:
            return self._due.pop(token, None) is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                late = [t for t, (when, _) in self._due.items() if when <= now]
                socks = [self._due.pop(t)[1] for t in late]
                soonest = min((when for when, _ in self._due.values()), default=now + 1.0)
                if not socks:
                    self._lock.wait(max(0.001, soonest - now))
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()


def _kind(payload: bytes) -> Any:
    """The ``error`` an error answer names (None when it names none)."""
    answer = _decoded(payload)
    return answer.get("error") if isinstance(answer, dict) else None


def _decoded(payload: bytes) -> Any:
    try:
        return decode(payload)
    except Exception:
        return {"error": "ServerBusy", "message": repr(payload[:200])}


class PolicyClient:
    """Talk to a ``PolicyServer`` at ``url`` with the ExternalEnv episode API.

    Args:
        url: e.g. ``"http://127.0.0.1:9900"`` (``server.url``).
        inference_mode: ``"remote"`` (the server computes every action) or ``"local"``
            (single-agent servers; a policy copy computes actions here).
        update_interval: seconds between weight/statistics refreshes in local mode.
        report_size: local mode ships experience once this many commands are buffered (or
            ``update_interval`` passed since the last shipment, or on ``flush()``).
        timeout_s: socket timeout of one request (keep it above the server's
            ``get_action_timeout_s``).
        retry_timeout_s: how long connection failures and 503s (the server asking to
            slow down) are retried; the default outlasts the server's default
            ``request_timeout_s`` (60 s), the longest a request can hold the capacity
            another one was refused for. Every call ends within
            ``max(timeout_s, retry_timeout_s)`` of its start, retries included, whatever
            the server sends or holds back (``ServerTimeoutError`` then).
        max_body_bytes: bodies above this raise ``RequestTooLargeError`` before they are
            sent (the server's ``max_body_bytes``, see ``health()``).
        max_answer_bytes: answers above this (1 GiB by default; a local-inference
            client's checkpoint is the largest) raise ``AnswerTooLargeError`` unread.

    Error answers raise the episode errors of ``rlconnect.envs`` by kind (404 unknown
    episode, 409, 422, 429) and otherwise a ``ServerError`` subclass by status:
    ``BadRequestError`` (400, 411, 415), ``NotFoundError`` (404), ``RequestTooLargeError``
    (413), ``ServerBusyError`` (503 past ``retry_timeout_s``), ``ServerTimeoutError`` (504),
    ``InternalServerError`` (500 and the rest).
    """

    def __init__(
        self,
        url: str,
        inference_mode: str = "remote",
        update_interval: float = 10.0,
        *,
        report_size: int = 256,
        timeout_s: float = 120.0,
        retry_timeout_s: float = 90.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        if inference_mode not in ("remote", "local"):
            raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")
        self.url = url
        self.inference_mode = inference_mode
        self.update_interval = float(update_interval)
        self.report_size = int(report_size)
        self._http = _Http(url, timeout_s, retry_timeout_s, max_body_bytes, max_answer_bytes)
        self._lock = threading.RLock()
        self._local: Any = None
        self._buffer: list[list[Any]] = []
        self._last_report = self._last_update = time.monotonic()
        self._keys: dict[Any, tuple[int, bool]] = {}
        self._next_key = itertools.count()

    @property
    def retries(self) -> int:
        """Connection attempts that were retried so far."""
        return self._http.retries

    # -- episode API ----------------------------------------------------------------------
    def start_episode(self, episode_id: Any = None, training_enabled: bool = True) -> Any:
        """Start an episode; returns its id."""
        if self.inference_mode == "remote":
            out = self._http.call(
                "start_episode", {"episode_id": episode_id, "training_enabled": training_enabled}
            )
            return out["episode_id"]
        with self._lock:
            self._ensure_local()
            eid = uuid.uuid4().hex if episode_id is None else episode_id
            if eid in self._keys:
                raise EpisodeError(f"episode id {eid!r} is already in use")
            self._keys[eid] = (-2 - next(self._next_key), bool(training_enabled))
            self._ship("start_episode", {"episode_id": eid, "training_enabled": True}, eid)
            return eid

    def get_action(self, episode_id: Any, observation: Any, reward: Any = None) -> Any:
        """The policy's action for ``observation`` (records the step). ``reward``, when
        given, is added to the previous step first, as ``log_returns`` would (one request
        instead of two)."""
        if self.inference_mode == "remote":
            body = {"episode_id": episode_id, "obs": observation}
            if reward is not None:
                body["reward"] = reward
            return self._http.call("get_action", body)["action"]
        if reward is not None:
            self.log_returns(episode_id, reward)
        with self._lock:
            key, _ = self._key(episode_id)
            self._maybe_update()
            action = self._local.compute_single_action(observation, explore=True, env_id=key)
            self._ship(
                "log_action",
                {"episode_id": episode_id, "obs": observation, "action": action},
                episode_id,
            )
            return action

    def get_actions(
        self, episode_ids: list[Any], observations: Any, rewards: Any = None
    ) -> list[Any]:
        """Actions for many episodes in one request (remote inference): ``observations``
        is a list (or an array whose first axis is the episode), ``rewards`` (optional)
        the previous step's reward of each. All are checked before any is recorded."""
        if self.inference_mode != "remote":
            rewards = [None] * len(episode_ids) if rewards is None else rewards
            return [self.get_action(e, o, r) for e, o, r in zip(episode_ids, observations, rewards)]
        body: dict[str, Any] = {"episode_ids": list(episode_ids), "obs": observations}
        if rewards is not None:
            body["rewards"] = rewards
        return list(self._http.call("get_actions", body)["actions"])

    def log_action(self, episode_id: Any, observation: Any, action: Any) -> None:
        """Record an action taken by someone else (off-policy)."""
        body = {"episode_id": episode_id, "obs": observation, "action": action}
        if self.inference_mode == "remote":
            self._http.call("log_action", body)
            return
        with self._lock:
            self._key(episode_id)
            self._ship("log_action", body, episode_id)

    def log_returns(self, episode_id: Any, reward: Any, info: dict | None = None) -> None:
        """Add ``reward`` to the current step."""
        body = {"episode_id": episode_id, "reward": reward, "info": info}
        if self.inference_mode == "remote":
            self._http.call("log_returns", body)
            return
        with self._lock:
            self._key(episode_id)
            self._ship("log_returns", body, episode_id)

    def end_episode(self, episode_id: Any, observation: Any) -> None:
        """End the episode with its last observation."""
        body = {"episode_id": episode_id, "obs": observation}
        if self.inference_mode == "remote":
            self._http.call("end_episode", body)
            return
        with self._lock:
            key, _ = self._key(episode_id)
            self._ship("end_episode", body, episode_id)
            del self._keys[episode_id]
            for pid in self._local.policies:
                self._local.agent_pipeline(pid).reset(key)
                self._local.action_pipeline(pid).reset(key)

    def health(self) -> dict[str, Any]:
        """The server's ``/v1/health`` answer."""
        return self._http.call("health", {})

    def flush(self) -> None:
        """Ship buffered experience now (local mode)."""
        with self._lock:
            if self._buffer:
                commands, self._buffer = self._buffer, []
                self._http.call("report", {"commands": commands})
            self._last_report = time.monotonic()

    def close(self) -> None:
        """Ship what is buffered and close the connection."""
        try:
            if self.inference_mode == "local":
                self.flush()
        finally:
            self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- local inference ------------------------------------------------------------------
    def _key(self, eid: Any) -> tuple[int, bool]:
        try:
            return self._keys[eid]
        except KeyError:
            raise UnknownEpisodeError(f"episode {eid!r} is not running on this client") from None

    def _ship(self, name: str, body: dict, eid: Any) -> None:
        if not self._keys[eid][1]:
            return  # not recorded: nothing to send
        self._buffer.append([name, body])
        if (
            len(self._buffer) >= self.report_size
            or time.monotonic() - self._last_report >= self.update_interval
        ):
            self.flush()

    def _ensure_local(self) -> None:
        if self._local is not None:
            return
        from rlconnect.envs.external import ExternalEnv
        from rlconnect.runner import EnvRunner
        from rlconnect.spaces import space_from_json

        info = self.health()
        if info.get("multi_agent"):
            raise ValueError("inference_mode='local' supports single-agent servers only")
        env = ExternalEnv(
            space_from_json(info["action_space"]), space_from_json(info["observation_space"])
        )
        files = self._http.call("checkpoint", {})["files"]
        if not isinstance(files, dict):
            raise ValueError(
                f"the server sent a checkpoint that is not a map of files: {files!r:.80}"
            )
        with tempfile.TemporaryDirectory() as tmp:
            root = os.path.join(tmp, "ckpt")
            write_folder(files, root)  # refuses a path outside the folder
            self._local = EnvRunner.from_checkpoint(root, env=env)
        self._last_update = time.monotonic()

    def _maybe_update(self) -> None:
        if time.monotonic() - self._last_update < self.update_interval:
            return
        out = self._http.call("weights", {})
        self._local.set_weights(out["weights"])
        self._local.set_connector_states(out["connector_states"])
        self._last_update = time.monotonic()
