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

import http.client
import itertools
import socket
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from rlconnect.envs.external import (
    BadObservationError,
    EpisodeError,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.serve.wire import decode, encode

__all__ = ["PolicyClient", "ServerError"]


class ServerError(RuntimeError):
    """The server answered with an error status (``status``, ``kind``, message)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"HTTP {status} {kind}: {message}")
        self.status, self.kind = status, kind


_KNOWN = {
    "UnknownEpisodeError": UnknownEpisodeError,
    "TooManyEpisodesError": TooManyEpisodesError,
    "BadObservationError": BadObservationError,
    "EpisodeError": EpisodeError,
}
_RETRY = (
    ConnectionError,
    http.client.RemoteDisconnected,
    http.client.CannotSendRequest,
    http.client.BadStatusLine,
)


class _Unavailable(Exception):
    """HTTP 503: retried like a connection failure."""


def _message(payload: bytes) -> str:
    """The ``kind: message`` of an error answer (its raw start if it is not one)."""
    try:
        out = decode(payload)
        return f"{out['error']}: {out['message']}"
    except Exception:
        return repr(payload[:200])


class _Http:
    """One keep-alive connection per thread; retries connection failures with backoff."""

    def __init__(self, url: str, timeout_s: float, retry_timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout_s, self.retry_timeout_s = timeout_s, retry_timeout_s
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

    def call(self, name: str, body: dict) -> Any:
        data = encode(body)
        deadline = time.monotonic() + self.retry_timeout_s
        delay = 0.05
        while True:
            try:
                conn = self._conn()
                conn.request("POST", f"/v1/{name}", data, {"Content-Type": "application/x-msgpack"})
                resp = conn.getresponse()
                payload = resp.read()
                status = resp.status
                if status == 503:  # shutting down, or not sampling: may answer later
                    raise _Unavailable(_message(payload))
                break
            except (*_RETRY, _Unavailable) as exc:
                self._drop()
                if time.monotonic() + delay > deadline:
                    why = f"HTTP 503: {exc}" if isinstance(exc, _Unavailable) else repr(exc)
                    raise ConnectionError(
                        f"policy server {self.host}:{self.port} unavailable for "
                        f"{self.retry_timeout_s:g} s ({why})"
                    ) from exc
                self.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except BaseException:
                self._drop()
                raise
        out = decode(payload) if payload else {}
        if status >= 400:
            kind = out.get("error", "Error") if isinstance(out, dict) else "Error"
            msg = out.get("message", "") if isinstance(out, dict) else str(out)
            cls = _KNOWN.get(kind)
            raise cls(msg) if cls is not None else ServerError(status, kind, msg)
        return out

    def close(self) -> None:
        self._drop()


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
        retry_timeout_s: how long connection failures are retried.
    """

    def __init__(
        self,
        url: str,
        inference_mode: str = "remote",
        update_interval: float = 10.0,
        *,
        report_size: int = 256,
        timeout_s: float = 120.0,
        retry_timeout_s: float = 60.0,
    ) -> None:
        if inference_mode not in ("remote", "local"):
            raise ValueError(f"inference_mode must be 'remote' or 'local', got {inference_mode!r}")
        self.url = url
        self.inference_mode = inference_mode
        self.update_interval = float(update_interval)
        self.report_size = int(report_size)
        self._http = _Http(url, timeout_s, retry_timeout_s)
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

    def get_action(self, episode_id: Any, observation: Any) -> Any:
        """The policy's action for ``observation`` (records the step)."""
        if self.inference_mode == "remote":
            return self._http.call("get_action", {"episode_id": episode_id, "obs": observation})[
                "action"
            ]
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
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "ckpt"
            for rel, data in files.items():
                target = (root / rel).resolve()
                if root.resolve() not in target.parents:
                    raise ValueError(f"the server sent a checkpoint path outside its folder: {rel}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            self._local = EnvRunner.from_checkpoint(root, env=env)
        self._last_update = time.monotonic()

    def _maybe_update(self) -> None:
        if time.monotonic() - self._last_update < self.update_interval:
            return
        out = self._http.call("weights", {})
        self._local.set_weights(out["weights"])
        self._local.set_connector_states(out["connector_states"])
        self._last_update = time.monotonic()
