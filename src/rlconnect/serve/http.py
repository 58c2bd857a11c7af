"""The HTTP/1.1 side of a PolicyServer: one asyncio event loop and httptools' parser.

Every connection is an ``HttpConnection`` on the listener's event loop (its own thread), so
thousands of clients cost no thread each. A request is checked before its body is read: a
``Content-Length`` (411 without a valid one, 413 above ``max_body_bytes``), a msgpack
``Content-Type`` (415 otherwise: a browser page cannot send one without a CORS preflight,
so a page a user visits cannot post experience to a server on their machine), and room
for it in the budget of body bytes held at once (503 with ``Retry-After`` otherwise: the
client retries, nothing was taken). The budget is charged with the bytes that actually
arrived, not with the lengths requests declare, and a body stays charged until its request
is answered (decoded bodies waiting for the decoder thread included); a request whose
bytes would overflow it is refused then. Refused requests close their connection.

Deadlines: a request must arrive complete within ``request_timeout_s`` of its first
byte, however slowly its bytes trickle in, and a request whose bytes stop coming for
``stall_timeout_s`` is cut sooner; a connection idle for ``request_timeout_s`` is closed.
A stalled or trickling client is cut and counted in ``disconnects``. Requests of one
connection are answered in order: a pipelined request waits, with reading paused, until
the one before it is answered.

The application is one ``dispatch(connection, method, path, body)`` callback that answers
now or later (on the loop thread) with ``connection.respond``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlconnect.serve.wire import encode

__all__ = ["CONTENT_TYPES", "MAX_BODY_BYTES", "HttpConnection", "Limits", "Listener"]

log = logging.getLogger("rlconnect.serve.server")

MAX_BODY_BYTES = 64 << 20
"""Largest request body by default (``PolicyServer(max_body_bytes=...)``)."""
#: request Content-Types taken as msgpack (the client sends the first)
CONTENT_TYPES = ("application/x-msgpack", "application/msgpack", "application/vnd.msgpack")
_TYPES = {t.encode() for t in CONTENT_TYPES}
_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(-?)", re.IGNORECASE)
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


#: longest client token (``X-Rlconnect-Client``) kept; longer ones are cut
MAX_TOKEN_BYTES = 64
#: seconds a refusal for capacity is reported by ``/health`` (``refusing``)
REFUSAL_MEMORY_S = 10.0


@dataclass(frozen=True)
class Limits:
    """What one request may take: body bytes, body bytes of all requests held at once,
    seconds to arrive whole (also the idle time after which a connection is closed), and
    seconds its bytes may stop coming; what one peer (IP address) may hold: body bytes
    of all its requests at once and connections; and the bytes of answers a connection
    may leave unread beside the one being sent."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_bodies_in_flight: int = 2 * MAX_BODY_BYTES
    request_timeout_s: float | None = 60.0
    stall_timeout_s: float | None = 10.0
    max_body_bytes_per_peer: int = MAX_BODY_BYTES
    max_connections_per_peer: int = 64
    max_unread_answer_bytes: int = 4 << 20


Dispatch = Callable[["HttpConnection", str, str, bytes], None]


