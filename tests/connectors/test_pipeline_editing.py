"""Pipelines of built-ins: composition checks at build time and the editing operations."""

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.connectors import (
    AgentConnectorPipeline,
    AgentData,
    ClipActions,
    ClipReward,
    ConnectorContext,
    FlattenObservations,
    FrameStack,
    MeanStdFilter,
    registered_connectors,
)

DISC = gym.spaces.Discrete(3)
VEC = gym.spaces.Box(-1, 1, (2,), np.float32)


def _ctx(obs=VEC):
    return ConnectorContext(obs, gym.spaces.Discrete(2))


def test_all_builtins_registered():
    names = set(registered_connectors())
    assert {
        "FlattenObservations",
        "ClipReward",
        "MeanStdFilter",
        "FrameStack",
        "PrevActionsRewards",
        "StateBuffer",
        "AgentLambda",
        "ClipActions",
        "UnsquashActions",
        "ConvertToNumpy",
        "ImmutableActions",
        "ActionLambda",
    } <= names


def test_meanstd_after_discrete_fails_at_build():
    ctx = _ctx(DISC)
    with pytest.raises(ValueError, match=r"'MeanStdFilter'.*Discrete\(3\)") as err:
        AgentConnectorPipeline(ctx, [MeanStdFilter(ctx)])
    assert "FlattenObservations" in str(err.value)  # says how to fix it
    pipe = AgentConnectorPipeline(ctx, [FlattenObservations(ctx), MeanStdFilter(ctx)])
    assert pipe.output_space.shape == (3,)


def test_framestack_after_dict_fails_and_insert_is_undone():
    space = gym.spaces.Dict({"x": VEC})
    ctx = _ctx(space)
    pipe = AgentConnectorPipeline(ctx, [FlattenObservations(ctx)])
    with pytest.raises(ValueError, match=r"'FrameStack'.*Dict"):
        pipe.prepend(FrameStack(ctx, num_frames=2))
    assert pipe.names == ["FlattenObservations"]


def test_edit_operations_and_unique_names():
    ctx = _ctx()
    pipe = AgentConnectorPipeline(ctx, [ClipReward(ctx)])
    assert pipe.append(FrameStack(ctx, num_frames=2)) == "FrameStack"
    assert pipe.append(FrameStack(ctx, num_frames=3)) == "FrameStack_1"
    assert pipe.output_space.shape == (3, 2, 2)
    assert pipe.prepend(MeanStdFilter(ctx)) == "MeanStdFilter"
    assert pipe.insert_after("ClipReward", ClipReward(ctx, limit=1.0)) == "ClipReward_1"
    assert pipe.insert_before("FrameStack", MeanStdFilter(ctx)) == "MeanStdFilter_1"
    assert pipe.names == [
        "MeanStdFilter",
        "ClipReward",
        "ClipReward_1",
        "MeanStdFilter_1",
        "FrameStack",
        "FrameStack_1",
    ]
    removed = pipe.remove("FrameStack")
    assert removed.num_frames == 2
    assert pipe.output_space.shape == (3, 2)
    assert pipe["FrameStack_1"] is pipe[-1]
    state = pipe.to_state()
    again = AgentConnectorPipeline.from_state(ctx, state)
    assert again.names == pipe.names
    d = again(AgentData([0], ["a"], {"obs": np.ones((1, 2), np.float32)}))
    assert d["obs"].shape == (1, 3, 2)


@pytest.mark.parametrize("op", ["insert_before", "insert_after"])
def test_unknown_name_lists_members(op):
    ctx = _ctx()
    pipe = AgentConnectorPipeline(ctx, [ClipReward(ctx), FrameStack(ctx)])
    with pytest.raises(ValueError, match=r"Typo.*\['ClipReward', 'FrameStack'\]"):
        getattr(pipe, op)("Typo", MeanStdFilter(ctx))
    with pytest.raises(ValueError, match="Typo"):
        pipe.remove("Typo")
    with pytest.raises(KeyError):
        pipe["Typo"]
    assert pipe.names == ["ClipReward", "FrameStack"]


def test_action_connector_rejected_by_agent_pipeline():
    ctx = _ctx()
    with pytest.raises(TypeError):
        AgentConnectorPipeline(ctx, [ClipActions(ctx)])


def test_reset_and_eval_reach_members():
    ctx = _ctx()
    pipe = AgentConnectorPipeline(ctx, [MeanStdFilter(ctx), FrameStack(ctx, num_frames=2)])
    keys = ([0, 1], ["a", "a"])
    pipe(AgentData(*keys, {"obs": np.array([[1, 1], [2, 2]], np.float32)}))
    pipe.in_eval()
    assert not pipe["MeanStdFilter"].is_training
    pipe(AgentData(*keys, {"obs": np.array([[3, 3], [4, 4]], np.float32)}))
    assert pipe["MeanStdFilter"].count == 2
    pipe.reset(1)
    d = pipe(AgentData(*keys, {"obs": np.array([[1, 1], [1, 1]], np.float32)}))
    # env 1 restarted: both frames equal; env 0 keeps its previous frame
    np.testing.assert_array_equal(d["obs"][1, 0], d["obs"][1, 1])
    assert not np.array_equal(d["obs"][0, 0], d["obs"][0, 1])
