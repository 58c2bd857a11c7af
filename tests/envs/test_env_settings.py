"""EnvSettings: the env settings as one object, derived from RunnerConfig's fields."""

from __future__ import annotations

import attrs
import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.envs import EnvSettings, GymEnvs, make_base_env


def test_the_config_hands_on_every_env_setting():
    cfg = rc.RunnerConfig(
        num_envs=4, seed=3, env_config={"a": 1}, num_env_workers=2, env_poll_size=2, horizon=9
    )
    settings = cfg.env_settings()
    assert isinstance(settings, EnvSettings)
    for name in attrs.fields_dict(EnvSettings):
        assert getattr(settings, name) == getattr(cfg, name), name


def test_make_base_env_takes_the_object_and_keyword_changes():
    settings = EnvSettings(num_envs=2, seed=5)
    env = make_base_env("CartPole-v1", settings, num_envs=3)
    assert isinstance(env, GymEnvs) and env.num_envs == 3
    env.close()


def test_env_creators_get_a_copy_of_env_config():
    config: dict = {"kept": True}

    def creator(ctx: rc.envs.EnvContext):
        ctx.config["added"] = 1  # what a creator does to its config stays its own
        return gym.make("CartPole-v1")

    make_base_env(creator, EnvSettings(env_config=config)).close()
    assert config == {"kept": True}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_envs": 0}, r"env setting num_envs=0: must be an integer >= 1"),
        ({"num_envs": 2, "num_env_workers": 3}, r"num_env_workers=3: must be between 0"),
        ({"seed": -1}, r"env setting seed=-1: must be None or an integer >= 0"),
        ({"preset": "nes"}, r"env setting preset='nes': must be None or one of \['atari'\]"),
    ],
)
def test_a_bad_setting_is_named(changes, message):
    with pytest.raises(ValueError, match=message):
        make_base_env("CartPole-v1", **changes)


def test_a_timeout_without_workers_is_refused_by_the_config_only():
    with pytest.raises(ValueError, match=r"RunnerConfig.sub_env_timeout_s=1.0 needs"):
        rc.RunnerConfig(sub_env_timeout_s=1.0)
    # an evaluation env built in this process from a config with workers keeps its timeout
    env = make_base_env("CartPole-v1", sub_env_timeout_s=1.0)
    assert isinstance(env, GymEnvs)
    env.close()
