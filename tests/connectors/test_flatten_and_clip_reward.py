"""Column-mapping agent connectors: FlattenObservations and ClipReward."""

import re

import gymnasium as gym
import numpy as np
import pytest

import rlconnect.connectors as rcc
from rlconnect.connectors import AgentData, ClipReward, ConnectorContext, FlattenObservations

ACT = gym.spaces.Discrete(2)
rcc.register_lambda("_identity_for_test", lambda x: x)


def _ctx(obs_space):
    return ConnectorContext(obs_space, ACT)


def test_flatten_dict_of_discrete_and_box():
    space = gym.spaces.Dict({"d": gym.spaces.Discrete(3), "b": gym.spaces.Box(-1, 1, (2,))})
    conn = FlattenObservations(_ctx(space))
    out = conn.bind(space)
    assert out.shape == (5,)
    assert out.dtype == np.float32
    data = AgentData(
        [0, 1], ["a", "a"], {"obs": {"d": np.array([2, 0]), "b": np.array([[0.5, -1], [1, 0]])}}
    )
    got = conn(data)["obs"]
    # gymnasium sorts a plain dict's keys: "b" comes first
    expected = np.array([[0.5, -1, 0, 0, 1], [1, 0, 1, 0, 0]], np.float32)
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.float32


def test_flatten_multidiscrete_one_hot_and_image_box():
    md = gym.spaces.MultiDiscrete([2, 3])
    conn = FlattenObservations(_ctx(md))
    got = conn(AgentData([0], ["a"], {"obs": np.array([[1, 2]])}))["obs"]
    np.testing.assert_array_equal(got, [[0, 1, 0, 0, 1]])

    img = gym.spaces.Box(0, 255, (2, 2, 1), np.uint8)
    conn = FlattenObservations(_ctx(img))
    obs = np.arange(8, dtype=np.uint8).reshape(2, 2, 2, 1)
    got = conn(AgentData([0, 1], ["a", "b"], {"obs": obs}))["obs"]
    assert got.shape == (2, 4)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[1], [4, 5, 6, 7])


@pytest.mark.parametrize("start", [0, -2, 3])
def test_flatten_discrete_is_one_hot_and_refuses_what_flatten_batch_refuses(start):
    from rlconnect.spaces.flatten import flatten_batch, make_flattener

    space = gym.spaces.Discrete(4, start=start)
    conn = FlattenObservations(_ctx(space))
    got = conn(AgentData([0, 1, 2], ["a"] * 3, {"obs": np.array([start + 3, start, start + 1])}))
    np.testing.assert_array_equal(got["obs"], np.eye(4, dtype=np.float32)[[3, 0, 1]])
    assert got["obs"].dtype == np.float32
    flatten = make_flattener(space)
    for bad in ([start - 1], [start + 4], [0.5], [[start, start]]):
        with pytest.raises(Exception) as want:
            flatten_batch(space, np.array(bad))
        with pytest.raises(type(want.value), match=re.escape(str(want.value))):
            flatten(np.array(bad))


def test_flatten_rejects_unsupported_space():
    with pytest.raises(ValueError, match="unsupported space"):
        FlattenObservations(_ctx(gym.spaces.Text(5))).bind(gym.spaces.Text(5))


def test_clip_reward_sign_and_limit():
    rewards = np.array([-3.0, -0.2, 0.0, 0.4, 7.0], np.float32)
    ctx = _ctx(gym.spaces.Box(-1, 1, (1,)))
    obs = np.zeros((5, 1), np.float32)

    def run(conn):
        data = AgentData(range(5), ["a"] * 5, {"obs": obs, "rewards": rewards.copy()})
        return conn(data)["rewards"]

    np.testing.assert_array_equal(run(ClipReward(ctx)), [-1, -1, 0, 1, 1])
    np.testing.assert_allclose(run(ClipReward(ctx, limit=0.5)), [-0.5, -0.2, 0.0, 0.4, 0.5])
    # negative control: without the connector the rewards are unchanged
    assert run(rcc.AgentLambda(ctx, fn="_identity_for_test")).max() == 7.0


def test_clip_reward_without_rewards_column_passes_through():
    ctx = _ctx(gym.spaces.Box(-1, 1, (1,)))
    data = AgentData([0], ["a"], {"obs": np.zeros((1, 1), np.float32)})
    assert "rewards" not in ClipReward(ctx)(data)


@pytest.mark.parametrize("limit", [0, -1.0, "1", True, float("nan")])
def test_clip_reward_rejects_bad_limit(limit):
    with pytest.raises(ValueError, match="limit"):
        ClipReward(_ctx(gym.spaces.Box(-1, 1, (1,))), limit=limit)
