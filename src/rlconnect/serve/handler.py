"""The HTTP side of a PolicyServer: the stdlib server, the request handler, the statuses.

A request is checked before its body is read: a ``Content-Length`` (411 without one, 413
above ``MAX_BODY_BYTES``) and a msgpack ``Content-Type`` (415 otherwise: a browser page
cannot send one without a CORS preflight, so a web page a user visits cannot post
experience to a server on their machine). The body is then decoded (``wire``, 400 when
malformed) and answered by ``PolicyServer.handle``; its errors map to statuses by
``STATUS``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rlconnect.envs.external import (
    BadObservationError,
    EpisodeError,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.errors import EnvError
from rlconnect.serve.tasks import RunnerUnavailable
from rlconnect.serve.wire import WireError, decode, encode

if TYPE_CHECKING:
    from rlconnect.serve.server import PolicyServer

__all__ = [
    "CONTENT_TYPES",
    "MAX_BODY_BYTES",
    "STATUS",
    "BadRequest",
    "HTTPServer",
    "NoEndpoint",
    "make_handler",
]

log = logging.getLogger("rlconnect.serve.server")

MAX_BODY_BYTES = 64 << 20
#: request Content-Types taken as msgpack (the client sends the first)
CONTENT_TYPES = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")


class BadRequest(ValueError):
    """A request that is missing a field or has one of the wrong type."""


class NoEndpoint(Exception):
    """The request names no endpoint."""


#: errors of ``PolicyServer.handle`` -> HTTP status (first match); anything else is a 500
STATUS: list[tuple[type[BaseException], int]] = [
    (WireError, 400),
    (BadRequest, 400),
    (UnknownEpisodeError, 404),
    (TooManyEpisodesError, 429),
    (BadObservationError, 422),
    (EpisodeError, 409),
    (TimeoutError, 504),
    (RunnerUnavailable, 503),
    (EnvError, 503),
]


class HTTPServer(ThreadingHTTPServer):
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


def make_handler(
    server: PolicyServer, request_timeout_s: float | None
) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``server`` (one instance per connection)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "rlconnect-serve/1"
        timeout = request_timeout_s  # socket timeout: a silent client cannot hold a thread

        def setup(self) -> None:
            super().setup()
            # answers are written as headers + body: without this, Nagle and delayed ACKs
            # add ~40 ms to every keep-alive request
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server.track(self.connection)

        def finish(self) -> None:
            server.untrack(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, payload: Any) -> None:
            data = encode(payload)
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPES[0])
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            server.errors += 1
            self._send(status, {"error": kind, "message": message})

        def _refuse(self, status: int, kind: str, message: str) -> None:
            """An error answered before the body was read: the connection cannot go on."""
            self.close_connection = True
            self._error(status, kind, message)

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
                return self._refuse(411, "LengthRequired", "send a Content-Length header")
            if length < 0:
                return self._refuse(400, "BadRequest", f"negative Content-Length {length}")
            if length > MAX_BODY_BYTES:
                return self._refuse(413, "TooLarge", f"bodies are limited to {MAX_BODY_BYTES} B")
            sent_type = self.headers.get("Content-Type")
            if sent_type is None or self.headers.get_content_type() not in CONTENT_TYPES:
                return self._refuse(
                    415,
                    "UnsupportedMediaType",
                    f"the body must be msgpack sent with Content-Type: {CONTENT_TYPES[0]} "
                    f"(got {sent_type!r})",
                )
            try:
                raw = self.rfile.read(length)
            except TimeoutError:  # silent past request_timeout_s: drop it, quietly
                self.server.disconnects += 1  # type: ignore[attr-defined]
                self.close_connection = True
                return None
            self._answer(self.path.removeprefix("/v1/").strip("/"), raw)

        def _answer(self, name: str, raw: bytes) -> None:
            try:
                result = server.handle(name, decode(raw) if raw else {})
            except NoEndpoint as exc:
                return self._error(404, "NotFound", str(exc))
            except Exception as exc:
                for cls, status in STATUS:
                    if isinstance(exc, cls):
                        return self._error(status, type(exc).__name__, str(exc))
                log.exception("PolicyServer: %s failed", name)
                return self._error(500, type(exc).__name__, f"{name} failed: {exc}")
            try:
                self._send(200, result)
            except TypeError as exc:  # an action the wire format cannot carry
                self._error(500, "EncodeError", str(exc))

    return Handler
