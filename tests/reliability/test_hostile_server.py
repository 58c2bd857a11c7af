"""Hostile requests to a live policy server: ``PolicyServer.handle`` with any decoded body,
and raw HTTP (bad bodies, oversize and lying lengths, wrong content types, deep nesting).

Invariants: ``handle`` raises only the errors the server maps to HTTP 4xx (its ``STATUS``
table: never a 500 for a bad body); raw HTTP gets 4xx answers (413 before an oversize body
is read) and the server keeps serving; nothing runs, nothing is imported, memory stays
bounded. Stalled, trickling, greedy and NaN-sending clients beside well-behaved ones: the
hostile ones are cut or refused, every well-behaved episode is recorded exactly.
``tests/serve`` holds the protocol tests.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve import handler as handler
from rlconnect.serve.wire import encode

pytestmark = pytest.mark.reliability

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Discrete(3)
HANDLE_ALLOWED = (*(cls for cls, _ in handler.STATUS), handler.NoEndpoint)
GET_ACTION = encode({"episode_id": "e1", "obs": np.arange(3, dtype=np.float32)})


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("hostile_server")
    fc.publish(["server:handle", "server:http"])


# -- the request handler ----------------------------------------------------------------------
class Served:
    """A PolicyServer whose runner samples in a thread (as in tests/serve)."""

    def __init__(self) -> None:
        policy = rc.MLPPolicy(OBS, ACT, hiddens=(8,), seed=0)
        config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
        self.server = PolicyServer(
            policy,
            "127.0.0.1",
            0,
            config=config,
            max_concurrent=1000,
            episode_timeout_s=5.0,
            get_action_timeout_s=2.0,
        )
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            try:
                self.server.runner.sample()
            except EnvError:  # the server was stopped
                return

    def stop(self) -> None:
        self.server.stop()
        self._thread.join(10)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.stop()


EPISODE = "<a running episode>"
NUMPY_LAZY = frozenset({"numpy.ma", "numpy.ma.core", "numpy.ma.extras"})
"""Imported by numpy itself when it formats a complex observation in an error message."""
ENDPOINTS = [
    "start_episode",
    "get_action",
    "log_action",
    "log_returns",
    "end_episode",
    "report",
    "health",
    "nope",
    "",
    "../v1/health",
]
FIELD_VALUES = st.one_of(
    st.sampled_from([None, True, 0, -1, 10**12, 2**64, 1.5, float("nan"), "", "e0"]),
    st.just(EPISODE),
    st.just(EPISODE),
    st.sampled_from([[], {}, [1, 2, 3], [[1, 2, 3]], {"a": 1}, (1, 2, 3), b"\x00" * 12]),
    st.sampled_from(
        [
            np.zeros(3, np.float32),
            np.zeros(4, np.float32),
            np.full(3, np.nan, np.float32),
            np.zeros((1, 3), np.float32),
            np.zeros(3, np.complex64),
            np.zeros(0),
            np.int64(2),
            np.array(7),
            np.zeros(3, bool),
            np.full(3, 1e30),
        ]
    ),
)
REQUEST_BODIES = st.dictionaries(
    st.sampled_from(
        ["episode_id", "obs", "action", "reward", "info", "training_enabled", "commands", "x"]
    ),
    FIELD_VALUES
    | st.lists(
        st.tuples(
            st.sampled_from(ENDPOINTS[:5]),
            st.dictionaries(
                st.sampled_from(["episode_id", "obs", "reward", "action"]), FIELD_VALUES, max_size=3
            ),
        ).map(list),
        max_size=3,
    ),
    max_size=4,
) | st.sampled_from([None, [], "body", 5])


@settings(fc.SETTINGS, max_examples=fc.examples(120))
@given(name=st.sampled_from(ENDPOINTS), body=REQUEST_BODIES)
def test_handle_raises_only_mapped_errors(
    served: Served, marker_dir: Path, name: str, body: Any
) -> None:
    """Any decoded body: an answer, or an error the server turns into a 4xx (never a 500)."""
    server = served.server
    eid = server.handle("start_episode", {})["episode_id"]
    body = substitute(body, eid)
    guard = fc.Guard("server:handle", HANDLE_ALLOWED, marker_dir, NUMPY_LAZY)
    try:
        guard.run(lambda: server.handle(name, body), (name, body), name or "empty")
    finally:
        with contextlib.suppress(Exception):  # the request may have ended it already
            server.handle("end_episode", {"episode_id": eid, "obs": np.zeros(3, np.float32)})


def substitute(value: Any, eid: Any) -> Any:
    """``value`` with every ``EPISODE`` placeholder replaced by the running episode's id."""
    if isinstance(value, str) and value == EPISODE:
        return eid
    if isinstance(value, dict):
        return {k: substitute(v, eid) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, eid) for v in value]
    return value


