"""check_pipeline: negative controls (each broken connector fails its check, named) and API."""

from __future__ import annotations

import unittest
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.checker import (
    CHECKS,
    CheckReport,
    PipelineCheckError,
    check_eval_freezes_statistics,
    check_isolation_and_reset,
    check_output_in_space,
    check_pipeline,
    check_save_load_reproduces,
)
from rlconnect.connectors.base import AgentConnector, AgentData, ObservationConnector
from rlconnect.testing import ConnectorTestMixin

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
WIDE = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


def _ctx(**kw: Any) -> rc.ConnectorContext:
    return rc.ConnectorContext(BOX, gym.spaces.Discrete(2), **kw)


# -- deliberately broken connectors -----------------------------------------------------------


@rc.register_connector("CheckerTestOutOfSpace")
class OutOfSpace(ObservationConnector):
    """Declares its input space (identity) but scales observations out of it."""

    def transform(self, obs: np.ndarray) -> np.ndarray:
        return obs * 10.0


class _PerKeyMemory(AgentConnector):
    """Adds the previous observation of the row's key (subclasses break the keying)."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.last: dict[Any, np.ndarray] = {}

    def output_space(self, input_space: gym.Space) -> gym.Space:
        return WIDE

    def key(self, row: int, env_id: int, agent_id: Any) -> Any:
        return (env_id, agent_id)

    def __call__(self, data: AgentData) -> AgentData:
        obs = np.asarray(data["obs"], np.float32)
        keys = [self.key(i, *k) for i, k in enumerate(data.row_keys())]
        prev = np.stack([self.last.get(k, np.zeros(3, np.float32)) for k in keys])
        for k, o in zip(keys, obs):
            self.last[k] = o
        data["obs"] = obs + 0.5 * prev
        return data

    def reset(self, env_id: int) -> None:
        self.last = {k: v for k, v in self.last.items() if k[0] != env_id}


@rc.register_connector("CheckerTestKeyedByAgent")
class KeyedByAgent(_PerKeyMemory):
    """Leaks across sub-envs: state keyed by agent id only."""

    def key(self, row: int, env_id: int, agent_id: Any) -> Any:
        return (agent_id,)

    def reset(self, env_id: int) -> None:
        self.last.clear()


@rc.register_connector("CheckerTestKeyedByPosition")
class KeyedByPosition(_PerKeyMemory):
    """State keyed by row position (an RLlib anti-pattern)."""

    def key(self, row: int, env_id: int, agent_id: Any) -> Any:
        return (env_id, row)


@rc.register_connector("CheckerTestResetClearsAll")
class ResetClearsAll(_PerKeyMemory):
    def reset(self, env_id: int) -> None:
        self.last.clear()


@rc.register_connector("CheckerTestResetForgets")
class ResetDoesNothing(_PerKeyMemory):
    def reset(self, env_id: int) -> None:
        pass


@rc.register_connector("CheckerTestRunningMean")
class RunningMean(ObservationConnector):
    """Subtracts a running mean; ``respect_eval=False`` keeps updating in eval mode."""

    def __init__(self, ctx: Any, respect_eval: bool = True, save_all: bool = True) -> None:
        super().__init__(ctx, respect_eval=respect_eval, save_all=save_all)
        self.mean = np.zeros(3)
        self.count = 0

    def output_space(self, input_space: gym.Space) -> gym.Space:
        return WIDE

    def transform(self, obs: np.ndarray) -> np.ndarray:
        if self.is_training or not self.params["respect_eval"]:
            self.count += len(obs)
            self.mean = self.mean + (obs.sum(0) - len(obs) * self.mean) / self.count
        return (obs - self.mean).astype(np.float32)

    def get_statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"count": self.count}
        if self.params["save_all"]:  # the broken variant forgets to save its mean
            stats["mean"] = self.mean.copy()
        return stats

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        self.count = int(stats["count"])
        if "mean" in stats:
            self.mean = np.asarray(stats["mean"], np.float64).copy()


class Unregistered(ObservationConnector):
    def transform(self, obs: np.ndarray) -> np.ndarray:
        return obs


# -- negative controls: each fails the right check, naming the member ------------------------


def _fails(fn: Any, pipe: Any, check: str, member: str, *, obs: Any = None) -> str:
    with pytest.raises(PipelineCheckError) as info:
        fn(pipe, obs)
    err = info.value
    assert err.check == check
    assert err.member == member
    msg = str(err)
    assert check in msg
    assert repr(member) in msg
    return msg


def test_output_outside_declared_space_is_named():
    ctx = _ctx()
    pipe = rc.AgentConnectorPipeline(ctx, [rc.ClipReward(ctx), OutOfSpace(ctx)])
    msg = _fails(check_output_in_space, pipe, "output_in_space", "CheckerTestOutOfSpace")
    assert "outside [-1.0, 1.0]" in msg
    _fails(check_pipeline, pipe, "output_in_space", "CheckerTestOutOfSpace")


@pytest.mark.parametrize(
    ("cls", "phrase"),
    [
        (KeyedByAgent, "fed together with"),
        (KeyedByPosition, "fed together with"),
        (ResetClearsAll, "reset(0) changed the state of key (1, 'agent0')"),
        (ResetDoesNothing, "after reset(0), key (0, 'agent0') differs from a fresh"),
    ],
)
def test_state_leaks_and_bad_resets_are_named(cls: type, phrase: str):
    ctx = _ctx()
    pipe = rc.AgentConnectorPipeline(ctx, [rc.FrameStack(ctx, num_frames=1)])
    pipe.insert_before("FrameStack", cls(ctx))
    msg = _fails(check_isolation_and_reset, pipe, "isolation_and_reset", cls.registered_name)
    assert phrase in msg
    _fails(check_pipeline, pipe, "isolation_and_reset", cls.registered_name)


def test_per_key_memory_done_right_passes():
    """The base of the broken ones, keyed by (env_id, agent_id): the positive control."""
    rc.register_connector("CheckerTestPerKeyMemory", _PerKeyMemory)
    report = check_pipeline(_PerKeyMemory(_ctx()))
    assert report.checks == CHECKS


def test_statistics_updating_in_eval_are_named():
    ctx = _ctx()
    pipe = rc.AgentConnectorPipeline(ctx, [RunningMean(ctx, respect_eval=False)])
    msg = _fails(
        check_eval_freezes_statistics, pipe, "eval_freezes_statistics", "CheckerTestRunningMean"
    )
    assert "changed the statistics" in msg
    _fails(check_pipeline, pipe, "eval_freezes_statistics", "CheckerTestRunningMean")
    # the isolation check runs in eval mode; it points at the real cause
    msg = _fails(check_isolation_and_reset, pipe, "isolation_and_reset", "CheckerTestRunningMean")
    assert "eval_freezes_statistics" in msg


def test_incomplete_saved_state_is_named():
    ctx = _ctx()
    pipe = rc.AgentConnectorPipeline(ctx, [rc.ClipReward(ctx), RunningMean(ctx, save_all=False)])
    msg = _fails(check_save_load_reproduces, pipe, "save_load_reproduces", "CheckerTestRunningMean")
    assert "outputs differ (original vs loaded)" in msg
    assert "column 'obs'" in msg


@rc.register_connector("CheckerTestHiddenMax")
class HiddenMax(ObservationConnector):
    """Divides by a running max that it never saves: after one batch of the same rows the
    restored copy catches up, so only outputs compared in eval mode can tell."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self.max_abs = np.ones(3)

    def transform(self, obs: np.ndarray) -> np.ndarray:
        if self.is_training:
            self.max_abs = np.maximum(self.max_abs, np.abs(obs).max(axis=0))
        return (obs / self.max_abs).astype(np.float32)


