"""``max_queued_steps`` holds on every route that queues steps (issue 55, item 2): remote
``log_action``, concurrent ``get_action`` on one episode, ``get_actions``, an
ExternalEnv's own thread."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from raw_load import close_all, read_answers, request_bytes, send_all
from server_probes import raw_post, sample_forever

import rlconnect as rc
from rlconnect.envs.external import NO_ACTION, EpisodeHub, HubLimits, QueueFullError
from rlconnect.serve import PolicyServer

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
BOUND = 16
TRIES = 48  # three times the bound, each on its own connection


def _server() -> PolicyServer:
    return PolicyServer(
        rc.RandomPolicy(OBS, ACT, seed=0),
        "127.0.0.1",
        0,
        max_concurrent=4,
        max_queued_steps=BOUND,
        get_action_timeout_s=30,
    )


def _queued(server: PolicyServer) -> int:
    return server.env.hub.counts()["queued"]


def test_concurrent_get_actions_on_one_episode_hold_the_bound():
    server = _server()  # nothing samples yet: every admitted step stays queued
    try:
        eid = raw_post(server.port, "start_episode", {})[1]["episode_id"]
        obs = np.zeros(3, np.float32)
        socks = send_all(
            server.port, [request_bytes("get_action", {"episode_id": eid, "obs": obs})] * TRIES
        )
        refused = read_answers(socks, 20, TRIES - BOUND)  # the refusals come at once
        statuses = [s for s, _ in refused if s is not None]
        assert statuses == [503] * (TRIES - BOUND)
        assert all("max_queued_steps" in b["message"] for s, b in refused if s)
        assert _queued(server) == BOUND
        sampler = sample_forever(server)
        waiting = [sock for sock, (s, _) in zip(socks, refused) if s is None]
        later = read_answers(waiting, 30, BOUND)  # the admitted ones are answered
        assert [s for s, _ in later] == [200] * BOUND
        close_all(socks)
    finally:
        server.stop()
    sampler.join(10)


def test_remote_log_action_holds_the_bound():
    server = _server()
    try:
        eid = raw_post(server.port, "start_episode", {})[1]["episode_id"]
        body = {"episode_id": eid, "obs": np.zeros(3, np.float32), "action": 1}
        statuses = [raw_post(server.port, "log_action", body)[0] for _ in range(TRIES)]
        assert statuses == [200] * BOUND + [503] * (TRIES - BOUND)
        assert _queued(server) == BOUND
        status, out = raw_post(
            server.port,
            "get_actions",
            {"episode_ids": [eid], "obs": [np.zeros(3, np.float32)]},
        )
        assert status == 503 and out["error"] == "QueueFullError"
        assert _queued(server) == BOUND
    finally:
        server.stop()


def test_a_simulator_thread_waits_for_room_then_gets_queue_full():
    hub = EpisodeHub(
        lambda a: OBS, 2, lambda a: ACT, HubLimits(max_queued_steps=2, get_action_timeout_s=0.3)
    )
    eid = hub.start(None, True)
    obs = {0: np.zeros(3, np.float32)}
    for _ in range(2):
        hub.observe(eid, obs, {0: 1})
    with pytest.raises(QueueFullError, match="max_queued_steps"):
        hub.observe(eid, obs, {0: 1})  # waited get_action_timeout_s, nobody took any
    assert hub.queued == 2
    done = threading.Event()

    def third() -> None:
        hub.observe(eid, obs, {0: 1})
        done.set()

    thread = threading.Thread(target=third, daemon=True)
    thread.start()
    taken: list = []
    while not done.is_set() and len(taken) < 50:  # the runner's polls make room
        taken += hub.take_batch(0.05, lambda: True)[0]
    thread.join(5)
    assert done.is_set() and hub.queued + len(taken) == 3
    hub.observe(eid, obs, NO_ACTION, kind="end")  # an end always fits
