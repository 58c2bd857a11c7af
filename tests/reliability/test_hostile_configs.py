"""Settings read from files (a checkpoint's config, ``rlconnect sample --config``) cannot
make a runner fork thousands of processes, and a checkpoint's ``env_config`` reaches the
env creator only as plain JSON data."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.cli.app import main
from rlconnect.envs.settings import MAX_WORKER_PROCESSES
from rlconnect.errors import CheckpointError

pytestmark = pytest.mark.reliability

CARTPOLE = gym.make("CartPole-v1")


class Recorder:
    """An env creator that keeps the ``env_config`` each sub-env was built with."""

    def __init__(self) -> None:
        self.configs: list[dict] = []

    def __call__(self, ctx: rc.EnvContext) -> gym.Env:
        self.configs.append(dict(ctx.config))
        return gym.make("CartPole-v1")


def saved(tmp_path: Path, **config) -> Path:
    policy = rc.RandomPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, seed=0)
    runner = rc.EnvRunner(
        Recorder(), policy, config=rc.RunnerConfig(rollout_fragment_length=4, **config)
    )
    runner.save_checkpoint(tmp_path / "ck")
    return tmp_path / "ck"


def edit_config(path: Path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["config"].update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_remote_envs_are_bounded_in_every_config():
    rc.RunnerConfig(num_envs=MAX_WORKER_PROCESSES, remote_envs=True)  # the limit itself
    with pytest.raises(
        ValueError,
        match=r"remote_envs=True with num_envs=257 would start 257 worker processes: "
        r"at most 256 \(MAX_WORKER_PROCESSES\)",
    ):
        rc.RunnerConfig(num_envs=MAX_WORKER_PROCESSES + 1, remote_envs=True)
    rc.RunnerConfig(num_envs=4096)  # in-process sub-envs keep their own limit


def test_a_checkpoint_asking_for_4096_worker_processes_starts_none(tmp_path):
    path = saved(tmp_path)
    edit_config(path, remote_envs=True, num_envs=4096)
    before = len(multiprocessing.active_children())
    with pytest.raises(
        CheckpointError, match=r"invalid config: .*would start 4096 worker processes"
    ):
        rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
    assert len(multiprocessing.active_children()) == before


def test_a_config_file_asking_for_4096_worker_processes_is_a_usage_error(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text("num_envs = 4096\nremote_envs = true\n")
    assert main(["sample", "--config", str(cfg), "--steps", "10", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "MAX_WORKER_PROCESSES" in err and "remote_envs" in err


def test_env_config_from_a_checkpoint_reaches_the_creator_as_saved(tmp_path):
    config = {"level": 3, "names": ["a", "b"], "opts": {"speed": 0.5, "on": True, "x": None}}
    path = saved(tmp_path, env_config=config)
    creator = Recorder()
    rc.EnvRunner.from_checkpoint(path, env=creator)
    assert creator.configs == [config]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"speed": float("nan")}, r"config env_config\['speed'\]: nan is not a finite number"),
        ({"a": [1, float("inf")]}, r"config env_config\['a'\]\[1\]: inf is not a finite"),
        ({"deep": json.loads("[" * 40 + "]" * 40)}, "nested deeper than 32 levels"),
    ],
)
def test_env_config_that_is_not_plain_json_data_is_a_checkpoint_error(tmp_path, value, message):
    path = saved(tmp_path)
    edit_config(path, env_config=value)
    creator = Recorder()
    with pytest.raises(CheckpointError, match=message):
        rc.EnvRunner.from_checkpoint(path, env=creator)
    assert creator.configs == []  # the creator never saw it
    # the caller can replace it: the saved one is then not used (nor checked)
    rc.EnvRunner.from_checkpoint(path, env=creator, config_overrides={"env_config": {"ok": 1}})
    assert creator.configs == [{"ok": 1}]
