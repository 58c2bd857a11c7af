"""``rlconnect sample --log-dir DIR`` (JSON lines, CSV, TensorBoard event files, one record
per batch) and the merged ``metrics`` in ``run.json`` (issue 54), as a user runs them."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from tests.cli.conftest import run_cli

HERE = Path(__file__).resolve().parent


def test_log_dir_and_run_json_hold_the_runs_metrics(tmp_path: Path) -> None:
    shutil.copy(HERE / "user_envs.py", tmp_path / "my_envs.py")
    args = ["--env", "my_envs:duel", "--num-envs", "2", "--steps", "400", "--fragment", "50"]
    done = run_cli("sample", *args, "--quiet", "--out", "run", "--log-dir", "logs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    logs = tmp_path / "logs"
    lines = [json.loads(x) for x in (logs / "metrics.jsonl").read_text().splitlines()]
    rows = list(csv.DictReader((logs / "metrics.csv").read_text().splitlines()))
    assert len(lines) == len(rows) == 4  # one per batch of 2 x 50 steps
    assert [x["env_steps_lifetime"] for x in lines] == [100, 200, 300, 400]
    assert any(p.name.startswith("events.out.tfevents.") for p in logs.iterdir())

    summary = json.loads((tmp_path / "run" / "run.json").read_text())["summary"]
    metrics = summary["metrics"]
    assert metrics["env_steps"] == summary["env_steps"] == 400
    assert metrics["num_episodes"] == summary["episodes"] == sum(x["num_episodes"] for x in lines)
    assert metrics["agent/winner/episode_return_mean"] == 4.0
    assert metrics["agent/loser/episode_return_max"] == -4.0
    assert metrics["episode_return_mean"] == summary["mean_return"] == 0.0
    assert metrics["env_steps_lifetime"] == 400
    assert 0 <= metrics["time/overhead_share"] <= 1

    again = run_cli("sample", *args, "--quiet", "--log-dir", "logs", cwd=tmp_path)
    assert again.returncode == 2
    assert "already holds metrics.jsonl" in again.stderr


def test_a_log_dir_that_is_a_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    done = run_cli("sample", "--steps", "10", "--log-dir", "taken", cwd=tmp_path)
    assert done.returncode == 2
    assert "--log-dir 'taken' is a file, not a folder" in done.stderr
