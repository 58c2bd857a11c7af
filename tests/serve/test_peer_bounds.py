"""What one peer (IP address) may hold of a PolicyServer (issue 55, items 3-6): a share of
the body budget, its turn at the decoder, unread answers, connections. The attacker binds
127.0.0.2 and the good client 127.0.0.1 (both loopback), so the server sees two peers;
every loop here is bounded and stops by itself."""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from raw_load import read_answers, request_bytes
from server_probes import sample_forever

import rlconnect as rc
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve.wire import INLINE_BYTES, encode

BIG = gym.spaces.Box(-10, 10, (4096,), np.float32)  # a 16 KiB observation
ACT = gym.spaces.Discrete(2)
ATTACKER = "127.0.0.2"


def _attacker_socket(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0))


def _server(**settings) -> tuple[PolicyServer, object]:
    server = PolicyServer(
        rc.RandomPolicy(BIG, ACT, seed=0), "127.0.0.1", 0, max_concurrent=8, **settings
    )
    return server, sample_forever(server)


def _poll(condition, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return condition()


def _good_steps(server: PolicyServer, steps: int = 5) -> int:
    """A good client's episode of ``steps`` 16 KiB get_actions; its retries."""
    client = PolicyClient(server.url, retry_timeout_s=20)
    eid = client.start_episode()
    for t in range(steps):
        assert ACT.contains(int(client.get_action(eid, np.full(4096, t % 3, np.float32))))
    client.end_episode(eid, np.zeros(4096, np.float32))
    retries = client._http.retries
    client.close()
    return retries


def test_one_peers_trickling_bodies_hold_only_its_share_of_the_budget():
    server, sampler = _server(max_body_bytes=64 << 10, stall_timeout_s=30)
    socks = []
    try:
        listener = server._listener
        head = request_bytes("log_returns", b"\x81" * (16 << 10))[: -(16 << 10)]
        for _ in range(8):  # 8 bodies of 16 KiB, trickling: 15 KiB sent of each so far
            sock = _attacker_socket(server.port)
            sock.sendall(head + b"\x81" * (15 << 10))
            socks.append(sock)
        refused = [s for s, _ in read_answers(socks, 10, 4) if s == 503]
        assert len(refused) == 4  # the ones past its share were told to retry
        held = listener.peer_bytes.get(ATTACKER, 0)
        assert held == 4 * (15 << 10) <= 64 << 10  # its share: max_body_bytes_per_peer
        assert listener.limits.max_bodies_in_flight - listener.body_bytes >= 64 << 10
        assert _good_steps(server) == 0  # the rest of the budget: no 503, no retry
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    sampler.join(10)


def _costly_body(tag: int) -> bytes:
    """~120 KiB of 4,000 tiny arrays: costly to decode (a bad request: a list, not a map)."""
    return encode([np.array([tag], np.int8)] * 4000)


def test_the_decoder_serves_peers_in_turn():
    """One peer's 40 costly bodies are queued (the first held in the decoder by a gate)
    when a good peer's 16 KiB body comes: it is decoded next, not after the 40."""
    server, sampler = _server(stall_timeout_s=30)
    order: list[str] = []
    decoder = server._decoder
    decode = decoder._decode
    gate = threading.Event()

    def gated(body: bytes):
        order.append("good" if len(body) < 40_000 else "bad")
        gate.wait(20)
        return decode(body)

    decoder._decode = gated
    socks = []
    try:
        client = PolicyClient(server.url, retry_timeout_s=20)
        eid = client.start_episode()
        bodies = 40
        for k in range(bodies):  # one peer's many costly bodies, each on a connection
            sock = _attacker_socket(server.port)
            sock.sendall(request_bytes("get_action", _costly_body(k)))
            socks.append(sock)
        assert _poll(lambda: decoder.waiting == bodies - 1)  # one is in the decoder
        good = np.full(4096, 1, np.float32)  # 16 KiB: above INLINE_BYTES, decoded in turn
        assert len(encode(good)) > INLINE_BYTES
        got: list = []
        asker = threading.Thread(target=lambda: got.append(client.get_action(eid, good)))
        asker.start()
        assert _poll(lambda: decoder.waiting == bodies)
        gate.set()
        asker.join(30)
        assert got and ACT.contains(int(got[0]))
        bad_before = order[: order.index("good")].count("bad")
        print(f"\nthe good body was decoded after {bad_before} of {bodies} queued costly bodies")
        assert bad_before <= 2  # the one being decoded and one turn of its peer (FIFO: 40)
        answers = read_answers(socks, 30, bodies)
        assert [s for s, _ in answers] == [400] * bodies  # each bad body was answered
        client.end_episode(eid, good)
        client.close()
    finally:
        gate.set()
        for sock in socks:
            sock.close()
        server.stop()
    sampler.join(10)


def test_answers_nobody_reads_are_cut_past_the_limit():
    limit = 64 << 10
    server, sampler = _server(max_unread_answer_bytes=limit)
    try:
        listener = server._listener
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        sock.settimeout(10)
        sock.bind((ATTACKER, 0))
        sock.connect(("127.0.0.1", server.port))
        one = request_bytes("no_such_endpoint", {})  # a cheap 404 of ~300 B
        sent = 0
        for _ in range(100):  # up to 100 x 500 requests, pipelined, answers never read
            try:
                sock.sendall(one * 500)
            except OSError:
                break  # cut: the server reset the connection
            sent += 500
            if listener.unread_cut:
                break
        print(f"\n{sent} pipelined requests sent before the cut")
        assert _poll(lambda: listener.unread_cut == 1)
        peak = max([c.transport.get_write_buffer_size() for c in listener.connections] + [0])
        assert peak <= limit
        sock.close()
        assert _good_steps(server) == 0
    finally:
        server.stop()
    sampler.join(10)


@pytest.mark.parametrize("limit", [16])
def test_one_peer_holds_at_most_its_connections(limit):
    server, sampler = _server(max_connections_per_peer=limit)
    socks = []
    try:
        for _ in range(3 * limit):
            socks.append(_attacker_socket(server.port))
        answers = read_answers(socks, 10, 2 * limit)
        assert [s for s, _ in answers].count(503) == 2 * limit
        assert "max_connections_per_peer" in next(b for s, b in answers if s)["message"]
        assert server._listener.peer_connections[ATTACKER] == limit
        assert server._listener.refused_connections == 2 * limit
        assert _good_steps(server) == 0  # another peer is served
    finally:
        for sock in socks:
            sock.close()
        server.stop()
    sampler.join(10)