def test_hidden_statistics_are_caught_by_save_load():
    obs = np.random.default_rng(0).uniform(-5, 5, (6, 3)).astype(np.float32)
    ctx = rc.ConnectorContext(gym.spaces.Box(-5.0, 5.0, (3,), np.float32), gym.spaces.Discrete(2))
    msg = _fails(
        check_pipeline, HiddenMax(ctx), "save_load_reproduces", "CheckerTestHiddenMax", obs=obs
    )
    assert "eval mode" in msg


def test_unregistered_connector_fails_save_load():
    msg = _fails(check_pipeline, Unregistered(_ctx()), "save_load_reproduces", "Unregistered")
    assert "register_connector" in msg


def test_correct_running_mean_passes():
    """Positive control for the three RunningMean defects above."""
    assert isinstance(check_pipeline(RunningMean(_ctx())), CheckReport)


# -- API --------------------------------------------------------------------------------------


def test_report_lists_checks_and_members():
    ctx = _ctx(config={"observation_filter": "MeanStdFilter", "clip_rewards": True})
    obs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    report = check_pipeline(rc.default_agent_pipeline(ctx), obs, steps=2)
    assert report.checks == CHECKS
    assert report.members == ("MeanStdFilter", "ClipReward")
    assert (report.rows, report.steps, report.kind) == (4, 2, "AgentConnectorPipeline")
    assert "passed output_in_space" in str(report)


def test_the_checked_pipeline_is_not_modified():
    ctx = _ctx(config={"observation_filter": "MeanStdFilter", "framestack": 2})
    pipe = rc.default_agent_pipeline(ctx)
    before = pipe.get_statistics()
    check_pipeline(pipe)
    after = pipe.get_statistics()
    assert float(after["MeanStdFilter"]["count"]) == float(before["MeanStdFilter"]["count"]) == 0
    assert pipe.is_training


def test_bad_inputs_raise_value_errors():
    pipe = rc.default_agent_pipeline(_ctx())
    with pytest.raises(PipelineCheckError, match=r"inputs failed.*do not fit"):
        check_pipeline(pipe, np.full((2, 3), 5.0, np.float32))
    with pytest.raises(PipelineCheckError, match="distinct"):
        check_pipeline(pipe, np.zeros((2, 3), np.float32), env_ids=[0, 0])
    with pytest.raises(ValueError, match="steps"):
        check_pipeline(pipe, steps=0)
    with pytest.raises(TypeError, match="connector or a pipeline"):
        check_pipeline(object())
    with pytest.raises(TypeError, match="unknown check options"):
        check_output_in_space(pipe, None, step=3)


def test_mixin_fails_for_a_broken_connector():
    class Broken(ConnectorTestMixin):
        def make_connector(self):
            return OutOfSpace(_ctx())

    with pytest.raises(PipelineCheckError, match="CheckerTestOutOfSpace"):
        Broken().test_output_in_space()
    Broken().test_save_load_reproduces()  # only the space is wrong


def test_mixin_needs_a_factory():
    with pytest.raises(NotImplementedError, match="make_pipeline"):
        ConnectorTestMixin().test_output_in_space()


class TestMixinUnderUnittest(ConnectorTestMixin, unittest.TestCase):
    """The mixin also works with unittest.TestCase."""

    def make_connector(self):
        return rc.FrameStack(_ctx(), num_frames=2)
