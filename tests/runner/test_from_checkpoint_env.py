"""``EnvRunner.from_checkpoint(..., env="module:function")``: the command line's form of an
env creator, accepted from Python too (issue 55)."""

from __future__ import annotations

import textwrap

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

ENV_MODULE = """
import gymnasium as gym

built = []


def make_env(ctx):
    built.append(ctx.vector_index)
    return gym.make("CartPole-v1")


def make_plain():
    return gym.make("CartPole-v1")


gym.register("Issue55Cart-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
"""


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    (tmp_path / "issue55_envs.py").write_text(textwrap.dedent(ENV_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=4, seed=3)
    runner = rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space, seed=0), config=config
    )
    runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    return tmp_path / "ck", runner


@pytest.mark.parametrize("spec", ["issue55_envs:make_env", "issue55_envs:make_plain"])
def test_from_checkpoint_takes_module_function(checkpoint, spec):
    """Before: gymnasium's ``NameNotFound: Environment `make_env` doesn't exist``."""
    path, saved = checkpoint
    import issue55_envs

    issue55_envs.built.clear()
    restored = rc.EnvRunner.from_checkpoint(path, env=spec)
    assert len(restored.sample()) == 8
    if spec.endswith("make_env"):
        assert sorted(issue55_envs.built) == [0, 1]  # called with the env context
    obs = np.zeros(4, np.float32)
    assert restored.compute_single_action(obs) == saved.compute_single_action(obs)


def test_module_env_id_still_means_gymnasiums_form(checkpoint):
    path, _ = checkpoint
    assert len(rc.EnvRunner.from_checkpoint(path, env="issue55_envs:Issue55Cart-v0").sample()) == 8


def test_a_module_or_name_that_is_not_there_is_a_clear_error(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ValueError, match="cannot import module 'no_such_issue55_module'"):
        rc.EnvRunner.from_checkpoint(path, env="no_such_issue55_module:make_env")
    with pytest.raises(ValueError, match="module 'issue55_envs' has no function 'make_enb'"):
        rc.EnvRunner.from_checkpoint(path, env="issue55_envs:make_enb")
