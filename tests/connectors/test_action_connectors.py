"""Action connectors: ClipActions, UnsquashActions, ConvertToNumpy, ImmutableActions."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlconnect.connectors import (
    ActionConnectorPipeline,
    ActionData,
    ClipActions,
    ConnectorContext,
    ConvertToNumpy,
    ImmutableActions,
    UnsquashActions,
)

BOX = gym.spaces.Box(np.array([0, -10], np.float32), np.array([1, 10], np.float32), (2,))
OBS = gym.spaces.Box(-1, 1, (1,), np.float32)


def _ctx(act=BOX):
    return ConnectorContext(OBS, act)


def _data(actions, **cols):
    n = len(actions) if not isinstance(actions, dict) else len(next(iter(actions.values())))
    return ActionData(list(range(n)), ["a"] * n, {"actions": actions, **cols})


def test_clip_actions_into_bounds():
    got = ClipActions(_ctx())(_data(np.array([[2.0, -20.0], [0.5, 3.0]])))["actions"]
    np.testing.assert_array_equal(got, [[1.0, -10.0], [0.5, 3.0]])
    assert got.dtype == np.float32


def test_clip_and_unsquash_identity_for_non_box():
    act = np.array([0, 2])
    ctx = _ctx(gym.spaces.Discrete(3))
    assert ClipActions(ctx)(_data(act))["actions"] is act
    assert UnsquashActions(ctx)(_data(act))["actions"] is act


def test_unsquash_maps_and_clips_to_bounds():
    raw = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5], [5.0, -7.0]])
    got = UnsquashActions(_ctx())(_data(raw))["actions"]
    np.testing.assert_allclose(got, [[0, -10], [1, 10], [0.5, 5], [1, -10]])
    assert np.all(got >= BOX.low)
    assert np.all(got <= BOX.high)
    # output space is the Box itself
    assert UnsquashActions(_ctx()).bind(BOX) is BOX


def test_action_pipeline_binds_to_action_space():
    pipe = ActionConnectorPipeline(_ctx(), [ConvertToNumpy(_ctx()), UnsquashActions(_ctx())])
    assert pipe.output_space is BOX
    got = pipe(_data(torch.tensor([[1.0, 0.0]])))["actions"]
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, [[1.0, 0.0]])


def test_convert_to_numpy_nests_and_extra_columns():
    data = _data(
        {"x": torch.tensor([[1.0], [2.0]]), "y": (torch.tensor([3, 4]), np.array([5, 6]))},
        state_out_0=torch.zeros(2, 3, requires_grad=True),
        action_logp=np.array([0.1, 0.2]),
    )
    out = ConvertToNumpy(_ctx())(data)
    assert isinstance(out["actions"]["x"], np.ndarray)
    assert isinstance(out["actions"]["y"][0], np.ndarray)
    np.testing.assert_array_equal(out["actions"]["y"][0], [3, 4])
    assert isinstance(out["state_out_0"], np.ndarray)
    assert out["state_out_0"].shape == (2, 3)
    assert isinstance(out["action_logp"], np.ndarray)


def test_immutable_actions_read_only_views():
    raw = np.array([[0.1, 0.2]], np.float32)
    out = ImmutableActions(_ctx())(_data(raw))["actions"]
    assert not out.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        out[0, 0] = 1.0
    assert raw.flags.writeable  # the policy's array is untouched
    nested = ImmutableActions(_ctx())(_data({"a": np.array([1]), "b": np.array([2.0])}))
    assert not nested["actions"]["a"].flags.writeable
    assert not nested["actions"]["b"].flags.writeable
