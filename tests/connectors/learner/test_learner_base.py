"""The learner connector base, its pipeline (editing, saving, running) and check_policy."""

from __future__ import annotations

import numpy as np
import pytest
from learner_fakes import ValuePolicy, batch_of, ctx

import rlconnect as rc
from rlconnect.connectors import get_connector


@rc.register_connector("TestAddColumn")
class AddColumn(rc.LearnerConnector):
    """Adds ``name`` = rewards * scale; fails on a policy named in ``refuse``."""

    def __init__(self, ctx: rc.ConnectorContext, name: str = "scaled", scale: float = 2.0):
        super().__init__(ctx, name=name, scale=scale)
        self.column, self.scale = name, scale

    def __call__(self, batch: rc.SampleBatch, policy: rc.Policy) -> rc.SampleBatch:
        if self.column in batch:
            raise ValueError(f"{self.name}: column {self.column!r} exists")
        batch[self.column] = (batch["rewards"] * self.scale).astype(np.float32)
        return batch

    def check_policy(self, policy: rc.Policy) -> None:
        if getattr(policy, "recurrent", False):
            raise ValueError(f"{self.name} needs a feed-forward policy: use recurrent=False")


def test_the_pipeline_runs_members_in_order_on_a_copy() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [AddColumn(c), AddColumn(c, name="more", scale=3.0)])
    batch = batch_of([3, 2], ["term", "cut"])
    out = pipe(batch, ValuePolicy())
    np.testing.assert_allclose(out["more"], batch["rewards"] * 3, rtol=1e-6)
    assert "scaled" in out and "scaled" not in batch  # the caller's batch gained nothing
    assert pipe.calls == 1 and set(pipe.timings()) == {"TestAddColumn", "TestAddColumn_1"}


def test_a_failing_member_leaves_the_callers_batch_unchanged() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [AddColumn(c), AddColumn(c)])  # same column twice
    batch = batch_of([3], ["term"])
    before = batch.copy(deep=True)
    with pytest.raises(ValueError, match="exists"):
        pipe(batch, ValuePolicy())
    assert batch == before and "scaled" not in batch


def test_an_empty_pipeline_returns_the_batch_itself() -> None:
    batch = batch_of([2], ["cut"])
    assert rc.LearnerConnectorPipeline(ctx())(batch, ValuePolicy()) is batch


def test_editing_is_the_other_pipelines_api() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [AddColumn(c)])
    assert pipe.append(AddColumn(c, name="b")) == "TestAddColumn_1"
    assert pipe.insert_before("TestAddColumn", AddColumn(c, name="a")) == "TestAddColumn_2"
    assert pipe.names == ["TestAddColumn_2", "TestAddColumn", "TestAddColumn_1"]
    removed = pipe.remove("TestAddColumn")
    assert removed.column == "scaled" and len(pipe) == 2
    with pytest.raises(ValueError, match="no connector named 'nope'"):
        pipe.insert_after("nope", AddColumn(c))
    with pytest.raises(TypeError, match="takes LearnerConnectors"):
        pipe.append(rc.ClipReward(c, limit=1.0))  # an agent connector


def test_saved_by_name_and_params_without_pickle() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [AddColumn(c, name="x", scale=0.5)])
    state = pipe.to_state()
    assert state["kind"] == "LearnerConnectorPipeline"
    assert state["members"] == [
        {
            "name": "TestAddColumn",
            "connector": "TestAddColumn",
            "params": {"name": "x", "scale": 0.5},
        }
    ]
    back = rc.LearnerConnectorPipeline.from_state(c, state)
    assert back.names == pipe.names and back[0].scale == 0.5
    name, params = AddColumn(c, scale=4.0).to_state()
    one = get_connector(name, c, params)
    assert isinstance(one, AddColumn) and one.scale == 4.0
    with pytest.raises(ValueError, match="holds a AgentConnectorPipeline"):
        rc.LearnerConnectorPipeline.from_state(c, rc.AgentConnectorPipeline(c).to_state())


def test_check_policy_names_the_member_and_the_fix() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [AddColumn(c)])
    pipe.check_policy(ValuePolicy())
    with pytest.raises(ValueError, match=r"'TestAddColumn'.*recurrent=False"):
        pipe.check_policy(ValuePolicy(recurrent=True))


def test_the_base_call_is_abstract() -> None:
    with pytest.raises(NotImplementedError, match="LearnerConnector must implement"):
        rc.LearnerConnector(ctx())(batch_of([1], ["cut"]), ValuePolicy())


def test_check_pipeline_says_learner_pipelines_are_not_replayed() -> None:
    c = ctx()
    for obj in (rc.LearnerConnectorPipeline(c, [AddColumn(c)]), AddColumn(c)):
        with pytest.raises(TypeError, match=r"learner .* works on whole batches.*check_policy"):
            rc.check_pipeline(obj)
