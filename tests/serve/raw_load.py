"""Raw HTTP load on loopback for the hostile-serving tests: many sockets sending a request
each at once (what concurrent clients do), answers read with a deadline, and bounded
loops only (every helper stops by itself)."""

from __future__ import annotations

import selectors
import socket
import time

from rlconnect.serve.wire import decode, encode


def request_bytes(name: str, body: dict | bytes, extra: str = "") -> bytes:
    data = body if isinstance(body, bytes) else encode(body)
    head = (
        f"POST /v1/{name} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
        f"Content-Length: {len(data)}\r\n{extra}\r\n"
    )
    return head.encode() + data


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def parse_status(raw: bytes) -> int | None:
    """The status of the first HTTP answer in ``raw``, None if none came."""
    if not raw.startswith(b"HTTP/1.1 "):
        return None
    return int(raw[9:12])


def parse_answer(raw: bytes) -> tuple[int | None, object]:
    """(status, decoded body) of the first whole answer in ``raw``; (None, None) if none."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None, None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if len(rest) < length:
        return None, None
    return parse_status(raw), decode(rest[:length])


def send_all(port: int, requests: list[bytes]) -> list[socket.socket]:
    """One connection per request, each request sent whole."""
    socks = []
    for req in requests:
        s = connect(port)
        s.sendall(req)
        socks.append(s)
    return socks


def read_answers(socks: list[socket.socket], deadline_s: float, want: int) -> list[tuple]:
    """``(status, body)`` of each socket (None while no whole answer came), read until
    ``want`` of them answered or ``deadline_s`` passed; the sockets stay open."""
    bufs = dict.fromkeys(socks, b"")
    answers: dict[socket.socket, tuple] = {}
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    end = time.monotonic() + deadline_s
    while len(answers) < want and time.monotonic() < end:
        for key, _ in sel.select(0.05):
            s = key.fileobj
            try:
                chunk = s.recv(1 << 16)
            except (BlockingIOError, ConnectionError):
                chunk = b""
            if not chunk:
                sel.unregister(s)
                answers.setdefault(s, (parse_status(bufs[s]), None))
                continue
            bufs[s] += chunk
            got = parse_answer(bufs[s])
            if got[0] is not None:
                answers[s] = got
    sel.close()
    return [answers.get(s, (None, None)) for s in socks]


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()
