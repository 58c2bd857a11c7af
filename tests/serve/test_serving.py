"""PolicyServer / PolicyClient over real loopback HTTP, the client in another process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from server_probes import sample_forever

import rlconnect as rc
from rlconnect.serve import PolicyClient, PolicyServer
from rlconnect.serve.wire import WireError, decode, encode

CLIENT = Path(__file__).with_name("client_proc.py")
OBS = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT = gym.spaces.Discrete(3)


class Served:
    """A PolicyServer on 127.0.0.1 whose runner samples whole episodes in a thread."""

    def __init__(self, port: int = 0, **kwargs) -> None:
        # one client process runs up to 50 episodes at once here: no share to hit
        kwargs.setdefault("max_episodes_per_client", 100)
        self.policy = rc.MLPPolicy(OBS, ACT, seed=0)
        config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
        self.server = PolicyServer(self.policy, "127.0.0.1", port, config=config, **kwargs)
        self.batches: list[rc.SampleBatch] = []
        self._thread = sample_forever(self.server, self.batches)

    def episodes(self, n: int, timeout: float = 30.0) -> dict[int, rc.SampleBatch]:
        """The first ``n`` recorded episodes, keyed by the client's episode number."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = {}
            for b in list(self.batches):
                for ep in b.split_by_episode():
                    got[int(ep["obs"][0, 0])] = ep
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"only {len(got)} of {n} episodes recorded in {timeout} s")

    def stop(self) -> None:
        self.server.stop()
        self._thread.join(10)


@pytest.fixture
def served():
    s = Served(episode_timeout_s=1.0)
    yield s
    s.stop()


def run_client(**args) -> dict:
    out = subprocess.run(
        [sys.executable, str(CLIENT), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_rows(batch: rc.SampleBatch, sent: dict) -> None:
    """The recorded episode is exactly what the client sent, row by row."""
    steps = sent["steps"]
    assert len(batch) == len(steps)
    np.testing.assert_array_equal(batch["obs"], np.asarray([s[0] for s in steps], np.float32))
    np.testing.assert_array_equal(batch["actions"], [s[1] for s in steps])
    np.testing.assert_allclose(batch["rewards"], [s[2] for s in steps])
    np.testing.assert_array_equal(batch["new_obs"][-1], np.asarray(sent["final"], np.float32))
    np.testing.assert_array_equal(batch["new_obs"][:-1], batch["obs"][1:])
    assert batch["terminateds"].tolist() == [False] * (len(steps) - 1) + [True]
    assert np.isfinite(batch["action_logp"]).all()


def test_wire_round_trip_and_rejects_garbage():
    msg = {"obs": np.arange(6, dtype=np.float32).reshape(2, 3), "t": (1, np.int64(2)), "s": "x"}
    back = decode(encode(msg))
    np.testing.assert_array_equal(back["obs"], msg["obs"])
    assert back["obs"].dtype == np.float32 and back["t"] == (1, 2) and back["s"] == "x"
    with pytest.raises(WireError):
        decode(b"\xc1")
    with pytest.raises(TypeError, match="dtype object"):
        encode(np.array([object()]))


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_batches_hold_exactly_what_the_client_sent(served, mode):
    sent = run_client(scenario="episodes", url=served.server.url, mode=mode, episodes=6)
    got = served.episodes(6)
    assert sorted(got) == list(range(6))
    for rec in sent["episodes"]:
        check_rows(got[rec["k"]], rec)
    logged = np.concatenate([ep["obs"][:, 1] % 2 == 1 for ep in got.values()])
    actions = np.concatenate([ep["actions"] for ep in got.values()])
    assert (actions[logged] == 2).all()


@pytest.mark.slow
def test_fifty_concurrent_episodes(served):
    sent = run_client(scenario="episodes", url=served.server.url, episodes=50, threads=50)
    got = served.episodes(50)
    assert len(sent["episodes"]) == 50
    for rec in sent["episodes"]:
        check_rows(got[rec["k"]], rec)


def test_a_vanished_client_is_closed_truncated_and_nothing_else_is_lost(served):
    out = run_client(scenario="vanish", url=served.server.url)
    assert out["started"] == "vanishing"
    sent = run_client(scenario="episodes", url=served.server.url, episodes=2, length=3)
    got = served.episodes(3)
    lost = got[99]
    assert lost["truncateds"].tolist() == [False, False, True]
    assert lost["infos"][-1]["episode_timeout"] is True
    assert served.server.env.timed_out_episodes == ["vanishing"]
    for rec in sent["episodes"]:
        check_rows(got[rec["k"]], rec)


def test_bad_requests_get_4xx_and_the_server_keeps_serving(served):
    res = run_client(scenario="bad", url=served.server.url)
    expect = {
        "garbage": (400, "WireError"),
        "not_a_map": (400, "BadRequest"),
        "missing": (400, "BadRequest"),
        "no_endpoint": (404, "NotFound"),
        "unknown_eid": (404, "UnknownEpisodeError"),
        "bad_shape": (422, "BadObservationError"),
        "bad_reward": (422, "BadRewardError"),
        "duplicate": (409, "EpisodeError"),
    }
    for key, (status, kind) in expect.items():
        got_status, body = res[key]
        assert (got_status, body["error"]) == (status, kind), (key, body)
        assert body["message"]
    assert "shape (5,)" in res["bad_shape"][1]["message"]
    check_rows(served.episodes(1)[7], res["after"])


def test_max_concurrent_exceeded_is_a_clear_error():
    s = Served(max_concurrent=3, max_episodes_per_client=4)
    try:
        res = run_client(scenario="too_many", url=s.server.url, max_concurrent=3)
    finally:
        s.stop()
    assert "max_concurrent=3" in res["error"]


@pytest.mark.slow
def test_clients_retry_through_a_server_restart():
    first = Served()
    port = first.server.port
    proc = subprocess.Popen(
        [
            sys.executable,
            str(CLIENT),
            json.dumps({"scenario": "restart", "url": first.server.url, "episodes": 6}),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = None
    try:
        for _ in range(2):  # two episodes done on the first server
            assert "done" in proc.stdout.readline()
        first.stop()
        line = ""
        while "retrying" not in line:  # the client reports its first failed request
            line = proc.stdout.readline()
            assert line, "the client ended before it retried"
        second = Served(port=port)
        restarted = time.time()
        out, err = proc.communicate(timeout=40)
        assert proc.returncode == 0, err[-3000:]
        res = json.loads(out.strip().splitlines()[-1])
        assert len(res["episodes"]) == 6 and res["retries"] > 0
        later = [rec for rec in res["episodes"] if rec["started"] > restarted]
        assert len(later) >= 2  # new episodes resumed on the restarted server
        got = second.episodes(len(later))
        for rec in later:
            check_rows(got[rec["k"]], rec)
    finally:
        proc.kill()
        if second is not None:
            second.stop()


def test_server_needs_an_external_runner():
    env = gym.make("CartPole-v1")
    runner = rc.EnvRunner(env, rc.RandomPolicy(env.observation_space, env.action_space))
    with pytest.raises(TypeError, match="ExternalEnv"):
        PolicyServer(runner, "127.0.0.1", 0)


def test_in_process_client_and_health(served):
    client = PolicyClient(served.server.url)
    info = client.health()
    assert info["ok"] and info["max_concurrent"] == 100
    eid = client.start_episode(training_enabled=False)
    assert ACT.contains(int(client.get_action(eid, np.zeros(3, np.float32))))
    client.end_episode(eid, np.zeros(3, np.float32))
    client.close()