def _httptools() -> Any:
    """httptools, imported on first use so ``import rlconnect`` works without the extra."""
    try:
        import httptools
    except ImportError:
        raise ImportError(
            "rlconnect.serve's server needs httptools: pip install 'rlconnect[serve]'"
        ) from None
    return httptools


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, enforces the limits, writes answers."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.parser = listener.httptools.HttpRequestParser(self)
        self.seq = 0  # requests answered so far: an answer for an older one is dropped
        self.peer = ""  # the client's IP address
        self.counted = False  # counted in its peer's connections (refused ones are not)
        self.token: str | None = None  # the first X-Rlconnect-Client header it sent
        self.started: float | None = None  # first byte of the request being received
        self.last_byte = time.monotonic()
        self.held = 0  # body bytes charged to the budget (until their request is answered)
        self._answering = 0  # the bytes of the body of the request being answered
        self.idle_since = time.monotonic()
        self.answer_deadline: tuple[float, str] | None = None
        self._busy = False  # a request is being answered
        self._queue: list[tuple[str, str, bytes]] = []
        self._refused: float | None = None  # when a request was refused unread
        self._peer_done = False  # the client sent EOF: answer, then close
        self._reset_request()

    def _reset_request(self) -> None:
        self._url = b""
        self._length: int | None = None
        self._type: bytes | None = None
        self._chunks: list[bytes] = []
        self._expect = False  # the client waits for "100 Continue" before its body

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection (503 and closed for a peer at ``max_connections_per_peer``)
        and turn off Nagle's delay."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.listener.admit(self):
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:  # answers go out in one write: no Nagle delay to wait for
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        """Release the connection's budget and place; a request cut short is counted in
        ``disconnects`` and its answer dropped."""
        self.listener.connections.discard(self)
        self.listener.leave(self)
        self._give_back(self.held)
        if exc is not None or self.started is not None or self._busy:
            self.listener.disconnects += 1
            log.debug("PolicyServer: a client disconnected mid-request (%r)", exc)
        self._queue.clear()
        self.seq += 1  # a later answer has nowhere to go

    def data_received(self, data: bytes) -> None:
        """Feed the bytes to the parser (the rest of a refused request is dropped)."""
        if self._refused is not None:
            return  # the rest of a refused request: read and dropped
        self.last_byte = time.monotonic()
        if self.started is None:
            self.started = self.last_byte
        try:
            self.parser.feed_data(data)
        except self.listener.httptools.HttpParserError as exc:
            self._parse_error(exc, data)

    def eof_received(self) -> bool:
        """The client is done sending: a body cut short is refused (400); otherwise keep
        the transport open while answers are still owed."""
        if self._refused is not None:
            return False
        if self.started is not None and self._length is not None:
            self.refuse(400, "BadRequest", "the body ended before its Content-Length")
            return True
        self._peer_done = True
        return self._busy or bool(self._queue)  # keep writing what is being answered

    # -- httptools callbacks ------------------------------------------------------------
    def on_url(self, url: bytes) -> None:
        """Collect the request's path (it may come in pieces)."""
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        """Note the headers the checks need; a chunked body is refused (411)."""
        lower = name.lower()
        if lower == b"content-length":
            self._length = int(value)
        elif lower == b"content-type":
            self._type = value.split(b";", 1)[0].strip().lower()
        elif lower == b"x-rlconnect-client" and self.token is None:
            self.token = value[:MAX_TOKEN_BYTES].decode("ascii", "replace")
        elif lower == b"expect":
            self._expect = value.strip().lower() == b"100-continue"
        elif lower == b"transfer-encoding":
            self._length = None
            self.refuse(411, "LengthRequired", "send a Content-Length header, not chunks")

    def on_headers_complete(self) -> None:
        """Check a request with a body before reading it (413, 415, the bytes budget) and
        answer ``Expect: 100-continue``."""
        if self._refused is not None:
            return
        if self.parser.get_method() != b"POST" and not self._length:
            return  # a GET (or another method) without a body: nothing to check
        # a body, whatever the method: the same checks as a POST's (413, 415, budget)
        problem = self.listener.check_post(self._length, self._type, self.peer)
        if problem is not None:
            self.refuse(*problem)
            return
        if self._expect and self.transport is not None:  # e.g. curl, for bodies above 1 KB
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        """Charge the bytes that arrived to the budget, refusing the request (503) when they
        would overflow it or the peer's share of it."""
        if self._refused is not None:
            return
        listener = self.listener
        problem = listener.check_room(self.peer, len(body))
        if problem is not None:
            self.refuse(*problem)
            return
        self.held += len(body)
        listener.charge(self.peer, len(body))
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        """Queue the complete request; it is answered now, or after the one before it."""
        if self._refused is not None:
            return
        method = self.parser.get_method().decode("ascii", "replace")
        path = self._url.decode("utf-8", "replace")
        body = b"".join(self._chunks)
        self._reset_request()
        self.started = None
        self._queue.append((method, path, body))
        if not self._busy:
            self._next()
        elif self.transport is not None:
            self.transport.pause_reading()  # pipelined: wait for the answer before it

    # -- answering ----------------------------------------------------------------------
    def _next(self) -> None:
        while self._queue and not self._busy and self._refused is None:
            method, path, body = self._queue.pop(0)
            self._busy = True
            self._answering = len(body)
            self.listener.dispatch(self, method, path, body)
        if not self._queue and self.transport is not None and self._refused is None:
            self.transport.resume_reading()

    def respond(
        self, status: int, payload: Any, *, close: bool = False, as_json: bool = False
    ) -> None:
        """Answer the request being served (a no-op once the connection is gone), in
        msgpack, or in JSON (``as_json``: ``GET /v1/health``, for curl and probes)."""
        try:
            data = json.dumps(payload).encode() if as_json else encode(payload)
        except (TypeError, ValueError) as exc:  # e.g. an action the wire cannot carry
            status, data = 500, encode({"error": "EncodeError", "message": str(exc)})
            as_json = False
        if status >= 400:
            self.listener.errors += 1
        close = close or self._peer_done or not self.parser.should_keep_alive()
        self._write(status, data, close, b"application/json" if as_json else b"")
        self._give_back(self._answering)
        self._answering = 0
        self._busy = False
        self.seq += 1
        self.answer_deadline = None
        self.idle_since = time.monotonic()
        if not close:
            self._next()

    def _write(self, status: int, data: bytes, close: bool, content_type: bytes = b"") -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        head = (
            b"HTTP/1.1 %d %s\r\nServer: rlconnect-serve/2\r\n"
            b"Content-Type: %s\r\nContent-Length: %d\r\n"
            % (
                status,
                _REASONS.get(status, b"Error"),
                content_type or b"application/x-msgpack",
                len(data),
            )
        )
        if status == 503:
            head += b"Retry-After: 1\r\n"
        if close:
            head += b"Connection: close\r\n"
        unread = transport.get_write_buffer_size()  # earlier answers the client left unread
        transport.write(head + b"\r\n" + data)
        if unread and unread + len(data) > self.listener.limits.max_unread_answer_bytes:
            self.listener.unread_cut += 1
            log.debug("PolicyServer: a client left %d B of answers unread: cut", unread)
            transport.abort()  # answers nobody reads are not kept (max_unread_answer_bytes)
            return
        if close and self._refused is not None and transport.can_write_eof():
            transport.write_eof()  # the client may still be sending: let it read the answer
        elif close:
            transport.close()

    def refuse(self, status: int, kind: str, message: str) -> None:
        """An error answered before the body was read: the connection cannot go on."""
        self._refused = time.monotonic()
        self._give_back(self.held)  # everything: the connection cannot go on
        self._busy = True
        self.started = None
        self.respond(status, {"error": kind, "message": message}, close=True)

    def turn_away(self, kind: str, message: str) -> None:
        """Answer 503 to a connection refused as it opened, and close it (its requests
        are never read)."""
        self._refused = time.monotonic()
        self.listener.errors += 1
        data = encode({"error": kind, "message": message})
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/x-msgpack\r\n"
            b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" % len(data) + data
        )
        self.transport.close()

    def _parse_error(self, exc: Exception, data: bytes) -> None:
        found = _LENGTH.search(data)
        if "Content-Length" in str(exc) and found is not None:
            if found.group(1):
                self.refuse(400, "BadRequest", "a negative Content-Length")
            else:
                self.refuse(411, "LengthRequired", "send a valid Content-Length header")
        else:
            self.refuse(400, "BadRequest", f"not an HTTP/1.1 request: {exc}")

    def _give_back(self, size: int) -> None:
        """Return ``size`` body bytes of this connection to the budget."""
        size = min(size, self.held)
        self.listener.charge(self.peer, -size)
        self.held -= size

    def check_deadlines(self, now: float, limits: Limits) -> None:
        """Cut a request arriving too slowly or stalled, or an idle connection; answer a
        late action."""
        if self.answer_deadline is not None and now > self.answer_deadline[0]:
            self.respond(504, {"error": "TimeoutError", "message": self.answer_deadline[1]})
        if self.transport is None:
            return
        if self._refused is not None:  # its answer had a second to be read
            if now - self._refused > 1.0:
                self.transport.abort()
            return
        timeout, stall = limits.request_timeout_s, limits.stall_timeout_s
        if self._busy:
            return
        if self.started is not None and (
            (timeout is not None and now - self.started > timeout)
            or (stall is not None and now - self.last_byte > stall)
        ):
            self.transport.abort()  # counted in connection_lost
        elif self.started is None and timeout is not None and now - self.idle_since > timeout:
            if self.transport.get_write_buffer_size():
                self.transport.abort()  # its answer was never read: close() would keep it
            else:
                self.transport.close()


