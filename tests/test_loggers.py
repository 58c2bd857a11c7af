"""``rc.loggers`` and ``runner.add_logger``: one metrics record per ``sample()``, files
read back (TensorBoard's event files with TensorBoard's own reader), and a logger that
cannot write raising ``rc.LoggerError`` without losing the batch (issue 54)."""

from __future__ import annotations

import csv
import json
import os
import pickle
from pathlib import Path

import gymnasium as gym
import pytest

import rlconnect as rc


def make_runner(**cfg):
    env = gym.make("CartPole-v1")
    base = {"num_envs": 2, "rollout_fragment_length": 40, "seed": 0}
    return rc.EnvRunner(
        "CartPole-v1",
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=rc.RunnerConfig(**{**base, **cfg}),
    )


def test_every_logger_gets_one_record_per_sample(tmp_path: Path):
    runner = make_runner()
    runner.add_logger(rc.loggers.JsonlLogger(tmp_path / "a" / "metrics.jsonl"))
    runner.add_logger(rc.loggers.CsvLogger(tmp_path / "metrics.csv"))
    episodes = 0
    for _ in range(3):
        runner.sample()
        episodes += len([m for m in runner.get_metrics() if not m["episode_faulty"]])
    runner.stop()
    lines = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rows = list(csv.DictReader((tmp_path / "metrics.csv").read_text().splitlines()))
    assert len(lines) == len(rows) == 3
    assert [x["env_steps_lifetime"] for x in lines] == [80, 160, 240]
    assert sum(x["num_episodes"] for x in lines) == episodes > 0
    assert [int(r["env_steps_lifetime"]) for r in rows] == [80, 160, 240]
    assert all(x["wall_time"] > 0 for x in lines)
    # the loggers wrote the window: nothing is left for the runner's own next call
    assert runner.metrics()["env_steps"] == 0


def test_csv_columns_grow_and_keep_earlier_rows(tmp_path: Path):
    path = tmp_path / "m.csv"
    logger = rc.loggers.CsvLogger(path)
    logger.write({"a": 1, "b": None})
    logger.write({"a": 2, "agent/x/num_episodes": 5})
    logger.write({"b": 3.5})
    logger.close()
    rows = list(csv.reader(path.read_text().splitlines()))
    assert rows[0] == ["wall_time", "a", "b", "agent/x/num_episodes"]
    assert [r[1:] for r in rows[1:]] == [["1", "", ""], ["2", "", "5"], ["", "3.5", ""]]


def test_tensorboard_reads_the_scalars_back(tmp_path: Path):
    from tensorboard.backend.event_processing import event_accumulator

    runner = make_runner()
    runner.add_logger(rc.loggers.TensorBoardLogger(tmp_path / "tb"))
    records = []
    runner.add_logger(_Keep(records))
    for _ in range(3):
        runner.sample()
    runner.stop()
    (event_file,) = os.listdir(tmp_path / "tb")
    assert event_file.startswith("events.out.tfevents.")
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"env_steps", "time/env", "time/overhead_share", "agent/agent0/num_episodes"} <= tags
    assert "episode_return_mean" in tags  # (None in a window without episodes: left out)
    env_steps = acc.Scalars("env_steps_lifetime")
    assert [e.step for e in env_steps] == [80, 160, 240]
    assert [e.value for e in env_steps] == [80.0, 160.0, 240.0]
    share = [e.value for e in acc.Scalars("time/overhead_share")]
    assert share == pytest.approx([r["time/overhead_share"] for r in records], rel=1e-6)


class _Keep:
    """A logger of the user's own: any object with write, flush and close."""

    def __init__(self, records: list) -> None:
        self.records = records
        self.closed = False

    def write(self, record) -> None:
        self.records.append(dict(record))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_logger_that_cannot_be_made_names_its_path(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for make in (rc.loggers.JsonlLogger, rc.loggers.CsvLogger, rc.loggers.TensorBoardLogger):
        with pytest.raises(rc.LoggerError, match="file") as info:
            make(blocker / "sub" / "m.log")
        assert info.value.path == str(blocker / "sub" / "m.log")
        assert isinstance(info.value, OSError)
    with pytest.raises(rc.LoggerError, match="folder you can write"):
        rc.loggers.JsonlLogger(tmp_path)  # a folder, not a file


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_raises_from_sample_with_the_batch(tmp_path: Path):
    runner = make_runner()
    kept: list = []
    full = rc.loggers.JsonlLogger("/dev/full")  # every write: ENOSPC
    runner.add_logger(full)
    runner.add_logger(_Keep(kept))
    with pytest.raises(rc.LoggerError, match="/dev/full") as info:
        runner.sample()
    error = info.value
    assert error.path == "/dev/full"
    assert len(error.batch) == 80 and error.batch["obs"].shape == (80, 4)
    assert error.record is not None and error.record["env_steps"] == 80
    assert len(kept) == 1  # the other logger got its record
    # the runner samples on, without the failed logger
    assert len(runner.sample()) == 80
    assert len(kept) == 2 and kept[1]["env_steps_lifetime"] == 160
    runner.stop()  # closes the loggers left; the failed one was closed already


def test_a_users_logger_that_raises_becomes_a_logger_error():
    class Broken(_Keep):
        def write(self, record) -> None:
            raise ValueError("no")

    runner = make_runner()
    broken = Broken([])
    runner.add_logger(broken)
    with pytest.raises(rc.LoggerError, match="Broken raised ValueError: no") as info:
        runner.sample()
    assert isinstance(info.value.__cause__, rc.LoggerError)
    assert broken.closed
    with pytest.raises(TypeError, match="has no write, flush"):
        runner.add_logger(object())


def test_stop_flushes_and_closes_the_loggers(tmp_path: Path):
    runner = make_runner()
    keep = _Keep([])
    jsonl = rc.loggers.JsonlLogger(tmp_path / "m.jsonl")
    runner.add_logger(keep)
    runner.add_logger(jsonl)
    runner.sample()
    runner.stop()
    assert keep.closed
    with pytest.raises(rc.LoggerError, match="is closed"):
        jsonl.write({"a": 1})
    runner.stop()  # again: nothing


def test_logger_error_pickles_with_its_path():
    error = pickle.loads(pickle.dumps(rc.LoggerError("cannot write 'x'", "x")))
    assert str(error) == "cannot write 'x'" and error.path == "x"


def test_tensorboard_is_imported_only_by_its_logger(tmp_path: Path, monkeypatch):
    import subprocess
    import sys

    code = "import sys, rlconnect; print('tensorboard' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install 'rlconnect\[tensorboard\]'"):
        rc.loggers.TensorBoardLogger(tmp_path)
