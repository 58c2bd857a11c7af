"""AgentLambda and ActionLambda: registered functions applied to a whole column."""

import gymnasium as gym
import numpy as np
import pytest

import rlconnect.connectors as rcc
from rlconnect.connectors import (
    ActionData,
    ActionLambda,
    AgentConnectorPipeline,
    AgentData,
    AgentLambda,
    ConnectorContext,
)
from rlconnect.errors import UnknownConnectorError

CTX = ConnectorContext(gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(3))
CALLS = []


def _double(x):
    CALLS.append(len(x))
    return x * 2


rcc.register_lambda("test_lambdas_double", _double)
rcc.register_lambda("test_lambdas_plus_one", lambda a: a + 1)


def test_agent_lambda_maps_whole_column_once():
    CALLS.clear()
    c = AgentLambda(CTX, fn="test_lambdas_double")
    d = c(AgentData([0, 1, 2], ["a"] * 3, {"obs": np.ones((3, 2), np.float32)}))
    np.testing.assert_array_equal(d["obs"], np.full((3, 2), 2.0))
    assert CALLS == [3]  # one call for all rows
    assert c.bind(CTX.observation_space) == CTX.observation_space


def test_agent_lambda_other_column_and_state():
    c = AgentLambda(CTX, fn="test_lambdas_plus_one", column="rewards")
    d = c(AgentData([0], ["a"], {"obs": np.zeros((1, 2)), "rewards": np.array([1.5])}))
    np.testing.assert_array_equal(d["rewards"], [2.5])
    assert c.to_state() == ("AgentLambda", {"fn": "test_lambdas_plus_one", "column": "rewards"})
    pipe = AgentConnectorPipeline(CTX, [c])
    again = AgentConnectorPipeline.from_state(CTX, pipe.to_state())
    assert again["AgentLambda"].column == "rewards"


def test_unknown_lambda_lists_registered():
    with pytest.raises(UnknownConnectorError, match="test_lambdas_double"):
        AgentLambda(CTX, fn="nope")
    with pytest.raises(UnknownConnectorError, match="nope"):
        ActionLambda(CTX, fn="nope")


def test_action_lambda():
    c = ActionLambda(CTX, fn="test_lambdas_plus_one")
    d = c(ActionData([0, 1], ["a", "b"], {"actions": np.array([0, 1])}))
    np.testing.assert_array_equal(d["actions"], [1, 2])
