"""Faults a served client can cause, and what the server does: refuse the request, keep
serving everyone else, tell the truth in ``/v1/health``, and lose nothing it answered 200."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from server_probes import raw_post, sample_forever

import rlconnect as rc
from machine_speed import scaled, wait_until
from rlconnect.envs import BadObservationError, TooManyEpisodesError
from rlconnect.serve import (
    PolicyClient,
    PolicyServer,
    RequestTooLargeError,
    RunnerFailedError,
    ServerBusyError,
    ServingEnv,
)
from rlconnect.serve.wire import encode

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


class Sampling:
    """A server whose runner samples whole episodes in a thread, keeping the batches."""

    def __init__(self, server: PolicyServer) -> None:
        self.server = server
        self.batches: list[rc.SampleBatch] = []
        self.errors: list[BaseException] = []  # what ended sampling other than a stop
        self.thread = sample_forever(server, self.batches, self.errors)

    @property
    def error(self) -> BaseException | None:
        return self.errors[0] if self.errors else None

    def rows(self, n: int, timeout: float = 20.0) -> rc.SampleBatch:
        deadline = time.monotonic() + timeout
        while sum(len(b) for b in self.batches) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return rc.concat_samples(list(self.batches))

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)


def serve(**kwargs) -> Sampling:
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
    policy = rc.MLPPolicy(OBS, ACT, hiddens=(8,), seed=0)
    return Sampling(PolicyServer(policy, "127.0.0.1", 0, config=config, **kwargs))


@pytest.fixture
def sampling() -> Iterator[Sampling]:
    s = serve(
        max_concurrent=8, max_episodes_per_client=2, client_key="token", request_timeout_s=0.5
    )
    yield s
    s.stop()


BAD = {
    "NaN": np.array([0, np.nan, 0], np.float32),
    "inf": np.array([0, 0, np.inf], np.float64),
    "out of bounds": np.array([0, 1e6, 0], np.float32),
    "bools": np.array([True, False, True]),
    "floats far outside float32": np.array([0, 1e300, 0]),
}


def test_bad_observations_are_refused_and_the_episode_goes_on(sampling: Sampling) -> None:
    client = PolicyClient(sampling.server.url)
    eid = client.start_episode()
    sent = []
    for what, obs in BAD.items():
        with pytest.raises(BadObservationError):
            client.get_action(eid, obs)
        good = np.array([len(sent), 1.0, 2.0], np.float32)
        sent.append(good)
        assert ACT.contains(int(client.get_action(eid, good, reward=1.0))), what
    client.end_episode(eid, np.zeros(3, np.float32))
    batch = sampling.rows(len(sent))
    np.testing.assert_array_equal(batch["obs"], np.stack(sent))  # nothing bad recorded
    assert batch["rewards"].tolist() == [1.0] * (len(sent) - 1) + [0.0]
    health = client.health()
    assert health["ok"] is True and health["problem"] is None
    assert sampling.error is None


def test_one_connection_cannot_take_every_lane(sampling: Sampling) -> None:
    greedy, other = PolicyClient(sampling.server.url), PolicyClient(sampling.server.url)
    held = [greedy.start_episode() for _ in range(2)]
    with pytest.raises(TooManyEpisodesError, match="max_episodes_per_client=2"):
        greedy.start_episode()
    eid = other.start_episode()  # the others still get lanes
    other.end_episode(eid, np.zeros(3, np.float32))
    greedy.end_episode(held[0], np.zeros(3, np.float32))
    greedy.start_episode()  # an ended episode gives its share back


def test_a_full_queue_answers_503_before_taking_a_report() -> None:
    """Back-pressure: a report that does not fit is refused whole (and retried by the
    client); what was answered 200 reaches a batch once the runner samples."""
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
    policy = rc.MLPPolicy(OBS, ACT, hiddens=(8,), seed=0)
    server = PolicyServer(policy, "127.0.0.1", 0, config=config, max_queued_steps=6)
    client = PolicyClient(server.url, retry_timeout_s=0.3)
    eid = client.start_episode()
    step = ["log_action", {"episode_id": eid, "obs": np.zeros(3, np.float32), "action": 1}]
    client._http.call("report", {"commands": [step] * 4})  # fits: 4 of 6
    with pytest.raises(ServerBusyError, match="QueueFullError"):  # nothing samples yet
        client._http.call("report", {"commands": [step] * 4})
    assert server.env.hub.queued == 4  # refused whole: nothing of it was queued
    client.end_episode(eid, np.zeros(3, np.float32))
    s = Sampling(server)
    try:
        assert len(s.rows(4)) == 4
    finally:
        s.stop()


def trickle(sock: socket.socket, payload: bytes, interval: float) -> bool:
    """Send ``payload`` a byte per ``interval``; False once the server has cut the
    connection, True if all of it went through."""
    try:
        for byte in payload:
            sock.send(bytes([byte]))
            time.sleep(interval)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def test_a_trickling_request_is_cut_at_its_deadline(sampling: Sampling) -> None:
    """Whole-request deadline: a byte every 0.1 s (well within the 10 s stall timeout)
    never completes a request of ~160 bytes, which takes ~16 s, within the 0.5 s
    ``request_timeout_s``: the server cuts it before it is all sent."""
    data = encode({"episode_id": "x", "obs": np.zeros(3, np.float32)})
    head = (
        "POST /v1/get_action HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    address = (sampling.server.address, sampling.server.port)
    with socket.create_connection(address, scaled(10)) as sock:
        assert not trickle(sock, head + data, 0.1)  # cut before it was all sent
    assert wait_until(lambda: sampling.server.disconnects == 1)
    assert PolicyClient(sampling.server.url).health()["ok"] is True


def test_hundreds_of_connections_wait_in_the_backlog(sampling: Sampling) -> None:
    socks, connect_s = [], scaled(10)  # each connect waits at most this (a refusal raises)
    try:
        for _ in range(300):
            socks.append(socket.create_connection(("127.0.0.1", sampling.server.port), connect_s))
        assert PolicyClient(sampling.server.url).health()["ok"] is True
    finally:
        for sock in socks:
            sock.close()


def test_bodies_and_ids_are_bounded() -> None:
    s = serve(max_body_bytes=1000, max_body_bytes_per_peer=2000)  # all on one address
    try:
        client = PolicyClient(s.server.url, max_body_bytes=10**6)
        eid = client.start_episode()
        with pytest.raises(RequestTooLargeError):  # the server's 413, typed
            client.log_returns(eid, 1.0, info={"blob": b"x" * 5000})
        with pytest.raises(RequestTooLargeError, match="at most 1000"):  # caught before sending
            PolicyClient(s.server.url, max_body_bytes=1000).log_returns(
                eid, 1.0, {"b": b"x" * 2000}
            )
        with pytest.raises(Exception, match="limited to 256 characters"):
            client.start_episode("e" * 257)
        # the body bytes that arrived share a budget of twice the limit
        head = (
            b"POST /v1/log_returns HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-msgpack\r\nContent-Length: 900\r\n\r\n"
        )
        open_ = [socket.create_connection(("127.0.0.1", s.server.port), 5) for _ in range(3)]
        for sock in open_[:2]:
            sock.sendall(head + b"x" * 899)
        deadline = time.monotonic() + 5
        while s.server._listener.body_bytes < 1800 and time.monotonic() < deadline:
            time.sleep(0.01)
        open_[2].sendall(head + b"xx")
        assert open_[2].recv(100).startswith(b"HTTP/1.1 503")
        health = client.health()
        assert health["ok"] is True and "body bytes" in health["refusing"]
        assert health["refused_for_capacity"] == 1
        for sock in open_:
            sock.close()
    finally:
        s.stop()


def test_many_episodes_in_one_request_are_recorded_exactly(sampling: Sampling) -> None:
    client = PolicyClient(sampling.server.url)
    other = PolicyClient(sampling.server.url)
    eids = [client.start_episode(), client.start_episode(), other.start_episode()]
    for t in range(3):
        obs = np.array([[i, t, 0] for i in range(3)], np.float32)
        actions = client.get_actions(eids, obs, rewards=None if t == 0 else [1.0, 2.0, 3.0])
        assert len(actions) == 3 and all(ACT.contains(int(a)) for a in actions)
    with pytest.raises(BadObservationError):  # one bad observation refuses all of them
        client.get_actions(eids, [np.zeros(3), np.full(3, np.nan), np.zeros(3)])
    for i, eid in enumerate(eids):
        client.end_episode(eid, np.zeros(3, np.float32)) if i < 2 else other.end_episode(
            eid, np.zeros(3, np.float32)
        )
    batch = sampling.rows(9)
    for i, ep in enumerate(sorted(batch.split_by_episode(), key=lambda e: e["obs"][0, 0])):
        assert ep["obs"][:, 1].tolist() == [0, 1, 2]  # in order, none repeated or lost
        assert ep["rewards"].tolist() == [i + 1.0, i + 1.0, 0.0]


class FailOnce(rc.Callbacks):
    def on_episode_end(self, **kwargs) -> None:
        raise RuntimeError("a callback bug")


def test_health_says_when_the_runner_has_failed() -> None:
    env = ServingEnv(ACT, OBS, 4)
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
    runner = rc.EnvRunner(env, rc.MLPPolicy(OBS, ACT, seed=0), config=config, callbacks=FailOnce())
    s = Sampling(PolicyServer(runner, "127.0.0.1", 0))
    try:
        client = PolicyClient(s.server.url)
        eid = client.start_episode()
        client.get_action(eid, np.zeros(3, np.float32))
        client.end_episode(eid, np.zeros(3, np.float32))
        deadline = time.monotonic() + 10
        while s.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        health = client.health()
        assert health["ok"] is False and "a callback bug" in health["problem"]
        with pytest.raises(RunnerFailedError, match="a callback bug"):  # nothing runs now
            client.start_episode()
        impatient = PolicyClient(s.server.url, retry_timeout_s=0.2)
        with pytest.raises(RunnerFailedError, match="a callback bug"):  # at once, not a 504
            impatient.get_action(eid, np.zeros(3, np.float32))
    finally:
        s.stop()


def test_a_loop_that_never_reads_metrics_keeps_only_the_latest(monkeypatch) -> None:
    from rlconnect.runner import bookkeeping

    monkeypatch.setattr(bookkeeping, "MAX_METRICS", 3)
    s = serve()
    try:
        client = PolicyClient(s.server.url)
        for k in range(5):
            eid = client.start_episode()
            client.get_action(eid, np.array([k, 0, 0], np.float32), None)
            client.end_episode(eid, np.zeros(3, np.float32))
        s.rows(5)
        records = s.server.runner.get_metrics()
        assert [r["episode_length"] for r in records] == [1, 1, 1]  # 3 kept, not 5
    finally:
        s.stop()


def test_multi_agent_episodes_with_rewards_and_many_per_request() -> None:
    from rlconnect.serve import ServingMultiAgentEnv

    env = ServingMultiAgentEnv(ACT, OBS, 8)
    runner = rc.EnvRunner(
        env,
        {"pa": rc.MLPPolicy(OBS, ACT, seed=0), "pb": rc.MLPPolicy(OBS, ACT, seed=1)},
        policy_mapping_fn=lambda agent, episode, **kw: "p" + agent,
        config=rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1),
    )
    s = Sampling(PolicyServer(runner, "127.0.0.1", 0))
    try:
        client = PolicyClient(s.server.url)
        eids = [client.start_episode(), client.start_episode()]
        for t in range(3):
            obs = [
                {"a": np.array([i, t, 0], np.float32), "b": np.array([i, t, 1], np.float32)}
                for i in range(2)
            ]
            rewards = None if t == 0 else [{"a": 1.0, "b": 2.0}] * 2
            actions = client.get_actions(eids, obs, rewards)
            assert [set(a) for a in actions] == [{"a", "b"}] * 2
        single = client.get_action(eids[0], {"a": np.zeros(3, np.float32)}, {"a": 1.0, "b": 2.0})
        assert set(single) == {"a"}
        for eid in eids:
            client.end_episode(eid, {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)})
        deadline = time.monotonic() + 20
        while sum(b.env_steps() for b in s.batches) < 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        a = rc.concat_samples([b.policy_batches["pa"] for b in s.batches])
        pb = rc.concat_samples([b.policy_batches["pb"] for b in s.batches])
        assert len(a) == 7 and len(pb) == 6
        # b's reward sent with a's last action is held until b's episode ends
        assert sorted(pb["rewards"].tolist()) == [0.0, 2.0, 2.0, 2.0, 2.0, 2.0]
        assert sorted(a["rewards"].tolist()) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    finally:
        s.stop()


def test_a_client_that_expects_100_continue_gets_it(sampling: Sampling) -> None:
    """As curl does for bodies above 1 KB: it sends the body only after ``100 Continue``."""
    data = encode({})
    head = (
        "POST /v1/health HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-msgpack\r\n"
        f"Expect: 100-continue\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    with socket.create_connection((sampling.server.address, sampling.server.port), 5) as sock:
        sock.sendall(head)
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(data)
        assert sock.recv(1000).startswith(b"HTTP/1.1 200 OK")


def test_bad_logged_actions_are_refused_and_sampling_goes_on(sampling: Sampling) -> None:
    from rlconnect.envs import BadActionError

    client = PolicyClient(sampling.server.url)
    eid = client.start_episode()
    for bad in (7, -1, 1.5, "x", [1, 2], None):  # each would have stopped the runner
        with pytest.raises(BadActionError, match="does not fit Discrete"):
            client.log_action(eid, np.zeros(3, np.float32), bad)
    client.log_action(eid, np.ones(3, np.float32), 1)
    client.end_episode(eid, np.zeros(3, np.float32))
    batch = sampling.rows(1)
    assert batch["actions"].tolist() == [1] and sampling.error is None


class PoisonedPolicy(rc.MLPPolicy):
    """Raises on an observation whose first value is 9: the step asking fails midway, so
    its get_action is in flight when the runner fails."""

    def compute_actions(self, input_batch, explore=True):
        if (np.asarray(input_batch["obs"])[:, 0] == 9).any():
            raise RuntimeError("a policy bug")
        return super().compute_actions(input_batch, explore)


def test_after_the_runner_fails_every_call_answers_503_at_once() -> None:
    """Regression: after the runner failed, start_episode, log_action, log_returns,
    end_episode and report were answered 200 and recorded nothing, and a get_action in
    flight waited the whole get_action_timeout_s for a 504. Now each is a prompt 503
    ``RunnerFailed`` naming the failure, which the client raises without retrying."""
    env = ServingEnv(ACT, OBS, 4)
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
    runner = rc.EnvRunner(env, PoisonedPolicy(OBS, ACT, seed=0), config=config)
    timeout_s = 30.0  # a call that waited for it would answer 504 (or 503) only after it
    server = PolicyServer(
        runner, "127.0.0.1", 0, get_action_timeout_s=timeout_s, max_episodes_per_client=4
    )
    s = Sampling(server)
    try:
        client = PolicyClient(s.server.url)
        first = client.start_episode()
        client.get_action(first, np.zeros(3, np.float32))
        second = client.start_episode()
        start = time.monotonic()
        with pytest.raises(RunnerFailedError, match="a policy bug"):
            client.get_action(second, np.array([9, 0, 0], np.float32))  # in flight
        assert time.monotonic() - start < timeout_s  # the failure answered it, not the timeout
        obs = np.zeros(3, np.float32)
        calls = {
            "start_episode": lambda: client.start_episode(),
            "log_action": lambda: client.log_action(first, obs, 1),
            "log_returns": lambda: client.log_returns(first, 1.0),
            "end_episode": lambda: client.end_episode(first, obs),
            "report": lambda: client._http.call("report", {"commands": []}),
            "get_action": lambda: client.get_action(first, obs),
            "weights": lambda: client._http.call("weights", {}),
        }
        for name, call in calls.items():
            start = time.monotonic()
            with pytest.raises(RunnerFailedError, match="a policy bug") as info:
                call()
            assert info.value.status == 503 and time.monotonic() - start < timeout_s, name
        assert client._http.retries == 0  # each was refused at once: none retried
        health = client.health()
        assert health["ok"] is False and "a policy bug" in health["problem"]
    finally:
        s.stop()


def test_a_report_that_can_never_fit_is_413_at_once() -> None:
    """Regression: a report of more commands than ``max_queued_steps`` got "503, retry"
    forever; now a prompt 413 saying it can never fit."""
    s = serve(max_queued_steps=6)
    try:
        client = PolicyClient(s.server.url, retry_timeout_s=30.0)
        eid = client.start_episode()
        step = ["log_action", {"episode_id": eid, "obs": np.zeros(3, np.float32), "action": 1}]
        with pytest.raises(RequestTooLargeError, match="can never fit; send at most 6"):
            client._http.call("report", {"commands": [step] * 7})
        assert client._http.retries == 0  # refused at once, never retried
        assert s.server.env.hub.queued == 0  # nothing of it was taken
    finally:
        s.stop()


def test_a_non_finite_reward_is_422_like_a_non_finite_observation() -> None:
    """Regression: a NaN reward got 409 (the status of a duplicate episode id)."""
    s = serve()
    try:
        client = PolicyClient(s.server.url)
        eid = client.start_episode()
        for bad in (float("nan"), float("inf")):
            with pytest.raises(rc.envs.BadRewardError, match="not finite"):
                client.log_returns(eid, bad)
            with pytest.raises(rc.envs.BadRewardError, match="not finite"):
                client.get_action(eid, np.zeros(3, np.float32), reward=bad)
        status, out = raw_post(s.server.port, "log_returns", {"episode_id": eid, "reward": np.nan})
        assert status == 422 and out["error"] == "BadRewardError"
        client.get_action(eid, np.zeros(3, np.float32), reward=1.0)  # the episode goes on
        client.end_episode(eid, np.zeros(3, np.float32))
        assert s.rows(1)["rewards"].tolist() == [0.0]
    finally:
        s.stop()
