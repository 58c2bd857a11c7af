"""The rlconnect command: sample prints a summary; inspect prints a saved pipeline."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym

import rlconnect as rc
from rlconnect.cli import main


def test_sample_prints_a_summary(capsys):
    assert main(["sample", "--steps", "600", "--num-envs", "2", "--fragment", "50", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rlconnect sample summary" in out
    assert "steps/s" in out and "mean return" in out
    assert "600" in out


def test_sample_with_filter_and_random_policy(capsys):
    argv = [
        "sample",
        "--steps",
        "200",
        "--num-envs",
        "1",
        "--fragment",
        "100",
        "--policy",
        "random",
        "--observation-filter",
        "MeanStdFilter",
        "--quiet",
    ]
    assert main(argv) == 0
    assert "episodes" in capsys.readouterr().out


def test_inspect_shows_members_and_statistics(tmp_path, capsys):
    env = gym.make("CartPole-v1")
    ctx = rc.ConnectorContext(
        env.observation_space, env.action_space, {"observation_filter": "MeanStdFilter"}
    )
    pipe = rc.default_agent_pipeline(ctx)
    path = tmp_path / "pipe"
    rc.save_pipeline(pipe, path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MeanStdFilter" in out and "float64[4]" in out
    path.write_bytes(b"garbage")
    assert main(["inspect", str(path)]) == 1
    assert "cannot load" in capsys.readouterr().err


def test_console_script_entry_point_runs():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlconnect.cli",
            "sample",
            "--steps",
            "100",
            "--num-envs",
            "1",
            "--fragment",
            "100",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "summary" in res.stdout
