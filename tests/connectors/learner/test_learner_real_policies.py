"""The built-ins with real MLPPolicy / LSTMPolicy value heads on batches their
compute_actions recorded: values recomputed equal the recorded ones, bootstraps of a
recurrent policy start from the last row's state_out."""

from __future__ import annotations

import numpy as np
from learner_fakes import ACT, OBS, ctx

import rlconnect as rc
from rlconnect.policy import LSTMPolicy, MLPPolicy


def _record(policy: rc.Policy, lengths: list[int], ends: list[bool], seed: int = 0):
    """Step ``policy`` through trajectories of random observations, as a runner records
    them (state_in of each step is the previous state_out; zeros at a start)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {}
    for eps, (n, term) in enumerate(zip(lengths, ends)):
        obs = rng.uniform(-1, 1, (n + 1, 2)).astype(np.float32)
        state = [s[None] for s in policy.get_initial_state()]
        for t in range(n):
            step = {"obs": obs[t : t + 1], **{f"state_in_{i}": s for i, s in enumerate(state)}}
            actions, outs, extra = policy.compute_actions(step)
            row = {
                **step,
                "new_obs": obs[t + 1 : t + 2],
                "actions": actions,
                "rewards": rng.normal(size=1).astype(np.float32),
                "eps_id": np.array([eps]),
                "t": np.array([t]),
                "terminateds": np.array([term and t == n - 1]),
                "truncateds": np.array([False]),
                **{f"state_out_{i}": s for i, s in enumerate(outs)},
                **extra,
            }
            for k, v in row.items():
                cols.setdefault(k, []).append(v)
            state = outs
    return rc.SampleBatch({k: np.concatenate(v) for k, v in cols.items()})


def test_mlp_gae_with_recomputed_values_equals_with_recorded_ones() -> None:
    policy = MLPPolicy(OBS, ACT, vf_head=True, seed=1)
    batch = _record(policy, [5, 3, 4], [True, False, False])
    recorded = rc.GAE(ctx(), gamma=0.9, lambda_=0.8)(batch.copy(), policy)
    no_vf = batch.copy()
    del no_vf["vf_preds"]
    recomputed = rc.GAE(ctx(), gamma=0.9, lambda_=0.8)(no_vf, policy)
    np.testing.assert_allclose(recomputed["vf_preds"], batch["vf_preds"], atol=1e-6)
    np.testing.assert_allclose(recomputed["advantages"], recorded["advantages"], atol=1e-5)


def test_lstm_bootstraps_from_state_out_of_the_last_row() -> None:
    policy = LSTMPolicy(OBS, ACT, vf_head=True, cell_size=8, hiddens=[8], seed=2)
    batch = _record(policy, [4, 6], [False, False])
    out = rc.DiscountedReturns(ctx(), gamma=0.5)(batch.copy(), policy)
    last = 3  # the first trajectory's last row: cut, bootstrapped
    step = {
        "obs": batch["new_obs"][last : last + 1],
        "state_in_0": batch["state_out_0"][last : last + 1],
        "state_in_1": batch["state_out_1"][last : last + 1],
    }
    _, _, extra = policy.compute_actions(step)
    r = batch["rewards"][: last + 1].astype(np.float64)
    expected = sum(0.5**i * r[i] for i in range(4)) + 0.5**4 * float(extra["vf_preds"][0])
    np.testing.assert_allclose(out["returns"][0], expected, rtol=1e-5)


def test_lstm_gae_recomputed_values_match_the_recorded_ones() -> None:
    policy = LSTMPolicy(OBS, ACT, vf_head=True, cell_size=8, hiddens=[8], seed=3)
    batch = _record(policy, [3, 5], [True, False])
    no_vf = batch.copy()
    del no_vf["vf_preds"]
    out = rc.GAE(ctx(), gamma=0.99, lambda_=0.95)(no_vf, policy)
    np.testing.assert_allclose(out["vf_preds"], batch["vf_preds"], atol=1e-5)
    reference = rc.GAE(ctx(), gamma=0.99, lambda_=0.95)(batch.copy(), policy)["advantages"]
    np.testing.assert_allclose(out["advantages"], reference, atol=1e-5)
