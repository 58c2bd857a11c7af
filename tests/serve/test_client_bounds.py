"""What a PolicyClient holds and how long a call lasts, whatever the server does (issue
55, items 10, 11, 13), and what the server checks of GET bodies and answers plain clients
(items 12, serving steps). The hostile servers are threads on 127.0.0.1 that stop by
themselves."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request

import gymnasium as gym
import msgpack
import numpy as np
import pytest
from raw_load import connect, read_answers
from server_probes import sample_forever

import rlconnect as rc
from rlconnect.serve import PolicyClient, PolicyServer, ServerError, ServerTimeoutError
from rlconnect.serve.client import AnswerTooLargeError
from rlconnect.serve.wire import WireError, encode

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


class Hostile:
    """A one-connection-at-a-time server: reads a request's head and body, then runs
    ``answer(sock)``; at most ``connections`` connections, then it stops."""

    def __init__(self, answer, connections: int = 8) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(30)
        self.port = self.listener.getsockname()[1]
        self.answer, self.connections = answer, connections
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        for _ in range(self.connections):
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with sock:
                sock.settimeout(10)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                with contextlib.suppress(OSError):
                    self.answer(sock)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(30)


def test_an_answer_past_max_answer_bytes_is_refused_unread():
    sent = []

    def endless(sock):  # no Content-Length: the body ends when the connection does
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\n\r\n")
        for _ in range(64):  # 64 MiB at most
            sock.sendall(b"\x00" * (1 << 20))
            sent.append(1)

    def declared(sock):
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\n"
            b"Content-Length: 4000000000\r\n\r\n"
        )

    for answer, what in ((declared, "declares 4000000000 B"), (endless, "more than")):
        server = Hostile(answer, connections=1)
        client = PolicyClient(server.url, retry_timeout_s=1, max_answer_bytes=1 << 20)
        with pytest.raises(AnswerTooLargeError, match=what):
            client.health()
        client.close()
        server.close()
    assert len(sent) < 64  # the client stopped reading: the server could not send it all


def test_a_call_ends_by_its_deadline_whatever_the_server_trickles():
    sent = []

    def trickle(sock):  # a byte every 50 ms, 600 bytes: 30 s if the client waited
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-msgpack\r\n")
        for _ in range(600):
            sock.sendall(b"X")
            sent.append(1)
            time.sleep(0.05)

    server = Hostile(trickle, connections=1)
    client = PolicyClient(server.url, timeout_s=1, retry_timeout_s=1)
    with pytest.raises(ServerTimeoutError, match="retries included"):
        client.health()
    at_end = len(sent)
    client.close()
    server.close()
    assert at_end < 600  # the call ended while the server still trickled


def test_a_proxys_html_error_is_an_http_error_with_a_snippet():
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"

    def proxy(sock):
        sock.sendall(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(page), page)
        )

    server = Hostile(proxy, connections=1)
    client = PolicyClient(server.url, retry_timeout_s=1)
    with pytest.raises(ServerError, match=r"HTTP 502 NotMsgpack.*502 Bad Gateway") as info:
        client.health()
    assert info.value.status == 502 and not isinstance(info.value, WireError)
    client.close()
    server.close()


def test_get_bodies_are_checked_health_is_json_and_actions_are_plain_ints():
    server = PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    sampler = sample_forever(server)
    try:
        heads = [
            b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
            b"Content-Length: 1000000000\r\n\r\n",
            b"GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 5\r\n\r\nhello",
        ]
        socks = [connect(server.port) for _ in heads]
        for sock, head in zip(socks, heads):
            sock.sendall(head)
        assert [s for s, _ in read_answers(socks, 10, 2)] == [413, 415]
        assert server._listener.body_bytes == 0
        with urllib.request.urlopen(server.url + "/v1/health", timeout=10) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            health = json.loads(resp.read())
        assert health["ok"] is True and health["action_space"]["type"] == "Discrete"
        client = PolicyClient(server.url)
        eid = client.start_episode()
        req = urllib.request.Request(
            server.url + "/v1/get_action",
            msgpack.packb({"episode_id": eid, "obs": [0.0, 1.0, 2.0]}),
            {"Content-Type": "application/msgpack"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            action = msgpack.unpackb(resp.read())["action"]
        assert type(action) is int and ACT.contains(action)  # not an ExtType
        assert type(client.get_action(eid, np.zeros(3, np.float32))) is int
        client.close()
    finally:
        server.stop()
    sampler.join(10)


def test_the_client_still_takes_msgpack_answers_of_any_declared_kind():
    def ok(sock):
        body = encode({"ok": True})
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: %d"
            b"\r\n\r\n%s" % (len(body), body)
        )

    server = Hostile(ok, connections=1)
    client = PolicyClient(server.url, retry_timeout_s=1)
    assert client.health() == {"ok": True}
    client.close()
    server.close()
