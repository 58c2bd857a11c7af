"""Connectors that buffer the policy's output: PrevActionsRewards and StateBuffer."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlconnect.connectors import (
    ActionData,
    AgentConnectorPipeline,
    AgentData,
    AgentLambda,
    ClipReward,
    ConnectorContext,
    PrevActionsRewards,
    StateBuffer,
)
from rlconnect.connectors.registry import register_lambda

OBS = gym.spaces.Box(-1, 1, (1,), np.float32)
NEG = "test_buffers_negate"
register_lambda(NEG, np.negative, override=True)


def _rows(keys, rewards=None):
    cols = {"obs": np.zeros((len(keys), 1), np.float32)}
    if rewards is not None:
        cols["rewards"] = np.asarray(rewards, np.float32)
    return AgentData([k[0] for k in keys], [k[1] for k in keys], cols)


def _out(keys, **cols):
    return ActionData([k[0] for k in keys], [k[1] for k in keys], cols)


def test_prev_actions_rewards_discrete_through_on_policy_output():
    ctx = ConnectorContext(OBS, gym.spaces.Discrete(5, start=1))
    c = PrevActionsRewards(ctx)
    keys = [(0, "a"), (1, "a"), (0, "b")]
    d = c(_rows(keys, rewards=[9, 9, 9]))
    np.testing.assert_array_equal(d["prev_actions"], [1, 1, 1])  # Discrete "zero" is start
    np.testing.assert_array_equal(d["prev_rewards"], [0, 0, 0])  # episode start
    c.on_policy_output(_out(keys, actions=np.array([2, 3, 4])))
    d = c(_rows([(0, "b"), (0, "a"), (2, "a")], rewards=[0.5, -1, 3]))
    np.testing.assert_array_equal(d["prev_actions"], [4, 2, 1])
    np.testing.assert_array_equal(d["prev_rewards"], [0.5, -1, 0])
    assert d["prev_rewards"].dtype == np.float32


def test_prev_actions_box_reset_and_torch_actions():
    ctx = ConnectorContext(OBS, gym.spaces.Box(-2, 2, (2,), np.float32))
    c = PrevActionsRewards(ctx)
    keys = [(0, "a"), (1, "a")]
    c(_rows(keys))
    c.on_policy_output(_out(keys, actions=torch.tensor([[1.0, 2.0], [3.0, 4.0]])))
    c.reset(0)
    d = c(_rows(keys, rewards=[1, 2]))
    np.testing.assert_array_equal(d["prev_actions"], [[0, 0], [3, 4]])
    np.testing.assert_array_equal(d["prev_rewards"], [0, 2])
    assert "rewards" in d  # the original column is kept


def test_prev_actions_dict_space_and_unknown_rows_ignored():
    space = gym.spaces.Dict({"m": gym.spaces.Discrete(3), "x": gym.spaces.Box(0, 1, (1,))})
    c = PrevActionsRewards(ConnectorContext(OBS, space))
    c(_rows([(0, "a")]))
    acts = {"m": np.array([2, 1]), "x": np.array([[0.5], [0.7]])}
    c.on_policy_output(_out([(0, "a"), (5, "z")], actions=acts))  # (5, "z") never seen
    d = c(_rows([(0, "a"), (5, "z")]))
    np.testing.assert_array_equal(d["prev_actions"]["m"], [2, 0])
    np.testing.assert_allclose(d["prev_actions"]["x"], [[0.5], [0.0]])


def _closing(keys, rewards):
    """The rows an agent pipeline gets for agents that ended without an observation."""
    rew = np.asarray(rewards, np.float64)
    return AgentData([k[0] for k in keys], [k[1] for k in keys], {"rewards": rew})


def test_prev_actions_rewards_closing_row_is_the_next_row_and_changes_nothing():
    ctx = ConnectorContext(OBS, gym.spaces.Dict({"m": gym.spaces.Discrete(3, start=1)}))
    negate = AgentLambda(ctx, fn=NEG, column="rewards")
    pipe = AgentConnectorPipeline(
        ctx, [PrevActionsRewards(ctx), ClipReward(ctx, limit=1.0), negate]
    )
    keys = [(0, "a"), (1, "a")]
    pipe(_rows(keys, rewards=[0, 0]))
    pipe.on_policy_output(_out(keys, actions={"m": np.array([2, 3])}))
    d = pipe.closing_row(_closing([(1, "a"), (0, "a"), (0, "new")], [5.0, -0.5, 2.0]))
    assert "obs" not in d  # nothing observed, nothing made up
    np.testing.assert_array_equal(d["prev_actions"]["m"], [3, 2, 1])  # start: never acted
    np.testing.assert_array_equal(d["prev_rewards"], [5.0, -0.5, 0.0])  # before the clip
    assert d["prev_rewards"].dtype == np.float32
    np.testing.assert_array_equal(d["rewards"], [-1.0, 0.5, -1.0])  # clipped, then "neg"
    again = pipe(_rows([(0, "a"), (0, "new")], rewards=[1, 1]))  # the state is as it was
    np.testing.assert_array_equal(again["prev_actions"]["m"], [2, 1])
    np.testing.assert_array_equal(again["prev_rewards"], [1.0, 0.0])


def test_closing_row_of_connectors_that_only_observe_is_unchanged():
    ctx = ConnectorContext(OBS, gym.spaces.Discrete(2))
    pipe = AgentConnectorPipeline(ctx, [AgentLambda(ctx, fn=NEG), StateBuffer(_state_ctx())])
    d = pipe.closing_row(_closing([(0, "a")], [3.0]))
    assert list(d.keys()) == ["rewards"] and d["rewards"].tolist() == [3.0]


def _state_ctx():
    init = [np.zeros(2, np.float32), np.full(1, -1.0, np.float32)]
    return ConnectorContext(OBS, gym.spaces.Discrete(2), initial_states=init)


def test_state_buffer_feeds_back_state_out():
    c = StateBuffer(_state_ctx())
    keys = [(0, "a"), (1, "a")]
    d = c(_rows(keys))
    np.testing.assert_array_equal(d["state_in_0"], np.zeros((2, 2)))
    np.testing.assert_array_equal(d["state_in_1"], [[-1], [-1]])
    c.on_policy_output(
        _out(
            keys,
            actions=np.array([0, 1]),
            state_out_0=np.array([[1, 2], [3, 4]]),
            state_out_1=torch.tensor([[5.0], [6.0]]),
        )
    )
    d = c(_rows([(1, "a"), (0, "b"), (0, "a")]))
    np.testing.assert_array_equal(d["state_in_0"], [[3, 4], [0, 0], [1, 2]])
    np.testing.assert_array_equal(d["state_in_1"], [[6], [-1], [5]])
    assert d["state_in_0"].dtype == np.float32


def test_state_buffer_reset_only_that_env_in_a_pipeline():
    ctx = _state_ctx()
    pipe = AgentConnectorPipeline(ctx, [StateBuffer(ctx)])
    keys = [(0, "a"), (1, "a")]
    pipe(_rows(keys))
    pipe.on_policy_output(
        _out(keys, state_out_0=np.ones((2, 2)), state_out_1=np.array([[7.0], [8.0]]))
    )
    pipe.reset(1)
    d = pipe(_rows(keys))
    np.testing.assert_array_equal(d["state_in_1"], [[7], [-1]])


def test_state_buffer_missing_state_out_raises():
    c = StateBuffer(_state_ctx())
    c(_rows([(0, "a")]))
    with pytest.raises(ValueError, match="state_out_0"):
        c.on_policy_output(_out([(0, "a")], actions=np.array([1])))
    with pytest.raises(ValueError, match="shape"):
        c.on_policy_output(
            _out([(0, "a")], state_out_0=np.ones((1, 3)), state_out_1=np.ones((1, 1)))
        )


def test_state_buffer_feed_forward_policy_adds_nothing():
    c = StateBuffer(ConnectorContext(OBS, gym.spaces.Discrete(2)))
    d = c(_rows([(0, "a")]))
    assert sorted(d.keys()) == ["obs"]
    c.on_policy_output(_out([(0, "a")], actions=np.array([1])))
