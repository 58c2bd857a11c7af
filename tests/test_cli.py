"""The rlconnect command: sample (settings, outputs, progress, errors) and inspect."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from rich.console import Console

import rlconnect as rc
from machine_speed import scaled
from rlconnect.cli import Progress, main, time_shares
from rlconnect.offline import read_batches

SMALL = ["--steps", "200", "--num-envs", "2", "--quiet"]


def test_sample_prints_a_summary(capsys):
    assert main(["sample", "--steps", "600", "--num-envs", "2", "--fragment", "50", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "rlconnect sample summary" in out
    assert "steps/s" in out and "mean return" in out
    assert "600" in out
    for part in ("env", "inference", "connector ConvertToNumpy", "other"):
        assert part in out


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
    out = capsys.readouterr().out
    assert "episodes" in out and "connector MeanStdFilter" in out and "random" in out


def test_step_count_is_close_to_what_was_asked(capsys):
    assert main(["sample", "--steps", "1000", "--num-envs", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "env steps" in x)
    assert "1,002 (asked 1,000)" in line


def test_out_writes_batches_a_checkpoint_and_run_json(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["sample", *SMALL, "--out", str(out), "--observation-filter", "MeanStdFilter"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    batches = list(read_batches(out))
    assert sum(len(b) for b in batches) == 200
    assert all(isinstance(b, rc.SampleBatch) for b in batches)
    assert batches[0]["obs"].dtype == np.float32 and batches[0]["infos"].dtype == object
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["env"] == "CartPole-v1" and run["summary"]["env_steps"] == 200
    if hasattr(rc.EnvRunner, "save_checkpoint"):
        assert (out / "checkpoint" / "manifest.json").is_file()
        assert ["checkpoint", str(out / "checkpoint")] in [x.split() for x in text.splitlines()]
    else:
        assert "checkpoint skipped" in text
    # inspect shows the run folder: settings, batches, checkpoint
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "batches:" in shown and "rows: 200" in shown and "obs: float32[4]" in shown
    assert "observation_filter: MeanStdFilter" in shown
    if (out / "checkpoint").is_dir():
        assert "checkpoint:" in shown and "sha256 ok" in shown and "std:" in shown
    # --out never mixes two runs
    assert main(argv) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_config_file_and_flag_precedence(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'env = "CartPole-v1"\nsteps = 300\nnum_envs = 3\npolicy = "random"\n'
        'observation_filter = "MeanStdFilter"\nbatch_mode = "complete_episodes"\n'
    )
    out = tmp_path / "o"
    assert (
        main(["sample", "--config", str(cfg), "--num-envs", "1", "--quiet", "--out", str(out)]) == 0
    )
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["steps"] == 300 and run["settings"]["policy"] == "random"
    config = run["settings"]["runner_config"]
    assert config["num_envs"] == 1  # the flag wins
    assert config["observation_filter"] == "MeanStdFilter"
    assert config["batch_mode"] == "complete_episodes"
    capsys.readouterr()


def test_env_creator_module_function(capsys):
    argv = ["sample", "--env", "test_cli_envs:make_env", *SMALL]
    assert main(argv) == 0
    assert "test_cli_envs:make_env" in capsys.readouterr().out


def test_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "returns.png"
    assert main(["sample", *SMALL, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "returns plot" in capsys.readouterr().out


def test_plot_without_matplotlib_is_one_clear_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert main(["sample", *SMALL, "--plot", str(tmp_path / "r.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "matplotlib" in err and "rlconnect[plot]" in err


# --- errors: one line on stderr, exit code 2, never a traceback ---------------------------
BAD_CONFIGS = {
    "unknown-key": (
        "num_envs = 2\nfragment_len = 3\nfoo = 1\n",
        "unknown keys 'fragment_len', 'foo'",
    ),
    "not-toml": ("num_envs = = 2\n", "not valid TOML"),
    "bad-value": ("num_envs = 0\n", "num_envs"),
    "bad-type": ('seed = "zero"\n', "seed"),
    "bad-steps": ("steps = -5\n", "steps=-5"),
    "bad-policy": ('policy = "ppo"\n', "policy='ppo'"),
    "bad-mode": ('batch_mode = "whole"\n', "batch_mode"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_files(tmp_path, capsys, case):
    text, expected = BAD_CONFIGS[case]
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    assert main(["sample", "--config", str(cfg), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert expected in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sample", "--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["sample", "--env", "CartPole-v9"], "unknown env"),
        (["sample", "--env", "no_such_module_xyz:make"], "cannot import 'no_such_module_xyz'"),
        (["sample", "--config", "/nonexistent/run.toml"], "does not exist"),
        (["sample", "--plot", "/nonexistent/dir/r.png"], "does not exist"),
        (["inspect", "/nonexistent/thing"], "no such file or folder"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(capsys, argv, expected):
    assert main([*argv, "--quiet"] if argv[0] == "sample" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert expected in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sample", "--num-envs", "0"], "--num-envs: 0 is not >= 1"),
        (["sample", "--steps", "many"], "'many' is not an integer"),
        (["sample", "--seed", "-1"], "--seed"),
        (["sample", "--policy", "ppo"], "invalid choice"),
        (["sample", "--bogus"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv, expected):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert expected in err


def test_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["sample", *SMALL, "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_failures_while_running_are_one_line_unless_asked(capsys):
    argv = ["sample", "--env", "test_cli_envs:broken_env", *SMALL]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "simulated failure" in err
    assert main([*argv, "--traceback"]) == 1
    assert "Traceback" in capsys.readouterr().err


# --- progress ------------------------------------------------------------------------------
PERF = {
    "mean_env_wait_ms": 2.0,
    "mean_raw_obs_processing_ms": 1.0,
    "mean_inference_ms": 1.0,
    "mean_action_processing_ms": 0.0,
    "connectors": {"MeanStdFilter": 0.5, "ConvertToNumpy": 0.25},
}


def test_time_shares_by_connector_name():
    shares = dict(time_shares(PERF))
    assert shares == {
        "env": 0.5,
        "MeanStdFilter": 0.125,
        "ConvertToNumpy": 0.0625,
        "inference": 0.25,
        "other": 0.0625,
    }
    assert time_shares({}) == []


def test_progress_without_a_terminal_prints_about_every_ten_percent():
    stream = io.StringIO()
    p = Progress(1000, stream, console=Console(file=stream, width=200))
    for steps in range(50, 1001, 50):
        p.update(steps, steps // 20, 21.5, PERF)
    p.close()
    lines = [x for x in stream.getvalue().splitlines() if not x.startswith("time: ")]
    assert len(lines) == 11 and "\r" not in stream.getvalue()
    last = lines[-1]
    for part in ("1,000/1,000 steps", "steps/s", "ETA 0:00:00", "episodes 50"):
        assert part in last
    assert "mean return 21.50" in last  # 50 episodes: a mean over all of them
    assert "time: env 50%  MeanStdFilter 12%  ConvertToNumpy 6%  inference 25%  other 6%" in (
        stream.getvalue()
    )


def test_progress_on_a_terminal_redraws_in_place():
    stream = io.StringIO()
    console = Console(file=stream, width=100, force_terminal=True)
    p = Progress(100, stream, console=console)
    p.update(10, 0, float("nan"), {})
    p.update(100, 300, 9.0, {})
    p.close()
    text = stream.getvalue()
    assert "\x1b[" in text  # redrawn in place with cursor moves
    assert "mean return (last 100) 9.00" in text and "100%" in text


# --- inspect -------------------------------------------------------------------------------
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
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pipeline"]["members"][0]["name"] == "MeanStdFilter"
    path.write_bytes(b"garbage")
    assert main(["inspect", str(path)]) == 1
    assert "cannot load" in capsys.readouterr().err


def test_inspect_batch_files_and_damaged_ones(tmp_path, capsys):
    from rlconnect.offline import write_batches

    b = rc.SampleBatch(
        {"obs": {"a": np.zeros((3, 2), np.float32), "b": np.arange(3)}, "infos": [{}] * 3}
    )
    (p0, p1) = write_batches([b, b], tmp_path)
    assert main(["inspect", str(p0)]) == 0
    out = capsys.readouterr().out
    assert "files: 1" in out and "a: float32[2]" in out and "b: int64" in out
    assert main(["inspect", str(tmp_path)]) == 0
    assert "rows: 6" in capsys.readouterr().out
    p1.write_bytes(p1.read_bytes()[:-3])
    assert main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(p1) in err and len(err.strip().splitlines()) == 1


def test_inspect_checkpoint_reports_tampering(tmp_path, capsys):
    if not hasattr(rc.EnvRunner, "save_checkpoint"):
        pytest.skip("EnvRunner.save_checkpoint is not there yet")
    out = tmp_path / "run"
    assert main(["sample", *SMALL, "--out", str(out)]) == 0
    capsys.readouterr()
    ckpt = out / "checkpoint"
    assert main(["inspect", str(ckpt)]) == 0
    shown = capsys.readouterr().out
    assert "manifest:" in shown and "agent_pipeline" in shown and "sha256 ok" in shown
    weights = next(ckpt.rglob("weights*"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert main(["inspect", str(ckpt)]) == 1  # one line on stderr, nothing else
    captured = capsys.readouterr()
    assert "damaged checkpoint" in captured.err and "digest mismatch" in captured.err
    assert len(captured.err.splitlines()) == 1 and captured.out == ""
    assert main(["inspect", "--json", str(ckpt)]) == 1  # --json shows every file
    captured = capsys.readouterr()
    assert "digest mismatch" in captured.out and "agent_pipeline" in captured.out


def test_inspect_empty_folder(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "holds no batch files" in capsys.readouterr().err


# --- the console script --------------------------------------------------------------------
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
        ],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "summary" in res.stdout
    assert "100%" in res.stderr  # not a terminal: plain progress lines


def test_bad_env_in_a_subprocess_has_no_traceback():
    res = subprocess.run(
        [sys.executable, "-m", "rlconnect.cli", "sample", "--env", "Nope-v0"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1


def test_inspect_shows_a_parquet_file(tmp_path, capsys):
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(rollout_fragment_length=20, seed=0, output=str(tmp_path / "pq"))
    rc.EnvRunner(
        "CartPole-v1", rc.RandomPolicy(env.observation_space, env.action_space), config=config
    ).sample()
    (parquet,) = (tmp_path / "pq").glob("*.parquet")
    assert main(["inspect", str(parquet)]) == 0
    out = capsys.readouterr().out
    assert "rlconnect.parquet" in out and "env_steps: 20" in out
