"""ConnectorSettings: one declaration of the connector keys, read by RunnerConfig and the
default pipelines alike."""

import attrs
import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.connectors import ConnectorContext, ConnectorSettings, default_agent_pipeline

BAD = [
    ("observation_filter", "Mean", r"one of \['NoFilter', 'MeanStdFilter'\]"),
    ("observation_filter_sync", "lazy", r"one of \['immediate', 'frozen'\]"),
    ("clip_rewards", -1.0, "positive number"),
    ("clip_rewards", "yes", "positive number"),
    ("framestack", 0, "int >= 1"),
    ("framestack", 2.0, "int >= 1"),
    ("clip_actions", "yes", "True or False"),
    ("normalize_actions", 1, "True or False"),
    ("preset", "procgen", r"None or one of \['atari'\]"),
]


def test_runner_config_declares_every_setting_with_its_default():
    settings = attrs.fields_dict(ConnectorSettings)
    runner = attrs.fields_dict(rc.RunnerConfig)
    for name, field in settings.items():
        assert runner[name].default == field.default, name
    assert rc.RunnerConfig().connector_config() == ConnectorSettings().to_config()


@pytest.mark.parametrize(("key", "value", "allowed"), BAD)
def test_a_bad_value_gets_the_same_message_everywhere(key, value, allowed):
    with pytest.raises(ValueError, match=rf"^RunnerConfig\.{key}={value!r}: .*{allowed}"):
        rc.RunnerConfig(**{key: value})
    with pytest.raises(ValueError, match=rf"^connector setting {key}={value!r}: .*{allowed}"):
        ConnectorSettings.from_config({key: value})


def test_from_config_ignores_other_keys_and_fills_defaults():
    s = ConnectorSettings.from_config({"framestack": 3, "num_envs": 8, "anything": object()})
    assert s.framestack == 3 and s.observation_filter == "NoFilter" and s.normalize_actions


def test_numpy_scalars_become_python_numbers_so_configs_stay_json():
    cfg = rc.RunnerConfig(clip_rewards=np.float32(0.5), framestack=np.int64(2))
    assert type(cfg.clip_rewards) is float and type(cfg.framestack) is int
    assert cfg.connector_config()["clip_rewards"] == 0.5
    # a numpy float that is a whole number is still not a frame count
    with pytest.raises(ValueError, match="framestack"):
        rc.RunnerConfig(framestack=np.float64(2.0))


@pytest.mark.parametrize(
    ("clip", "expected"),
    [(None, (False, None)), (False, (False, None)), (True, (True, None)), (2, (True, 2.0))],
)
def test_reward_limit(clip, expected):
    assert ConnectorSettings(clip_rewards=clip).reward_limit == expected
    # the runner accepts what the pipelines accept (False: off)
    assert rc.RunnerConfig(clip_rewards=clip).connector_settings().reward_limit == expected


def test_pipelines_built_from_a_runner_config_follow_its_settings():
    cfg = rc.RunnerConfig(observation_filter="MeanStdFilter", clip_rewards=2, framestack=2)
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    ctx = ConnectorContext(space, gym.spaces.Discrete(2), cfg.connector_config())
    pipe = default_agent_pipeline(ctx)
    assert pipe.names == ["MeanStdFilter", "ClipReward", "FrameStack"]
    assert pipe["ClipReward"].limit == 2.0