# -- raw HTTP ---------------------------------------------------------------------------------
def raw_request(port: int, head: bytes, body: bytes = b"", shut: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        if shut:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0


def post_head(length: Any, content_type: str = "application/x-msgpack") -> bytes:
    lines = [b"POST /v1/get_action HTTP/1.1", b"Host: x", b"Connection: close"]
    if content_type:
        lines.append(b"Content-Type: " + content_type.encode())
    if length is not None:
        lines.append(b"Content-Length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


def test_raw_http_requests_get_4xx_and_the_server_keeps_serving(
    served: Served, marker_dir: Path
) -> None:
    port = served.server.port
    huge_array = b"\x81\xa3obs\xdd\xff\xff\xff\xff"
    cases = {
        "garbage body": (post_head(9), b"\xc1garbage!", {400}),
        "oversize body (413 before reading)": (
            post_head(handler.MAX_BODY_BYTES + 1),
            b"",
            {413},
        ),
        "declared 10**12 bytes": (post_head(10**12), b"x" * 10, {413}),
        "negative length": (post_head(-5), b"", {400, 411, 413}),
        "no length": (post_head(None), b"abc", {411}),
        "length not a number": (post_head("12abc"), b"abc", {411}),
        "wrong content type, garbage": (post_head(5, "text/plain"), b"hello", {415}),
        "wrong content type, valid body": (
            post_head(len(GET_ACTION), "text/html"),
            GET_ACTION,
            {415},
        ),
        "no content type, valid body": (post_head(len(GET_ACTION), ""), GET_ACTION, {415}),
        "deep tuple nesting": (
            post_head(len(fc.nested_tuples(5000))),
            fc.nested_tuples(5000),
            {400},
        ),
        "deep list nesting": (post_head(100_001), b"\x91" * 100_000 + b"\xc0", {400}),
        "array header declaring 2**32 elements": (post_head(len(huge_array)), huge_array, {400}),
        "body shorter than its length": (post_head(100), b"\x80", {400}),
        "not HTTP": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64, b"", {0, 400}),
    }
    # the client side's first connection imports the idna codec (socket host names)
    raw_request(port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    guard = fc.Guard("server:http", (), marker_dir)
    for what, (head, body, allowed) in cases.items():
        answers: list[bytes] = []
        guard.run(
            lambda h=head, b=body, out=answers: out.append(raw_request(port, h, b)), what, "http"
        )
        assert status_of(answers[0]) in allowed, (what, answers[0][:200])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/health")
    assert conn.getresponse().status == 200  # still serving
    conn.close()


# -- slow, stalled and greedy clients beside well-behaved ones ---------------------------------
class Recording:
    """A server with short deadlines whose runner samples in a thread, keeping its batches."""

    def __init__(self) -> None:
        config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
        policy = rc.MLPPolicy(OBS, ACT, hiddens=(8,), seed=0)
        self.server = PolicyServer(
            policy,
            "127.0.0.1",
            0,
            config=config,
            max_concurrent=64,
            max_episodes_per_client=4,
            client_key="token",  # the clients of this test share one address
            request_timeout_s=0.5,
        )
        self.batches: list[rc.SampleBatch] = []
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while True:
            try:
                self.batches.append(self.server.runner.sample())
            except EnvError:
                return

    def episodes(self) -> dict[tuple[int, int], rc.SampleBatch]:
        out = {}
        for b in list(self.batches):
            for ep in b.split_by_episode():
                out[(int(ep["obs"][0, 0]), int(ep["obs"][0, 1]))] = ep
        return out


def good_client(url: str, cid: int, episodes: int, steps: int) -> None:
    """Episodes whose observations say (client, episode, step); reward = step + 1."""
    client = PolicyClient(url, retry_timeout_s=10.0)
    for k in range(episodes):
        eid = client.start_episode()
        for t in range(steps):
            obs = np.array([cid, k, t], np.float32)
            client.get_action(eid, obs, reward=None if t == 0 else float(t))
        client.log_returns(eid, float(steps))
        client.end_episode(eid, np.zeros(3, np.float32))
    client.close()


def hostile_sockets(port: int) -> list[socket.socket]:
    """30 connections stalled mid-headers, 10 trickling a byte per 0.1 s, 5 stalled
    mid-body: none ever completes a request."""
    body = encode({"episode_id": "x", "obs": np.zeros(3, np.float32)})
    head = post_head(len(body))
    socks = []
    for i in range(45):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(head[:20] if i < 30 else head[:1] if i < 40 else head + body[:3])
        socks.append(sock)
    return socks


def test_slow_stalled_and_greedy_clients_cannot_stop_the_others() -> None:
    rec = Recording()
    url, port = rec.server.url, rec.server.port
    try:
        socks = hostile_sockets(port)
        greedy = PolicyClient(url)
        for _ in range(4):
            greedy.start_episode()
        with pytest.raises(rc.envs.TooManyEpisodesError, match="max_episodes_per_client"):
            greedy.start_episode()
        nan_client = PolicyClient(url)
        bad_eid = nan_client.start_episode()
        good = [threading.Thread(target=good_client, args=(url, c, 4, 8)) for c in range(4)]
        for th in good:
            th.start()
        for obs in ([np.nan, 0, 0], [np.inf, 0, 0], [1e9, 0, 0]):  # each refused, 422
            with pytest.raises(rc.envs.BadObservationError):
                nan_client.get_action(bad_eid, np.array(obs, np.float32))
        head = post_head(20)
        for j in range(1, 11):  # the trickling ones: a byte each 0.1 s until cut
            for sock in socks[30:40]:
                with contextlib.suppress(OSError):
                    sock.send(head[j : j + 1])
            time.sleep(0.1)
        for th in good:
            th.join(60)
        deadline = time.monotonic() + 20
        while len(rec.episodes()) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        episodes = rec.episodes()
        for c in range(4):
            for k in range(4):
                ep = episodes[(c, k)]  # every good episode, exactly, in order
                assert ep["obs"][:, 2].tolist() == list(range(8))
                assert ep["rewards"].tolist() == [float(t + 1) for t in range(8)]
        assert rec.server.disconnects >= 45  # every hostile connection was cut
        health = PolicyClient(url).health()
        assert health["ok"] is True and health["connections"] < 10
        for sock in socks:
            sock.close()
    finally:
        rec.server.stop()
        rec.thread.join(10)
