"""A user's own policy kind and connector from the command line, as a user runs it: fresh
processes (``python -m rlconnect``), a module in the user's folder, ``--import MODULE``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.conftest import run_cli, user_env

from machine_speed import scaled

#: the user's module: a policy kind, a connector (with an ONNX form) and a gymnasium id
USER_MODULE = """
import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc
from rlconnect.deploy.onnx_forms import ConnectorForm

gym.register("ShortCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv",
             max_episode_steps=20)


@rc.register_policy("TemperedMLP")
class TemperedMLP(rc.MLPPolicy):
    def __init__(self, observation_space, action_space, *, temperature=1.0, **kwargs):
        super().__init__(observation_space, action_space, **kwargs)
        self.temperature = temperature

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


class _ScaleForm(ConnectorForm):
    def __init__(self, by):
        super().__init__()
        self.by = by

    def forward(self, cols, states):
        return {**cols, "obs": cols["obs"].to(torch.float32) * self.by}, states


@rc.register_connector("ScaleObs")
class ScaleObs(rc.ObservationConnector):
    def __init__(self, ctx, by=2.0):
        super().__init__(ctx, by=by)
        self.by = by

    def transform(self, obs):
        return np.asarray(obs, np.float32) * np.float32(self.by)

    def onnx_form(self):
        return _ScaleForm(self.by)
"""

#: a training script: a runner with the user's kind and connector, saved as a checkpoint
TRAIN = """
import sys
import gymnasium as gym
import rlconnect as rc
import my_kinds

env = gym.make("CartPole-v1")
policy = my_kinds.TemperedMLP(env.observation_space, env.action_space, temperature=0.5, seed=0)
pipeline = lambda ctx: rc.AgentConnectorPipeline(ctx, [my_kinds.ScaleObs(ctx, by=3.0)])
runner = rc.EnvRunner("CartPole-v1", policy, config=rc.RunnerConfig(num_envs=2, seed=0),
                      agent_pipelines={"default_policy": pipeline})
runner.sample()
runner.save_checkpoint(sys.argv[1])
runner.stop()
"""

#: a fresh process loading the exported file, with or without the import
LOAD = """
import sys
import numpy as np
import rlconnect as rc
if sys.argv[2] == "import":
    import my_kinds
try:
    policy = rc.load_policy(sys.argv[1])
except rc.UnknownPolicyError as exc:
    print("UnknownPolicyError:", exc)
    raise SystemExit(3)
print(type(policy.policy).__name__, policy.policy.temperature, policy.agent_pipeline.names)
"""


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: their module and a checkpoint saved with its kind and connector."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_kinds.py").write_text(USER_MODULE)
    kind_only = USER_MODULE.split('@rc.register_connector("ScaleObs")')[0]  # no connector
    (folder / "kind_only.py").write_text(kind_only)
    done = _python(TRAIN, folder, "ckpt")
    assert done.returncode == 0, done.stderr
    return folder


def _python(script: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=cwd,
        env=user_env(),
        check=False,
    )


def test_export_without_import_names_the_option_and_the_python_import(user_folder) -> None:
    done = run_cli("export", "ckpt", "--out", "p.policy", cwd=user_folder)
    assert done.returncode == 2 and done.stdout == ""
    err = done.stderr
    assert err.count("\n") == 1, err
    assert err.startswith("rlconnect export: error: unknown policy kind 'TemperedMLP'")
    assert "--import your_module" in err and "`import your_module` in Python" in err
    assert "registers it (rc.register_policy)" in err
    assert not (user_folder / "p.policy").exists()


def test_an_unregistered_connector_names_the_option_too(user_folder) -> None:
    done = run_cli("export", "ckpt", "--import", "kind_only", "--out", "p", cwd=user_folder)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no connector registered as 'ScaleObs'" in done.stderr
    assert "--import your_module" in done.stderr and "rc.register_connector" in done.stderr


def test_export_inspect_and_load_with_the_import(user_folder, tmp_path) -> None:
    policy, model = tmp_path / "user.policy", tmp_path / "user.onnx"
    done = run_cli(
        "export", "ckpt", "--import", "my_kinds", "--out", str(policy), "--onnx", str(model),
        cwd=user_folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and policy.is_file() and model.is_file()
    shown = run_cli("inspect", str(policy), "--json", "--import", "my_kinds", cwd=user_folder)
    assert shown.returncode == 0, shown.stderr
    desc = json.loads(shown.stdout)["policy"]
    assert desc["policy"]["kind"] == "TemperedMLP"
    assert [m["name"] for m in desc["agent_pipeline"]] == ["ScaleObs"]

    loaded = _python(LOAD, user_folder, str(policy), "import")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["TemperedMLP", "0.5", "['ScaleObs']"]
    missing = _python(LOAD, user_folder, str(policy), "no-import")
    assert missing.returncode == 3, missing.stderr
    assert "unknown policy kind 'TemperedMLP'" in missing.stdout
    assert "`import your_module` in Python" in missing.stdout


def test_sample_imports_a_module_registering_an_env_id(user_folder) -> None:
    done = run_cli(
        "sample", "--import", "my_kinds", "--env", "ShortCartPole-v0", "--steps", "100",
        "--num-envs", "2", "--quiet", cwd=user_folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ShortCartPole-v0" in done.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["inspect", "ckpt", "--import", "no_such_module_xyz"], "no module 'no_such_module_xyz'"),
        (
            ["export", "ckpt", "--out", "p", "--import", "rlconnect.no_such"],
            "there is no module 'rlconnect.no_such' in the installed rlconnect",
        ),
        (
            ["sample", "--env", "pettingzoo.classic.rps_v99:env", "--steps", "10"],
            "there is no module 'pettingzoo.classic.rps_v99' in the installed pettingzoo",
        ),
    ],
)
def test_a_module_that_does_not_exist_is_named_as_such(user_folder, args, words) -> None:
    done = run_cli(*args, cwd=user_folder)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr and "pip install" not in done.stderr
