"""torch is imported only when a torch policy is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import user_env

from machine_speed import scaled


def _python(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter (a user's environment), ``folder`` as its argument."""
    return subprocess.run(
        [sys.executable, "-c", script, str(folder)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        env=user_env(),
        check=False,
    )


NO_TORCH = """
import sys
import gymnasium as gym
import rlconnect as rc
from rlconnect.cli import main
from rlconnect.serve import PolicyClient

env = gym.make("CartPole-v1")
policy = rc.RandomPolicy(env.observation_space, env.action_space, seed=0)
config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0, output=sys.argv[1] + "/b")
runner = rc.EnvRunner("CartPole-v1", policy, config=config)
runner.sample()
runner.evaluate(1)
runner.save_checkpoint(sys.argv[1] + "/ckpt")
runner.stop()
assert len(list(rc.read_batches(sys.argv[1] + "/b"))) == 1
assert main(["inspect", sys.argv[1] + "/ckpt"]) == 0
assert "MLPPolicy" in rc.policy.registered_policies()
rc.EnvRunner.from_checkpoint(sys.argv[1] + "/ckpt", env="CartPole-v1").stop()
print("TORCH" if "torch" in sys.modules else "NO TORCH")
rc.MLPPolicy(env.observation_space, env.action_space)
print("TORCH" if "torch" in sys.modules else "NO TORCH")
"""


def test_random_policy_files_inspect_and_clients_start_without_torch(tmp_path: Path) -> None:
    done = _python(NO_TORCH, tmp_path)
    assert done.returncode == 0, done.stderr
    # no torch until MLPPolicy is asked for, then torch
    assert done.stdout.splitlines()[-2:] == ["NO TORCH", "TORCH"]


def test_lazy_names_are_the_real_classes() -> None:
    import rlconnect as rc
    from rlconnect.policy import get_policy_class, policy_kind
    from rlconnect.policy.mlp import MLPPolicy
    from rlconnect.policy.torch_policy import TorchPolicy

    assert rc.MLPPolicy is MLPPolicy and rc.TorchPolicy is TorchPolicy
    assert get_policy_class("MLPPolicy") is MLPPolicy
    import gymnasium as gym

    p = MLPPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    assert policy_kind(p) == "MLPPolicy"


MISSING_PYARROW = """
import sys
import gymnasium as gym
import rlconnect as rc

folder = sys.argv[1]
sys.modules["pyarrow"] = None  # as if the offline extra were not installed
env = gym.make("CartPole-v1")
policy = rc.RandomPolicy(env.observation_space, env.action_space)
for what, call in [
    ("read", lambda: list(rc.read_batches(folder))),
    ("write", lambda: rc.EnvRunner(
        "CartPole-v1", policy, config=rc.RunnerConfig(output=folder + "/new"))),
    ("writer", lambda: rc.offline.ParquetBatchWriter),
]:
    try:
        call()
    except ImportError as exc:
        print(what, exc)
"""


def test_a_missing_pyarrow_names_the_extra_and_the_pip_command(tmp_path: Path) -> None:
    import gymnasium as gym

    import rlconnect as rc

    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    config = rc.RunnerConfig(rollout_fragment_length=10, output=str(tmp_path))
    with rc.EnvRunner("CartPole-v1", policy, config=config) as runner:
        runner.sample()
    done = _python(MISSING_PYARROW, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [x.split()[0] for x in lines] == ["read", "write", "writer"]
    for line in lines:
        assert "needs pyarrow, the offline extra: pip install 'rlconnect[offline]'" in line
