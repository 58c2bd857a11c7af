"""Pipelines built from registered names, and errors that suggest the name meant (issue 55)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.connectors.registry import get_connector_class

OBS = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


def ctx() -> rc.ConnectorContext:
    return rc.ConnectorContext(OBS, ACT, {})


def test_members_may_be_registered_names_or_name_params_pairs():
    """Before: ``AttributeError: 'str' object has no attribute 'name'``."""
    pipe = rc.AgentConnectorPipeline(ctx(), ["MeanStdFilter", ("FrameStack", {"num_frames": 2})])
    assert pipe.names == ["MeanStdFilter", "FrameStack"]
    assert isinstance(pipe["FrameStack"], get_connector_class("FrameStack"))
    assert pipe.output_space.shape == (2, 3)
    pipe.append("ClipReward")
    pipe.insert_before("FrameStack", ("ClipReward", {"limit": 1.0}))
    assert pipe.names == ["MeanStdFilter", "ClipReward_1", "FrameStack", "ClipReward"]
    assert pipe["ClipReward_1"].to_state()[1]["limit"] == 1.0
    out = pipe(rc.AgentData(np.array([0]), ["a"], {"obs": np.ones((1, 3), np.float32)}))
    assert out["obs"].shape == (1, 2, 3)
    learner = rc.LearnerConnectorPipeline(ctx(), [("GAE", {"gamma": 0.9}), "NormalizeAdvantages"])
    assert learner.names == ["GAE", "NormalizeAdvantages"]


def test_anything_else_is_a_type_error_saying_what_to_pass():
    with pytest.raises(TypeError, match=r"takes connectors, registered connector names"):
        rc.AgentConnectorPipeline(ctx(), [get_connector_class("MeanStdFilter")])
    with pytest.raises(TypeError, match=r"\(name, params\) pairs"):
        rc.AgentConnectorPipeline(ctx(), [("FrameStack", 4)])
    with pytest.raises(TypeError, match="AgentConnectorPipeline takes AgentConnectors"):
        rc.AgentConnectorPipeline(ctx(), ["ClipActions"])  # an action connector


def test_an_unknown_connector_name_suggests_the_close_one_and_lists_the_known():
    with pytest.raises(rc.UnknownConnectorError) as info:
        rc.AgentConnectorPipeline(ctx(), ["MeanStdFiltr"])
    msg = str(info.value)
    assert "no connector registered as 'MeanStdFiltr' (did you mean 'MeanStdFilter'?)" in msg
    assert "FrameStack" in msg and "ClipActions" in msg  # the known names, still listed
    with pytest.raises(rc.UnknownConnectorError, match=r"did you mean 'FrameStack'\?"):
        rc.get_connector("framestack", ctx(), {})
    with pytest.raises(rc.UnknownConnectorError) as info:
        rc.get_connector("Zzzzzz", ctx(), {})
    assert "did you mean" not in str(info.value)  # nothing close: no guess


def test_an_unknown_lambda_name_suggests_the_close_one():
    rc.register_lambda("issue55_double_obs", lambda obs: obs * 2, override=True)
    with pytest.raises(rc.UnknownConnectorError, match=r"did you mean 'issue55_double_obs'\?"):
        rc.get_connector("AgentLambda", ctx(), {"fn": "issue55_dobule_obs", "column": "obs"})
