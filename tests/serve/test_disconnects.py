"""Clients that vanish mid-request are counted quietly; the server keeps serving."""

from __future__ import annotations

import socket
import struct
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve.wire import encode

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


@pytest.fixture
def server():
    srv = PolicyServer(rc.MLPPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, episode_timeout_s=5.0)

    def sample() -> None:
        while True:
            try:
                srv.runner.sample()
            except EnvError:  # stopped
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    yield srv
    srv.stop()
    sampler.join(10)


def post_and_reset(srv: PolicyServer, body: dict, half: bool) -> None:
    """POST get_action on a new socket, then reset it (RST) before any answer."""
    data = encode(body)
    head = (
        f"POST /v1/get_action HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((srv.address, srv.port), timeout=5) as sock:
        sock.sendall(head + (data[: len(data) // 2] if half else data))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("half", [True, False], ids=["mid-body", "before-answer"])
def test_a_reset_connection_is_counted_not_printed(server, capfd, half):
    client = PolicyClient(server.url)
    eid = client.start_episode()
    post_and_reset(server, {"episode_id": eid, "obs": np.zeros(3, np.float32)}, half)
    deadline = time.monotonic() + 10
    while server._httpd.disconnects < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server._httpd.disconnects == 1
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err
    # the server still serves: a new episode runs to its end
    eid = client.start_episode()
    assert ACT.contains(int(client.get_action(eid, np.ones(3, np.float32))))
    client.end_episode(eid, np.ones(3, np.float32))
    client.close()
