"""Server hardening: Content-Type, complex observations, runner work only
between sampling steps."""

from __future__ import annotations

import os
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from server_probes import raw_post, sample_forever

import rlconnect as rc
from rlconnect.checkpoints.files import MAX_FILE_BYTES
from rlconnect.envs import BadObservationError
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve.tasks import RunnerUnavailable
from rlconnect.serve.wire import encode

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


class SlowPolicy(rc.RandomPolicy):
    """Takes ``delay`` s per step when ``slow`` is set; records where ``get_weights`` ran
    and whether a step was in flight then."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow = threading.Event()
        self.delay = 0.0
        self.in_step = False
        self.step_started = threading.Event()
        self.weights_calls: list[tuple[str, bool]] = []

    def compute_actions(self, input_batch, explore=True):
        self.in_step = True
        self.step_started.set()
        try:
            if self.slow.is_set():
                time.sleep(self.delay)
            return super().compute_actions(input_batch, explore)
        finally:
            self.in_step = False

    def get_weights(self):
        self.weights_calls.append((threading.current_thread().name, self.in_step))
        return super().get_weights()


def test_bodies_that_are_not_declared_msgpack_get_415_and_the_client_keeps_working():
    server = PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    sampler = sample_forever(server)
    try:
        body = encode({})
        for content_type in (None, "text/plain", "application/json", "multipart/form-data"):
            status, out = raw_post(server.port, "start_episode", body, content_type)
            assert status == 415, content_type
            assert out["error"] == "UnsupportedMediaType"
            assert "Content-Type: application/x-msgpack" in out["message"]
        assert server.env.num_running_episodes == 0  # nothing was started
        for content_type in ("application/x-msgpack", "application/msgpack; charset=binary"):
            status, out = raw_post(server.port, "start_episode", body, content_type)
            assert status == 200, (content_type, out)
        client = PolicyClient(server.url)
        eid = client.start_episode()
        assert ACT.contains(int(client.get_action(eid, np.zeros(3, np.float32))))
        client.end_episode(eid, np.zeros(3, np.float32))
        client.close()
    finally:
        server.stop()
        sampler.join(10)


def test_complex_observations_are_rejected_not_cast_to_real():
    server = PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    sampler = sample_forever(server)
    try:
        client = PolicyClient(server.url)
        eid = client.start_episode()
        for bad, what in (
            (np.array([1 + 2j, 0, 0], np.complex64), "complex numbers"),
            (["1", "2", "3"], "dtype kind 'U'"),
        ):
            with pytest.raises(BadObservationError, match=what):
                client.get_action(eid, bad)
            with pytest.raises(BadObservationError, match=what):
                client.log_action(eid, bad, 0)
        # nothing was recorded: the episode goes on from a real observation
        assert ACT.contains(int(client.get_action(eid, np.ones(3, np.float32))))
        client.end_episode(eid, np.ones(3, np.float32))
        client.close()
    finally:
        server.stop()
        sampler.join(10)


def test_runner_work_never_runs_beside_a_step_in_flight():
    """A weights request that arrives while a step takes longer than the old 2 s fallback
    is done by the sampling thread after that step, never on the HTTP thread during it."""
    policy = SlowPolicy(OBS, ACT, seed=0)
    server = PolicyServer(policy, "127.0.0.1", 0, get_action_timeout_s=30.0)
    sampler = sample_forever(server)
    try:
        client = PolicyClient(server.url)
        eid = client.start_episode()
        client.get_action(eid, np.zeros(3, np.float32))  # the runner is sampling
        policy.delay = 4.0
        policy.slow.set()
        policy.step_started.clear()
        acting = threading.Thread(
            target=client.get_action, args=(eid, np.ones(3, np.float32)), daemon=True
        )
        acting.start()
        assert policy.step_started.wait(10) and policy.in_step
        start = time.monotonic()
        out = server.handle("weights", {})
        waited = time.monotonic() - start
        acting.join(10)
        assert "weights" in out
        assert policy.weights_calls == [("sampler", False)]  # after the step, on its thread
        assert waited > 2.0  # it waited for the step to end (the old code ran it at 2 s)
    finally:
        policy.slow.clear()
        server.stop()
        sampler.join(10)


def test_runner_work_with_nothing_sampling_is_a_503_and_is_withdrawn():
    policy = SlowPolicy(OBS, ACT, seed=0)
    server = PolicyServer(policy, "127.0.0.1", 0, get_action_timeout_s=0.3)
    try:
        with pytest.raises(RunnerUnavailable, match=r"weights: the runner took no step within"):
            server.handle("weights", {})
        status, out = raw_post(server.port, "checkpoint", {})
        assert status == 503 and out["error"] == "RunnerUnavailable"
        assert "server.runner.sample()" in out["message"]
        assert policy.weights_calls == []  # not run off the sampling thread
        sampler = sample_forever(server)
        client = PolicyClient(server.url)
        eid = client.start_episode()
        client.get_action(eid, np.zeros(3, np.float32))
        client.end_episode(eid, np.zeros(3, np.float32))
        assert policy.weights_calls == []  # withdrawn: a later step does not run it either
        assert "weights" in server.handle("weights", {})  # now sampling: served
        assert policy.weights_calls == [("sampler", False)]
        client.close()
    finally:
        server.stop()
    sampler.join(10)


def test_a_checkpoint_file_over_the_limit_is_refused_unread_and_the_server_goes_on():
    """The checkpoint endpoint reads each file of the runner's checkpoint bounded
    (``MAX_FILE_BYTES``): a sparse giant beside it is a 500 naming the file and the limit,
    answered without reading its 4 GiB, and the server still serves."""
    server = PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0)
    save = server.runner.save_checkpoint

    def save_with_a_giant(path):
        save(path)
        with open(os.path.join(path, "giant.bin"), "wb") as f:
            f.truncate(MAX_FILE_BYTES + 1)

    server.runner.save_checkpoint = save_with_a_giant
    sampler = sample_forever(server)
    try:
        status, out = raw_post(server.port, "checkpoint", {})
        assert status == 500 and out["error"] == "CheckpointError"
        assert "giant.bin" in out["message"] and f"{MAX_FILE_BYTES:,}" in out["message"]
        server.runner.save_checkpoint = save
        status, out = raw_post(server.port, "checkpoint", {})
        assert status == 200 and "manifest.json" in out["files"]
    finally:
        server.stop()
    sampler.join(10)
