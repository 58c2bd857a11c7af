"""default_agent_pipeline / default_action_pipeline for each config combination."""

import itertools

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.connectors import (
    ActionData,
    AgentData,
    ConnectorContext,
    default_action_pipeline,
    default_agent_pipeline,
)

VEC = gym.spaces.Box(-1, 1, (3,), np.float32)
IMG = gym.spaces.Box(0, 255, (4, 4, 1), np.uint8)
DISC = gym.spaces.Discrete(4)
DICT = gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(-1, 1, (2,))})
ACT_BOX = gym.spaces.Box(-2, 2, (1,), np.float32)


def _ctx(obs=VEC, act=DISC, **config):
    return ConnectorContext(obs, act, config=config)


@pytest.mark.parametrize(
    ("obs", "flt", "clip", "stack"),
    list(
        itertools.product(
            [VEC, DISC, DICT, gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiBinary(3)],
            [None, "NoFilter", "MeanStdFilter"],
            [None, False, True, 2.5],
            [None, 3],
        )
    ),
)
def test_agent_pipeline_members(obs, flt, clip, stack):
    config = {"clip_rewards": clip, "framestack": stack}
    if flt is not None:
        config["observation_filter"] = flt
    pipe = default_agent_pipeline(_ctx(obs, **config))
    expected = []
    if not isinstance(obs, gym.spaces.Box):
        expected.append("FlattenObservations")
    if flt == "MeanStdFilter":
        expected.append("MeanStdFilter")
    if clip not in (None, False):
        expected.append("ClipReward")
    if stack:
        expected.append("FrameStack")
    assert pipe.names == expected
    if clip == 2.5:
        assert pipe["ClipReward"].limit == 2.5
    if clip is True:
        assert pipe["ClipReward"].limit is None
    if stack:
        assert pipe.output_space.shape[0] == 3
    else:
        assert len(pipe.output_space.shape) == 1


def test_agent_pipeline_runs_end_to_end_on_dict_obs():
    ctx = _ctx(DICT, observation_filter="MeanStdFilter", clip_rewards=True, framestack=2)
    pipe = default_agent_pipeline(ctx)
    obs = {"a": np.array([0, 1]), "b": np.zeros((2, 2), np.float32)}
    d = pipe(AgentData([0, 1], ["a", "a"], {"obs": obs, "rewards": np.array([3.0, -0.1])}))
    assert d["obs"].shape == (2, 2, 4)
    assert pipe.output_space.contains(d["obs"][0])
    np.testing.assert_array_equal(d["rewards"], [1, -1])


def test_box_observations_pass_unchanged():
    pipe = default_agent_pipeline(_ctx(IMG))
    assert len(pipe) == 0
    assert pipe.output_space is IMG


def test_recurrent_policy_gets_state_buffer():
    ctx = ConnectorContext(VEC, DISC, initial_states=[np.zeros(4, np.float32)])
    assert default_agent_pipeline(ctx).names == ["StateBuffer"]


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("observation_filter", "MeanStd", r"observation_filter.*\['NoFilter', 'MeanStdFilter'\]"),
        ("observation_filter", None, "observation_filter"),
        ("clip_rewards", -1.0, "clip_rewards.*positive"),
        ("clip_rewards", "yes", "clip_rewards"),
        ("framestack", 0, r"framestack.*int >= 1"),
        ("framestack", 2.0, "framestack"),
        ("framestack", True, "framestack"),
    ],
)
def test_agent_config_errors(key, value, match):
    with pytest.raises(ValueError, match=match):
        default_agent_pipeline(_ctx(**{key: value}))


def test_meanstd_on_image_fails_at_build_naming_connector_and_space():
    with pytest.raises(ValueError, match=r"'MeanStdFilter'.*Box.*uint8"):
        default_agent_pipeline(_ctx(IMG, observation_filter="MeanStdFilter"))


@pytest.mark.parametrize(
    ("act", "normalize", "clip", "expected"),
    [
        (ACT_BOX, None, None, ["ConvertToNumpy", "UnsquashActions"]),
        (ACT_BOX, True, False, ["ConvertToNumpy", "UnsquashActions"]),
        (ACT_BOX, False, False, ["ConvertToNumpy"]),
        (ACT_BOX, False, True, ["ConvertToNumpy", "ClipActions"]),
        (ACT_BOX, True, True, ["ConvertToNumpy", "UnsquashActions", "ClipActions"]),
        (DISC, True, True, ["ConvertToNumpy"]),
        (gym.spaces.MultiDiscrete([2, 2]), None, None, ["ConvertToNumpy"]),
    ],
)
def test_action_pipeline_members(act, normalize, clip, expected):
    config = {}
    if normalize is not None:
        config["normalize_actions"] = normalize
    if clip is not None:
        config["clip_actions"] = clip
    pipe = default_action_pipeline(_ctx(act=act, **config))
    assert pipe.names == expected
    assert pipe.output_space is act


def test_default_action_pipeline_unsquashes():
    pipe = default_action_pipeline(_ctx(act=ACT_BOX))
    out = pipe(ActionData([0, 1], ["a", "a"], {"actions": np.array([[0.5], [3.0]], np.float32)}))
    np.testing.assert_allclose(out["actions"], [[1.0], [2.0]])


@pytest.mark.parametrize("key", ["normalize_actions", "clip_actions"])
def test_action_config_errors(key):
    with pytest.raises(ValueError, match=f"{key}.*True or False"):
        default_action_pipeline(_ctx(act=ACT_BOX, **{key: "yes"}))
