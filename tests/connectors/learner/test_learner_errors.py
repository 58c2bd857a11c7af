"""Bad input to the built-ins: a named error, and the batch exactly as it was."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from learner_fakes import ACT, OBS, ValuePolicy, batch_of, ctx

import rlconnect as rc
from rlconnect.policy import LSTMPolicy, MLPPolicy

ALL = [
    lambda c: rc.GAE(c),
    lambda c: rc.DiscountedReturns(c),
    lambda c: rc.NStepReturns(c),
    lambda c: rc.VTrace(c),
]
IDS = ["GAE", "DiscountedReturns", "NStepReturns", "VTrace"]


@pytest.mark.parametrize("make", ALL, ids=IDS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rewards_name_row_column_and_connector(make, bad: float) -> None:
    batch = batch_of([3, 4], ["cut", "term"])
    r = batch["rewards"].copy()
    r[5] = bad
    batch["rewards"] = r
    before = batch.copy(deep=True)
    conn = make(ctx())
    with pytest.raises(ValueError, match=rf"{conn.name}: column 'rewards' is .* at row 5"):
        conn(batch, ValuePolicy())
    assert batch == before


@pytest.mark.parametrize("make", [ALL[0], ALL[1], ALL[3]], ids=["GAE", "Returns", "VTrace"])
def test_a_non_finite_bootstrap_value_is_named(make) -> None:
    batch = batch_of([3, 2], ["cut", "term"])
    new_obs = batch["new_obs"].copy()
    new_obs[2, 0] = np.inf  # the cut trajectory's last row: its bootstrap value is inf
    batch["new_obs"] = new_obs
    before = batch.copy(deep=True)
    with pytest.raises(ValueError, match=r"bootstrap value .* at row 2"):
        make(ctx())(batch, ValuePolicy())
    assert batch == before


def test_non_finite_recorded_values_are_named() -> None:
    batch = batch_of([3], ["cut"])
    batch["vf_preds"] = np.array([0.0, np.nan, 1.0], np.float32)
    with pytest.raises(ValueError, match=r"GAE: column 'vf_preds' is nan at row 1"):
        rc.GAE(ctx())(batch, ValuePolicy())
    assert "advantages" not in batch


def test_non_contiguous_trajectories_are_refused_not_computed() -> None:
    batch = rc.concat_samples([batch_of([2], ["cut"], eps=[4]), batch_of([2], ["term"], eps=[5])])
    batch = rc.concat_samples([batch, batch_of([1], ["cut"], eps=[4])])
    for make, name in zip(ALL, IDS, strict=True):
        with pytest.raises(ValueError, match=rf"{name}: .*eps_id 4.*not contiguous"):
            make(ctx())(batch, ValuePolicy())


@pytest.mark.parametrize("make", ALL, ids=IDS)
def test_existing_output_columns_are_never_overwritten(make) -> None:
    conn = make(ctx())
    batch = conn(batch_of([3], ["cut"]), ValuePolicy())
    before = batch.copy(deep=True)
    with pytest.raises(ValueError, match="already has"):
        conn(batch, ValuePolicy())
    assert batch == before


@pytest.mark.parametrize(
    ("cls", "params", "match"),
    [
        (rc.GAE, {"gamma": 1.5}, r"GAE: gamma must be in \[0, 1\]"),
        (rc.GAE, {"lambda_": -0.1}, r"lambda_ must be in \[0, 1\]"),
        (rc.GAE, {"gamma": True}, "gamma must be a number"),
        (rc.DiscountedReturns, {"gamma": float("nan")}, r"gamma must be in \[0, 1\]"),
        (rc.NStepReturns, {"n": 0}, "n must be an int >= 1"),
        (rc.NStepReturns, {"n": 2.0}, "n must be an int >= 1"),
        (rc.VTrace, {"clip_rho": 0}, "clip_rho must be > 0"),
        (rc.VTrace, {"clip_c": "1"}, "clip_c must be a number"),
    ],
)
def test_bad_params_are_named(cls, params, match) -> None:
    with pytest.raises(ValueError, match=match):
        cls(ctx(), **params)


def test_missing_columns_are_named() -> None:
    batch = batch_of([2], ["cut"])
    del batch["rewards"]
    with pytest.raises(ValueError, match="GAE needs a 'rewards' column"):
        rc.GAE(ctx())(batch, ValuePolicy())
    batch = batch_of([2], ["cut"])
    with pytest.raises(ValueError, match=r"needs columns \['state_in_0'\]"):
        rc.GAE(ctx())(batch, ValuePolicy(recurrent=True))
    with pytest.raises(ValueError, match="NormalizeAdvantages needs a 'advantages' column"):
        rc.NormalizeAdvantages(ctx())(batch, ValuePolicy())


@pytest.mark.parametrize("cls", [rc.GAE, rc.DiscountedReturns, rc.VTrace])
@pytest.mark.parametrize(
    "policy",
    [MLPPolicy(OBS, ACT, seed=0), LSTMPolicy(OBS, ACT, seed=0)],
    ids=["mlp", "lstm"],
)
def test_check_policy_refuses_a_policy_without_value_head(cls, policy) -> None:
    with pytest.raises(ValueError, match=rf"{cls.__name__} needs state values .*vf_head=True"):
        cls(ctx()).check_policy(policy)
    with_head = type(policy)(OBS, ACT, vf_head=True, seed=0)
    cls(ctx()).check_policy(with_head)


def test_check_policy_refuses_vtrace_without_a_distribution() -> None:
    class ValuesOnly(ValuePolicy):
        def compute_log_likelihoods(self, input_batch, actions):
            return rc.Policy.compute_log_likelihoods(self, input_batch, actions)

    with pytest.raises(ValueError, match=r"VTrace needs 'action_logp'.*ValuesOnly has no action"):
        rc.VTrace(ctx()).check_policy(ValuesOnly())
    with pytest.raises(ValueError, match=r"VTrace needs state values.*RandomPolicy"):
        rc.VTrace(ctx()).check_policy(rc.RandomPolicy(OBS, ACT))
    rc.VTrace(ctx()).check_policy(MLPPolicy(OBS, gym.spaces.Discrete(3, start=1), vf_head=True))
    rc.NStepReturns(ctx()).check_policy(rc.RandomPolicy(OBS, ACT))  # needs no values
    rc.NormalizeAdvantages(ctx()).check_policy(rc.RandomPolicy(OBS, ACT))


def test_the_pipeline_refuses_at_check_time_naming_the_member() -> None:
    pipe = rc.LearnerConnectorPipeline(ctx(), [rc.GAE(ctx()), rc.NormalizeAdvantages(ctx())])
    with pytest.raises(ValueError, match=r"learner connector 'GAE': GAE needs state values"):
        pipe.check_policy(MLPPolicy(OBS, ACT, seed=0))
