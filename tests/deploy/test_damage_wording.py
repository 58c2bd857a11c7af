"""One wording for each kind of file damage, whoever reads the file: ``rlconnect inspect``,
``rc.load_policy`` and a checkpoint restore, each in a fresh process as a user runs them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest
from tests.cli.conftest import run_cli, user_env

import rlconnect as rc

#: damage -> (how to do it to a file's bytes, the words every reader must use)
DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "truncated": (lambda d: d[: len(d) - 100], "truncated: "),
    "one byte changed": (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "digest mismatch: "),
    "bytes appended": (lambda d: d + b"\0\0", "bytes appended: 2 more"),
}

LOAD = """
import sys
import rlconnect as rc
try:
    if sys.argv[1] == "policy":
        rc.load_policy(sys.argv[2])
    else:
        rc.EnvRunner.from_checkpoint(sys.argv[2], env="CartPole-v1")
except rc.CheckpointError as exc:
    print(exc)
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("saved")
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=20, seed=0)
    policy = rc.MLPPolicy(env.observation_space, env.action_space, seed=0)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    runner.sample()
    runner.save_checkpoint(folder / "checkpoint")
    rc.export_policy(runner, folder / "cartpole.policy")
    runner.stop()
    return folder


def _damage_reported(what: str, path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, what, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _tail(message: str, words: str) -> str:
    """The damage part of a message: from ``words`` on."""
    assert words in message, message
    return message[message.index(words) :]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_inspect_load_policy_and_restore_word_the_damage_alike(saved, tmp_path, damage) -> None:
    change, words = DAMAGE[damage]
    policy = tmp_path / "cartpole.policy"
    policy.write_bytes(change((saved / "cartpole.policy").read_bytes()))
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(saved / "checkpoint", checkpoint)
    weights = checkpoint / "policies" / "default_policy" / "weights.safetensors"
    weights.write_bytes(change(weights.read_bytes()))

    shown = run_cli("inspect", str(policy))
    assert shown.returncode == 1 and shown.stderr.count("\n") == 1
    loaded = _damage_reported("policy", policy)
    assert loaded == shown.stderr.strip().removeprefix("rlconnect inspect: ")
    shown_ckpt = run_cli("inspect", str(checkpoint))
    assert shown_ckpt.returncode == 1 and shown_ckpt.stderr.count("\n") == 1
    restored = _damage_reported("checkpoint", checkpoint)
    assert "weights.safetensors: " + words in restored
    tails = {_tail(m, words) for m in (loaded, shown.stderr.strip(), restored)}
    ckpt_tail = _tail(shown_ckpt.stderr, words)
    assert ckpt_tail.startswith(_tail(restored, words)), (ckpt_tail, restored)
    if damage == "truncated":  # the sizes differ between the two files; the words do not
        assert all("bytes are there (a write or copy stopped early)" in t for t in tails)
    else:
        assert len(tails) == 1, tails
