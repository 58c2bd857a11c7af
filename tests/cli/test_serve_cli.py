"""``rlconnect serve POLICY_FILE``: an exported policy answered over HTTP, as a user runs
it (a subprocess on 127.0.0.1, stopped by a signal)."""

from __future__ import annotations

import signal
import subprocess
import sys

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.cli import main
from rlconnect.serve import PolicyClient

from .conftest import user_env


@pytest.mark.slow
def test_serve_answers_the_exported_policys_actions_and_stops_on_a_signal(tmp_path):
    env = gym.make("CartPole-v1")
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(env.observation_space, env.action_space, seed=0),
        config=rc.RunnerConfig(rollout_fragment_length=20, observation_filter="MeanStdFilter"),
    )
    runner.sample()
    path = tmp_path / "cartpole.policy"
    rc.export_policy(runner, path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlconnect", "serve", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(),
    )
    try:
        first = proc.stdout.readline()  # blocks until it listens (or the process ends)
        assert first.startswith(f"serving {path} at http://127.0.0.1:"), first
        url = first.split(" at ")[1].split()[0]
        client = PolicyClient(url, retry_timeout_s=30)
        assert client.health()["ok"] is True
        deployed = rc.load_policy(path)
        eid = client.start_episode()
        obs, _ = env.reset(seed=0)
        for _ in range(10):  # a bounded episode: the served actions are the file's own
            action = client.get_action(eid, obs)
            assert action == deployed.compute_action(obs, session="twin")
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        client.end_episode(eid, obs)
        client.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip().endswith("stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_serve_refuses_a_missing_file_and_a_damaged_one_with_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nope.policy")]) == 2
    assert "is not a file" in capsys.readouterr().err
    bad = tmp_path / "bad.policy"
    bad.write_bytes(b"not a policy file" * 10)
    assert main(["serve", str(bad), "--port", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CheckpointError" in err, err
