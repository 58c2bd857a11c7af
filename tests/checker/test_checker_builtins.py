"""Every built-in connector, and both default pipelines, tested through ConnectorTestMixin."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc
from rlconnect.spaces import stack_samples
from rlconnect.testing import ConnectorTestMixin

BOX3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT_BOX = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32))
DICT = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        "mode": gym.spaces.Discrete(3, start=1),
        "bits": gym.spaces.MultiBinary(2),
    }
)
TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(4), gym.spaces.MultiDiscrete([2, 3])))


def _negate(x: Any) -> Any:
    return -x


rc.register_lambda("checker_test_negate", _negate)


def _ctx(obs: gym.Space = BOX3, act: gym.Space = ACT_BOX, **kw: Any) -> rc.ConnectorContext:
    return rc.ConnectorContext(observation_space=obs, action_space=act, **kw)


def _samples(space: gym.Space, n: int = 6, seed: int = 3) -> Any:
    space.seed(seed)
    return stack_samples(space, [space.sample() for _ in range(n)])


def _policy_outputs(n: int = 6) -> np.ndarray:
    """Raw policy outputs for a 2-d Box: partly outside [-1, 1] and the Box bounds."""
    return (np.random.default_rng(0).normal(size=(n, 2)) * 3).astype(np.float32)


class TestFlattenDict(ConnectorTestMixin):
    def make_connector(self):
        return rc.FlattenObservations(_ctx(DICT))


class TestFlattenTuple(ConnectorTestMixin):
    def make_connector(self):
        return rc.FlattenObservations(_ctx(TUPLE))

    def make_observations(self):
        return _samples(TUPLE)


class TestFlattenDiscrete(ConnectorTestMixin):
    def make_connector(self):
        return rc.FlattenObservations(_ctx(gym.spaces.Discrete(5)))


class TestClipRewardSign(ConnectorTestMixin):
    def make_connector(self):
        return rc.ClipReward(_ctx())


class TestClipRewardLimit(ConnectorTestMixin):
    def make_connector(self):
        return rc.ClipReward(_ctx(), limit=0.5)

    def check_options(self):
        return {"rewards": np.array([-3.0, -0.2, 0.0, 0.3, 2.0, 7.0], np.float32)}


class TestMeanStdFilter(ConnectorTestMixin):
    def make_connector(self):
        return rc.MeanStdFilter(_ctx(gym.spaces.Box(-10.0, 10.0, (4,), np.float32)), clip=3.0)

    def check_options(self):
        return {"steps": 4}


class TestMeanStdFilterFrozen(ConnectorTestMixin):
    """Frozen between syncs, saved between two sync points (frozen != totals)."""

    def make_connector(self):
        box = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
        f = rc.MeanStdFilter(_ctx(box), clip=3.0, freeze_between_syncs=True)
        f(rc.AgentData([0, 1], ["a", "a"], {"obs": np.array([[1.0, 2, 3, 4], [3, 2, 1, 0]])}))
        f.refreeze()
        f(rc.AgentData([0], ["a"], {"obs": np.array([[5.0, -1, 0, 2]])}))
        assert f.get_statistics()["frozen"]["count"] == 2
        return f

    def check_options(self):
        return {"steps": 4}


class TestFrameStack(ConnectorTestMixin):
    def make_connector(self):
        return rc.FrameStack(_ctx(), num_frames=3)


class TestFrameStackMultiAgent(ConnectorTestMixin):
    """Rows of two agents in the same sub-envs."""

    def make_connector(self):
        return rc.FrameStack(_ctx(), num_frames=2)

    def check_options(self):
        return {"env_ids": [0, 0, 1, 1, 2, 2], "agent_ids": ["a", "b"] * 3}

    def make_observations(self):
        return _samples(BOX3)


class TestPrevActionsRewardsDiscrete(ConnectorTestMixin):
    def make_connector(self):
        return rc.PrevActionsRewards(_ctx(act=gym.spaces.Discrete(4, start=2)))


class TestPrevActionsRewardsBox(ConnectorTestMixin):
    def make_connector(self):
        return rc.PrevActionsRewards(_ctx())


class TestStateBuffer(ConnectorTestMixin):
    def make_connector(self):
        init = [np.zeros(4, np.float32), np.full((2, 2), 0.5, np.float32)]
        return rc.StateBuffer(_ctx(initial_states=init))


class TestAgentLambda(ConnectorTestMixin):
    def make_connector(self):
        return rc.AgentLambda(_ctx(), fn="checker_test_negate", column="obs")


class TestClipActions(ConnectorTestMixin):
    def make_connector(self):
        return rc.ClipActions(_ctx())

    def make_observations(self):
        return _policy_outputs()


class TestUnsquashActions(ConnectorTestMixin):
    def make_connector(self):
        return rc.UnsquashActions(_ctx())

    def make_observations(self):
        return _policy_outputs()


class TestConvertToNumpy(ConnectorTestMixin):
    def make_connector(self):
        return rc.ConvertToNumpy(_ctx())

    def make_observations(self):
        return torch.as_tensor(_samples(ACT_BOX))


class TestImmutableActions(ConnectorTestMixin):
    def make_connector(self):
        return rc.ImmutableActions(_ctx(act=gym.spaces.Discrete(3)))


class TestActionLambda(ConnectorTestMixin):
    def make_connector(self):
        sym = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        return rc.ActionLambda(_ctx(act=sym), fn="checker_test_negate")


class TestDefaultAgentPipelineBox(ConnectorTestMixin):
    def make_pipeline(self):
        config = {"observation_filter": "MeanStdFilter", "clip_rewards": True}
        return rc.default_agent_pipeline(_ctx(config=config))


class TestDefaultAgentPipelineDictFull(ConnectorTestMixin):
    """Flatten, filter, clip, frame stack and state buffer all in one chain."""

    def make_pipeline(self):
        config = {"observation_filter": "MeanStdFilter", "clip_rewards": 1.5, "framestack": 2}
        ctx = _ctx(DICT, config=config, initial_states=[np.zeros(3, np.float32)])
        pipe = rc.default_agent_pipeline(ctx)
        assert pipe.names[-1] == "StateBuffer"
        return pipe


class TestDefaultActionPipeline(ConnectorTestMixin):
    def make_pipeline(self):
        return rc.default_action_pipeline(_ctx(config={"clip_actions": True}))

    def make_observations(self):
        return torch.as_tensor(_policy_outputs())


class TestDefaultActionPipelineDiscrete(ConnectorTestMixin):
    def make_pipeline(self):
        return rc.default_action_pipeline(_ctx(act=gym.spaces.Discrete(5)))
