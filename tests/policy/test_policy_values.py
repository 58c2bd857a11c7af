"""Policy.compute_values and compute_log_likelihoods: what learner connectors ask a policy."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_models import LinearModel

import rlconnect as rc
from rlconnect.policy import LSTMPolicy, MLPPolicy, TorchPolicy

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
ACT = gym.spaces.Discrete(4)


def _obs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, 3)).astype(np.float32)


def _rng_states(policy: TorchPolicy) -> tuple:
    return (policy.np_random.bit_generator.state, policy.torch_random.get_state().clone())


@pytest.mark.parametrize("rows", [5, 5000])  # the numpy path and the torch path
def test_mlp_values_equal_the_recorded_vf_preds_and_draw_nothing(rows: int) -> None:
    p = MLPPolicy(OBS, ACT, vf_head=True, seed=3)
    obs = _obs(rows)
    _, _, extra = p.compute_actions({"obs": obs})
    before = _rng_states(p)
    values = p.compute_values({"obs": obs})
    assert values.dtype == np.float32 and values.shape == (rows,)
    np.testing.assert_allclose(values, extra["vf_preds"], rtol=0, atol=1e-6)
    after = _rng_states(p)
    assert before[0] == after[0] and torch.equal(before[1], after[1])


@pytest.mark.parametrize("rows", [4, 5000])
def test_lstm_values_are_one_step_from_state_in(rows: int) -> None:
    p = LSTMPolicy(OBS, ACT, vf_head=True, cell_size=8, hiddens=[16], seed=1)
    rng = np.random.default_rng(2)
    batch = {
        "obs": _obs(rows),
        "state_in_0": rng.normal(size=(rows, 8)).astype(np.float32),
        "state_in_1": rng.normal(size=(rows, 8)).astype(np.float32),
    }
    _, _, extra = p.compute_actions(batch)
    before = _rng_states(p)
    values = p.compute_values(batch)
    assert values.dtype == np.float32 and values.shape == (rows,)
    np.testing.assert_allclose(values, extra["vf_preds"], rtol=0, atol=1e-5)
    after = _rng_states(p)
    assert before[0] == after[0] and torch.equal(before[1], after[1])


def test_torch_policy_values_come_from_the_models_second_output() -> None:
    p = TorchPolicy(LinearModel(3, 4, value=True), OBS, ACT, seed=0)
    obs = _obs(6)
    _, _, extra = p.compute_actions({"obs": obs})
    np.testing.assert_array_equal(p.compute_values({"obs": obs}), extra["vf_preds"])


@pytest.mark.parametrize(
    "policy",
    [
        MLPPolicy(OBS, ACT, seed=0),
        LSTMPolicy(OBS, ACT, seed=0),
        TorchPolicy(LinearModel(3, 4), OBS, ACT, seed=0),
    ],
    ids=["mlp", "lstm", "torch"],
)
def test_a_policy_without_value_head_says_so(policy: rc.Policy) -> None:
    batch = {"obs": _obs(2)}
    for i, s in enumerate(policy.get_initial_state()):
        batch[f"state_in_{i}"] = np.stack([s, s])
    with pytest.raises(NotImplementedError, match=rf"{type(policy).__name__}.*vf_head=True"):
        policy.compute_values(batch)


def test_random_policy_has_neither_values_nor_log_likelihoods() -> None:
    p = rc.RandomPolicy(OBS, ACT, seed=0)
    with pytest.raises(NotImplementedError, match=r"RandomPolicy.*value head"):
        p.compute_values({"obs": _obs(2)})
    with pytest.raises(NotImplementedError, match=r"RandomPolicy.*action distribution"):
        p.compute_log_likelihoods({"obs": _obs(2)}, np.zeros(2, np.int64))


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(4, start=2),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Box(-1, 1, (2,)),
    ],
    ids=["discrete", "multidiscrete", "box"],
)
def test_log_likelihoods_equal_the_recorded_action_logp(space: gym.Space) -> None:
    p = MLPPolicy(OBS, space, seed=4)
    obs = _obs(50)
    actions, _, extra = p.compute_actions({"obs": obs})
    before = _rng_states(p)
    logp = p.compute_log_likelihoods({"obs": obs}, actions)
    assert logp.dtype == np.float32 and logp.shape == (50,)
    np.testing.assert_allclose(logp, extra["action_logp"], rtol=1e-5, atol=1e-5)
    after = _rng_states(p)
    assert before[0] == after[0] and torch.equal(before[1], after[1])
