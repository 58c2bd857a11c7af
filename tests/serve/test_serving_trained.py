"""Serving what was trained, as a user does: ``PolicyServer(rc.load_policy(path))`` serves
the exported policy exactly (its actions equal ``DeployedPolicy.compute_action`` with a
session per episode), and ``PolicyServer.from_checkpoint(path)`` goes on training a run.

The simulator is a CartPole played by a ``PolicyClient`` in another process, as in
deployment; the server and the check run here.
"""

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
from rlconnect.serve import BadRequestError, PolicyClient, PolicyServer

#: a simulator process: CartPole episodes played against the server, each step's
#: observation, the reward sent with it and the action that came back, as JSON
SIMULATOR = """
import json, sys
import gymnasium as gym
from rlconnect.serve import PolicyClient

url, episodes = sys.argv[1], int(sys.argv[2])
client = PolicyClient(url)
env = gym.make("CartPole-v1")
played = []
for k in range(episodes):
    obs, _ = env.reset(seed=100 + k)
    eid = client.start_episode()
    steps, reward, done = [], None, False
    while not done and len(steps) < 60:
        action = int(client.get_action(eid, obs, reward))
        steps.append([obs.tolist(), reward, action])
        obs, reward, term, trunc, _ = env.step(action)
        reward, done = float(reward), term or trunc
    client.log_returns(eid, reward)
    client.end_episode(eid, obs)
    played.append(steps)
print(json.dumps(played))
"""


def play(url: str, episodes: int) -> list:
    out = subprocess.run(
        [sys.executable, "-c", SIMULATOR, url, str(episodes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A CartPole run with a MeanStdFilter, sampled a little, checkpointed and exported."""
    root = tmp_path_factory.mktemp("trained")
    config = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=50, observation_filter="MeanStdFilter", seed=0
    )
    cartpole = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(cartpole.observation_space, cartpole.action_space, seed=0)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    for _ in range(3):
        runner.sample()
    runner.save_checkpoint(root / "checkpoint")
    rc.export_policy(runner, root / "cartpole.policy")
    return root


def test_a_deployed_policy_is_served_exactly_as_exported(trained: Path) -> None:
    """Regression: ``PolicyServer(rc.load_policy(path))`` raised TypeError, and the runner
    route explored and kept learning its filter. Now every served action equals
    ``compute_action`` of the same file, one session per episode."""
    server = PolicyServer(rc.load_policy(trained / "cartpole.policy"), "127.0.0.1", 0)
    try:
        assert server.runner is None
        played = play(server.url, 3)
        health = PolicyClient(server.url).health()
        assert health["ok"] is True and health["running_episodes"] == 0
    finally:
        server.stop()
    reference = rc.load_policy(trained / "cartpole.policy")
    compared = 0
    for k, steps in enumerate(played):
        for obs, reward, action in steps:
            expected = reference.compute_action(np.array(obs, np.float32), session=k, reward=reward)
            assert int(expected) == action
            compared += 1
        reference.end_session(k)
    assert compared >= 20 and len(played) == 3


def test_a_deployed_server_records_nothing_and_says_so(trained: Path) -> None:
    server = PolicyServer(rc.load_policy(trained / "cartpole.policy"), "127.0.0.1", 0)
    try:
        client = PolicyClient(server.url)
        eid = client.start_episode()
        with pytest.raises(BadRequestError, match="records nothing"):
            client.log_action(eid, np.zeros(4, np.float32), 1)
        with pytest.raises(rc.envs.BadObservationError):
            client.get_action(eid, np.full(4, np.nan, np.float32))
        with pytest.raises(rc.envs.BadRewardError):
            client.get_action(eid, np.zeros(4, np.float32), reward=float("nan"))
        client.get_action(eid, np.zeros(4, np.float32))  # the episode goes on
        client.end_episode(eid, np.zeros(4, np.float32))
        with pytest.raises(rc.envs.UnknownEpisodeError, match="has ended"):
            client.get_action(eid, np.zeros(4, np.float32))
        with pytest.raises(BadRequestError, match="records nothing"):
            PolicyClient(server.url, inference_mode="local").start_episode()
    finally:
        server.stop()


def test_from_checkpoint_goes_on_training_the_run(trained: Path) -> None:
    """``PolicyServer.from_checkpoint`` rebuilds the run's runner on a serving env: served
    episodes fill its batches, and its filter keeps learning from them."""
    overrides = {"rollout_fragment_length": 1}  # every served step makes its batch now
    server = PolicyServer.from_checkpoint(
        trained / "checkpoint", "127.0.0.1", 0, config_overrides=overrides
    )
    batches: list[rc.SampleBatch] = []
    thread = sample_forever(server, batches)
    try:
        before = server.runner.get_connector_states()
        played = play(server.url, 2)
        steps = sum(len(s) for s in played)
        deadline = time.monotonic() + 30
        while sum(len(b) for b in batches) < steps and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(len(b) for b in batches) >= steps  # every served step is a row
        assert server.runner.get_connector_states() != before  # the filter learned
    finally:
        server.stop()
        thread.join(10)


def test_an_idle_deployed_session_is_ended_after_the_episode_timeout(trained: Path) -> None:
    policy = rc.load_policy(trained / "cartpole.policy")
    server = PolicyServer(policy, "127.0.0.1", 0, episode_timeout_s=0.3)
    try:
        client = PolicyClient(server.url)
        eid = client.start_episode()
        client.get_action(eid, np.zeros(4, np.float32))
        deadline = time.monotonic() + 10
        while client.health()["running_episodes"] and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(rc.envs.UnknownEpisodeError, match="has ended"):
            client.get_action(eid, np.zeros(4, np.float32))
        while policy.sessions and time.monotonic() < deadline:  # its state is dropped
            time.sleep(0.05)
        assert policy.sessions == []
    finally:
        server.stop()
