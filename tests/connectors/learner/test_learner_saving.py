"""Built-in learner connectors are registered by name and saved as params, never pickled."""

from __future__ import annotations

import json

import numpy as np
from learner_fakes import ValuePolicy, batch_of, ctx

import rlconnect as rc
from rlconnect.connectors import get_connector

BUILTINS = {
    "GAE": {"gamma": 0.9, "lambda_": 0.8},
    "DiscountedReturns": {"gamma": 0.5},
    "NStepReturns": {"n": 5, "gamma": 0.7},
    "VTrace": {"gamma": 0.95, "clip_rho": 2.0, "clip_c": 0.5, "clip_pg_rho": 1.5},
    "NormalizeAdvantages": {},
}


def test_every_builtin_is_registered_and_rebuilt_from_its_params() -> None:
    assert set(BUILTINS) <= set(rc.registered_connectors())
    for name, params in BUILTINS.items():
        conn = get_connector(name, ctx(), params)
        assert conn.to_state() == (name, params)
        assert type(conn).__name__ == name


def test_a_saved_pipeline_is_json_and_computes_the_same() -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(
        c, [get_connector(n, c, p) for n, p in BUILTINS.items() if n != "VTrace"]
    )
    state = json.loads(json.dumps(pipe.to_state()))
    back = rc.LearnerConnectorPipeline.from_state(c, state)
    assert back.names == pipe.names
    batch = batch_of([4, 3], ["cut", "trunc"])
    a, b = pipe(batch, ValuePolicy()), back(batch, ValuePolicy())
    for col in ("advantages", "value_targets", "returns", "n_step_rewards"):
        np.testing.assert_array_equal(a[col], b[col])


def test_save_pipeline_and_load_pipeline_round_trip(tmp_path) -> None:
    c = ctx()
    pipe = rc.LearnerConnectorPipeline(c, [rc.GAE(c, gamma=0.9), rc.NormalizeAdvantages(c)])
    rc.save_pipeline(pipe, tmp_path / "learner")
    back = rc.load_pipeline(tmp_path / "learner", c)
    assert isinstance(back, rc.LearnerConnectorPipeline)
    assert back.to_state() == pipe.to_state()
