"""Clients that vanish mid-request are counted quietly; the server keeps serving."""

from __future__ import annotations

import socket
import struct
import threading

import gymnasium as gym
import numpy as np
import pytest
from server_probes import sample_forever

import rlconnect as rc
from machine_speed import scaled, wait_until
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve.wire import encode

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture
def server():
    srv = PolicyServer(rc.MLPPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, episode_timeout_s=5.0)
    sampler = sample_forever(srv)
    yield srv
    srv.stop()
    sampler.join(10)


def post_and_reset(srv: PolicyServer, body: dict, half: bool) -> None:
    """POST get_action on a new socket, then reset it (RST) before any answer."""
    data = encode(body)
    head = (
        "POST /v1/get_action HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((srv.address, srv.port), timeout=5) as sock:
        sock.sendall(head + (data[: len(data) // 2] if half else data))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("half", [True, False], ids=["mid-body", "before-answer"])
def test_a_reset_connection_is_counted_not_printed(server, capfd, half):
    client = PolicyClient(server.url)
    eid = client.start_episode()
    post_and_reset(server, {"episode_id": eid, "obs": np.zeros(3, np.float32)}, half)
    assert wait_until(lambda: server.disconnects >= 1)
    assert server.disconnects == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err
    # the server still serves: a new episode runs to its end
    eid = client.start_episode()
    assert ACT.contains(int(client.get_action(eid, np.ones(3, np.float32))))
    client.end_episode(eid, np.ones(3, np.float32))
    client.close()


def test_a_silent_client_is_dropped_after_the_request_timeout(capfd):
    """A client that sends a Content-Length and then nothing does not hold a server
    thread forever: its connection is closed after ``request_timeout_s``, quietly (no
    stall timeout here: only the request timeout can close it)."""
    srv = PolicyServer(
        rc.MLPPolicy(OBS, ACT, seed=0),
        "127.0.0.1",
        0,
        request_timeout_s=0.3,
        stall_timeout_s=None,
    )
    try:
        with socket.create_connection((srv.address, srv.port), timeout=scaled(20)) as sock:
            sock.sendall(
                b"POST /v1/get_action HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                b"Content-Type: application/x-msgpack\r\n\r\n"
            )
            sock.sendall(b"0123456789")
            assert sock.recv(1024) == b""  # closed by the server, no answer
        assert wait_until(lambda: srv.disconnects == 1)
        assert PolicyClient(srv.url).health()["ok"] is True
    finally:
        srv.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_negative_content_length_is_a_bad_request():
    srv = PolicyServer(rc.MLPPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    try:
        with socket.create_connection((srv.address, srv.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/get_action HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 400")
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="request_timeout_s"):
        PolicyServer(rc.MLPPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, request_timeout_s=0)


def test_stopping_the_server_ends_sampling_with_an_env_error():
    """The serving env's thread can be asked whether it is alive after it stopped (its
    stop event must not shadow threading.Thread._stop), so sampling ends cleanly."""
    srv = PolicyServer(rc.MLPPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    raised: list[BaseException] = []
    sampling = threading.Event()

    def sample() -> None:
        try:
            while True:
                sampling.set()
                srv.runner.sample()
        except BaseException as exc:  # recorded for the assertion
            raised.append(exc)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert sampling.wait(10)
    srv.stop()  # whether sample() is waiting for episodes yet or not, it ends the same way
    sampler.join(10)
    assert not sampler.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], EnvError), raised
    srv.env.join(10)  # the serving env's thread ends on its own once stopped
    assert not srv.env.is_alive()