class Listener:
    """The event loop thread, its listening socket and its connections."""

    def __init__(
        self, dispatch: Dispatch, limits: Limits, watch: Callable[[], None] | None = None
    ) -> None:
        self.httptools = _httptools()
        self.dispatch = dispatch
        self.watch = watch  # the application's check at every sweep (on the loop)
        self.limits = limits
        self.connections: set[HttpConnection] = set()
        self.disconnects = 0  # clients cut or gone mid-request
        self.errors = 0  # answers with a 4xx or 5xx status
        self.body_bytes = 0  # body bytes received and not yet answered
        self.peer_bytes: dict[str, int] = {}  # the same, by peer (only peers holding some)
        self.peer_connections: dict[str, int] = {}  # open connections by peer
        self.refused_connections = 0  # connections refused for their peer's limit
        self.unread_cut = 0  # connections cut for leaving answers unread
        self.refused_for_capacity = 0  # 503s for capacity (bodies, queue), all told
        self.last_refusal: tuple[float, str] | None = None
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def admit(self, conn: HttpConnection) -> bool:
        """Count a new connection for its peer (True), or refuse it with 503 and close it
        when the peer already has ``max_connections_per_peer`` (False)."""
        limit = self.limits.max_connections_per_peer
        if self.peer_connections.get(conn.peer, 0) >= limit:
            self.refused_connections += 1
            _, kind, message = self.busy(
                f"this address has {limit} connections open (max_connections_per_peer); "
                "reuse them or close some"
            )
            conn.turn_away(kind, message)
            return False
        self.peer_connections[conn.peer] = self.peer_connections.get(conn.peer, 0) + 1
        conn.counted = True
        self.connections.add(conn)
        return True

    def leave(self, conn: HttpConnection) -> None:
        """A counted connection closed: its peer has one fewer."""
        if conn.counted:
            conn.counted = False
            left = self.peer_connections[conn.peer] - 1
            if left:
                self.peer_connections[conn.peer] = left
            else:
                del self.peer_connections[conn.peer]

    def charge(self, peer: str, size: int) -> None:
        """``size`` body bytes more (or fewer, when negative) held for ``peer``."""
        self.body_bytes += size
        held = self.peer_bytes.get(peer, 0) + size
        if held > 0:
            self.peer_bytes[peer] = held
        else:
            self.peer_bytes.pop(peer, None)

    def check_room(self, peer: str, size: int) -> tuple | None:
        """The 503 refusal when ``size`` more body bytes overflow the budget or ``peer``'s
        share of it (``max_body_bytes_per_peer``), else None."""
        limits = self.limits
        if self.body_bytes + size > limits.max_bodies_in_flight:
            return self.busy("too many body bytes are arriving at once; retry")
        if self.peer_bytes.get(peer, 0) + size > limits.max_body_bytes_per_peer:
            return self.busy(
                "this address's requests hold their share of the body bytes already "
                f"(max_body_bytes_per_peer={limits.max_body_bytes_per_peer} B); retry when "
                "they are answered"
            )
        return None

    def check_post(
        self, length: int | None, content_type: bytes | None, peer: str = ""
    ) -> tuple | None:
        """The refusal (status, kind, message) of a POST's headers, or None."""
        limits = self.limits
        if length is None:
            return 411, "LengthRequired", "send a Content-Length header"
        if length > limits.max_body_bytes:
            return 413, "TooLarge", f"bodies are limited to {limits.max_body_bytes} B"
        if content_type not in _TYPES:
            return (
                415,
                "UnsupportedMediaType",
                f"the body must be msgpack sent with Content-Type: {CONTENT_TYPES[0]} "
                f"(got {content_type!r})",
            )
        return self.check_room(peer, length)

    def busy(self, message: str) -> tuple[int, str, str]:
        """A 503 refusal for capacity, counted and remembered for ``/health``."""
        self.refused_for_capacity += 1
        self.last_refusal = (time.monotonic(), message)
        return 503, "ServerBusy", message

    def refusing(self) -> str | None:
        """Why requests were refused for capacity in the last ``REFUSAL_MEMORY_S``, or None."""
        last = self.last_refusal
        if last is None or time.monotonic() - last[0] > REFUSAL_MEMORY_S:
            return None
        return last[1]

    def start(self, address: str, port: int, backlog: int) -> tuple[str, int]:
        """Listen and run the loop in its thread; the bound address and port."""
        self._thread.name = f"PolicyServer-{port}"
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(address, port, backlog), self.loop)
        host, bound = future.result(30)[:2]
        self._thread.name = f"PolicyServer-{bound}"
        return host, bound

    async def _listen(self, address: str, port: int, backlog: int) -> tuple:
        self._server = await self.loop.create_server(
            lambda: HttpConnection(self), address, port, backlog=backlog, reuse_address=True
        )
        self.loop.create_task(self._sweep())
        return self._server.sockets[0].getsockname()

    async def _sweep(self) -> None:
        """Run the application's watch and check every connection's deadlines, a few
        times per deadline (at least four times a second)."""
        limits = self.limits
        deadlines = [t for t in (limits.request_timeout_s, limits.stall_timeout_s) if t]
        tick = min([0.25] + [t / 4 for t in deadlines])
        while True:
            await asyncio.sleep(tick)
            if self.watch is not None:
                self.watch()
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check_deadlines(now, limits)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread (from any thread; dropped once the loop is
        closed: there is no connection left to answer)."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        """Stop listening, cut every connection and end the loop thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
