"""FrameStack: order, padding at episode start, per-(env, agent) isolation, reset."""

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.connectors import AgentData, ConnectorContext, FrameStack

SPACE = gym.spaces.Box(-100, 100, (2,), np.float32)


def _fs(k=3):
    return FrameStack(ConnectorContext(SPACE, gym.spaces.Discrete(2)), num_frames=k)


def _step(fs, rows):
    """rows: list of (env_id, agent_id, value); obs of a row is [value, -value]."""
    env_ids = [r[0] for r in rows]
    agents = [r[1] for r in rows]
    obs = np.array([[r[2], -r[2]] for r in rows], np.float32)
    return fs(AgentData(env_ids, agents, {"obs": obs}))["obs"][..., 0]  # first feature


def test_output_space():
    out = _fs(4).bind(SPACE)
    assert out.shape == (4, 2)
    assert out.dtype == np.float32
    assert np.all(out.low == -100)
    with pytest.raises(ValueError, match="FrameStack needs a Box"):
        _fs().bind(gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="num_frames"):
        FrameStack(ConnectorContext(SPACE, gym.spaces.Discrete(2)), num_frames=0)


def test_padding_and_newest_last():
    fs = _fs(3)
    np.testing.assert_array_equal(_step(fs, [(0, "a", 1)]), [[1, 1, 1]])
    np.testing.assert_array_equal(_step(fs, [(0, "a", 2)]), [[1, 1, 2]])
    np.testing.assert_array_equal(_step(fs, [(0, "a", 3)]), [[1, 2, 3]])
    np.testing.assert_array_equal(_step(fs, [(0, "a", 4)]), [[2, 3, 4]])
    full = fs(AgentData([0], ["a"], {"obs": np.array([[5, -5]], np.float32)}))["obs"]
    np.testing.assert_array_equal(full, [[[3, -3], [4, -4], [5, -5]]])


def test_interleaved_envs_and_agents_are_isolated():
    fs = _fs(3)
    got = _step(fs, [(0, "a", 1), (1, "a", 10), (0, "b", 100)])
    np.testing.assert_array_equal(got, [[1, 1, 1], [10, 10, 10], [100, 100, 100]])
    # different order, one agent missing, one new
    got = _step(fs, [(0, "b", 101), (0, "a", 2), (2, "a", 50)])
    np.testing.assert_array_equal(got, [[100, 100, 101], [1, 1, 2], [50, 50, 50]])
    got = _step(fs, [(1, "a", 11), (0, "a", 3), (0, "b", 102)])
    np.testing.assert_array_equal(got, [[10, 10, 11], [1, 2, 3], [100, 101, 102]])


def test_reset_clears_only_that_env_and_pads_again():
    fs = _fs(3)
    _step(fs, [(0, "a", 1), (1, "a", 10)])
    _step(fs, [(0, "a", 2), (1, "a", 11)])
    fs.reset(0)
    got = _step(fs, [(0, "a", 7), (1, "a", 12)])
    np.testing.assert_array_equal(got, [[7, 7, 7], [10, 11, 12]])
    got = _step(fs, [(1, "a", 13), (0, "a", 8)])
    np.testing.assert_array_equal(got, [[11, 12, 13], [7, 7, 8]])


def test_same_rows_every_step_fast_path_and_growth():
    fs = _fs(2)
    keys = [(e, "a", 0) for e in range(20)]
    for t in range(3):
        got = _step(fs, [(e, a, t * 100 + e) for e, a, _ in keys])
    np.testing.assert_array_equal(got[:, 0], 100 + np.arange(20))
    np.testing.assert_array_equal(got[:, 1], 200 + np.arange(20))


def test_keeps_image_dtype():
    img = gym.spaces.Box(0, 255, (2, 2), np.uint8)
    fs = FrameStack(ConnectorContext(img, gym.spaces.Discrete(2)), num_frames=2)
    assert fs.bind(img).dtype == np.uint8
    out = fs(AgentData([0], ["a"], {"obs": np.full((1, 2, 2), 9, np.uint8)}))["obs"]
    assert out.dtype == np.uint8
    assert out.shape == (1, 2, 2, 2)
