"""The built-ins against plain per-trajectory references, over random batches (hypothesis):
random trajectory lengths and ends (termination, truncation, both, cut), turn-taking agents
of one episode, concatenated batches, recurrent state for the bootstrap."""

from __future__ import annotations

import hypothesis.strategies as st
import learner_reference as ref
import numpy as np
import pytest
from hypothesis import given, settings
from learner_fakes import ValuePolicy, batch_of, ctx

import rlconnect as rc

ENDS = st.sampled_from(["term", "trunc", "both", "cut"])
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw: st.DrawFn) -> tuple[rc.SampleBatch, bool]:
    """A batch of 1-8 trajectories of 1-12 rows; maybe two agents per episode, maybe
    recurrent, maybe two batches concatenated."""
    k = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, 12), min_size=k, max_size=k))
    ends = draw(st.lists(ENDS, min_size=k, max_size=k))
    agents = draw(st.booleans())
    recurrent = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    eps = [i // 2 for i in range(k)] if agents else None
    batch = batch_of(
        lengths,
        ends,
        seed=seed,
        eps=eps,
        agents=[i % 2 for i in range(k)] if agents else None,
        recurrent=recurrent,
    )
    if draw(st.booleans()):  # a second runner's batch, other episodes, concatenated
        more = batch_of([3, 2], ["cut", "term"], seed=seed + 1, eps=[100, 101], recurrent=recurrent)
        if agents:
            more["agent_index"] = np.zeros(len(more), dtype=np.int64)
        batch = rc.concat_samples([batch, more])
    return batch, recurrent


GAMMA = st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])


@SETTINGS
@given(batches(), GAMMA, st.sampled_from([0.0, 0.7, 0.95, 1.0]), st.booleans())
def test_gae(data: tuple[rc.SampleBatch, bool], gamma: float, lam: float, recorded: bool) -> None:
    batch, recurrent = data
    policy = ValuePolicy(recurrent)
    if recorded:  # vf_preds as the sampler recorded them
        batch["vf_preds"] = np.random.default_rng(0).normal(size=len(batch)).astype(np.float32)
    before = batch.copy(deep=True)
    out = rc.GAE(ctx(), gamma=gamma, lambda_=lam)(batch, policy)
    values = batch["vf_preds"] if recorded else None
    expected = ref.gae(before, gamma, lam, recurrent, values)
    np.testing.assert_allclose(out["advantages"], expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(
        out["value_targets"], expected + out["vf_preds"], rtol=1e-5, atol=1e-4
    )
    assert out["advantages"].dtype == np.float32 and out["value_targets"].dtype == np.float32
    n_boot = int((~before["terminateds"])[_last_rows(before)].sum())
    calls = ([] if n_boot == 0 else [n_boot]) if recorded else [len(batch) + n_boot]
    assert policy.value_calls == calls  # ONE call for every value the batch needs
    for k in before:
        np.testing.assert_array_equal(out[k], before[k])  # existing columns untouched


def _last_rows(batch: rc.SampleBatch) -> list[int]:
    return [rows[-1] for rows in ref.trajectories(batch)]


@SETTINGS
@given(batches(), GAMMA)
def test_discounted_returns(data: tuple[rc.SampleBatch, bool], gamma: float) -> None:
    batch, recurrent = data
    out = rc.DiscountedReturns(ctx(), gamma=gamma)(batch, ValuePolicy(recurrent))
    expected = ref.returns(batch, gamma, recurrent)
    np.testing.assert_allclose(out["returns"], expected, rtol=1e-5, atol=1e-4)
    assert out["returns"].dtype == np.float32


@SETTINGS
@given(batches(), st.integers(1, 14), GAMMA)
def test_n_step_returns(data: tuple[rc.SampleBatch, bool], n: int, gamma: float) -> None:
    batch, recurrent = data
    batch["new_obs"] = {"pos": batch["new_obs"], "flag": (batch["new_obs"][:, 0] > 0)}
    out = rc.NStepReturns(ctx(), n=n, gamma=gamma)(batch, ValuePolicy(recurrent))
    sums, last, disc = ref.n_step(batch, n, gamma)
    np.testing.assert_allclose(out["n_step_rewards"], sums, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["n_step_discount"], disc, rtol=1e-6)
    np.testing.assert_array_equal(out["n_step_new_obs"]["pos"], batch["new_obs"]["pos"][last])
    np.testing.assert_array_equal(out["n_step_new_obs"]["flag"], batch["new_obs"]["flag"][last])
    assert out["n_step_rewards"].dtype == np.float32 and out["n_step_discount"].dtype == np.float32
    if recurrent:
        np.testing.assert_array_equal(out["n_step_state_out_0"], batch["state_out_0"][last])
    else:
        assert "n_step_state_out_0" not in out


@SETTINGS
@given(
    batches(),
    GAMMA,
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([1.0, 3.0]),
)
def test_vtrace(
    data: tuple[rc.SampleBatch, bool], gamma: float, rho: float, c: float, pg: float
) -> None:
    batch, recurrent = data
    policy = ValuePolicy(recurrent)
    out = rc.VTrace(ctx(), gamma=gamma, clip_rho=rho, clip_c=c, clip_pg_rho=pg)(batch, policy)
    target = policy.compute_log_likelihoods({"obs": batch["obs"]}, batch["actions"])
    vs, adv = ref.vtrace(batch, target.astype(np.float64), gamma, rho, c, pg, recurrent)
    np.testing.assert_allclose(out["vtrace_targets"], vs, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out["pg_advantages"], adv, rtol=1e-5, atol=1e-4)
    n_boot = int((~batch["terminateds"])[_last_rows(batch)].sum())
    assert policy.value_calls == [len(batch) + n_boot]


@SETTINGS
@given(batches())
def test_normalize_advantages(data: tuple[rc.SampleBatch, bool]) -> None:
    batch, recurrent = data
    out = rc.GAE(ctx())(batch, ValuePolicy(recurrent))
    raw = out["advantages"]
    norm = rc.NormalizeAdvantages(ctx())(out, ValuePolicy(recurrent))["advantages"]
    a = raw.astype(np.float64)
    np.testing.assert_allclose(norm, (a - a.mean()) / max(a.std(), 1e-8), rtol=1e-5, atol=1e-5)
    assert norm.dtype == np.float32 and norm is not raw


def test_normalize_equal_advantages_gives_zeros() -> None:
    batch = rc.SampleBatch({"advantages": np.full(4, 3.0, np.float32)})
    out = rc.NormalizeAdvantages(ctx())(batch, ValuePolicy())
    np.testing.assert_array_equal(out["advantages"], np.zeros(4, np.float32))


def test_gae_bootstraps_a_recurrent_policy_from_state_out() -> None:
    """Changing the last row's state_out changes the bootstrap, state_in does not."""
    batch = batch_of([3], ["cut"], recurrent=True)
    base = rc.GAE(ctx(), gamma=0.9, lambda_=1.0)(batch.copy(), ValuePolicy(True))["advantages"]
    shifted = batch.copy()
    so = batch["state_out_0"].copy()
    so[2, 0] += 1.0
    shifted["state_out_0"] = so
    moved = rc.GAE(ctx(), gamma=0.9, lambda_=1.0)(shifted, ValuePolicy(True))["advantages"]
    np.testing.assert_allclose(moved - base, [0.9**3, 0.9**2, 0.9], rtol=1e-5)


@pytest.mark.parametrize("end", ["term", "both"])
def test_termination_bootstraps_zero_even_when_truncated_too(end: str) -> None:
    batch = batch_of([2], [end])
    out = rc.DiscountedReturns(ctx(), gamma=0.5)(batch, ValuePolicy())
    r = batch["rewards"].astype(np.float64)
    np.testing.assert_allclose(out["returns"], [r[0] + 0.5 * r[1], r[1]], rtol=1e-6)


def test_empty_batches_get_empty_columns() -> None:
    batch = batch_of([2], ["cut"], recurrent=True)[0:0]
    policy = ValuePolicy(True)
    pipe = rc.LearnerConnectorPipeline(
        ctx(),
        [rc.GAE(ctx()), rc.NormalizeAdvantages(ctx()), rc.DiscountedReturns(ctx())],
    )
    out = pipe(batch, policy)
    out = rc.NStepReturns(ctx())(rc.VTrace(ctx())(out, policy), policy)
    for col in ("advantages", "returns", "vtrace_targets", "n_step_rewards", "n_step_state_out_0"):
        assert len(out[col]) == 0


def test_compressed_observations_give_the_same_signal() -> None:
    """Batches with LZ4-compressed obs / new_obs (Atari presets) are read, not refused."""
    from rlconnect.batches.compressed import CompressedColumn

    batch = batch_of([4, 3, 5], ["cut", "term", "trunc"])
    plain = rc.GAE(ctx(), gamma=0.9)(batch.copy(), ValuePolicy())
    packed = batch.copy()
    del packed["obs"], packed["new_obs"]
    packed["obs"] = CompressedColumn.compress(batch["obs"])
    packed["new_obs"] = CompressedColumn.compress(batch["new_obs"])
    assert packed.compressed_columns() == ["obs", "new_obs"]
    out = rc.GAE(ctx(), gamma=0.9)(packed, ValuePolicy())
    np.testing.assert_array_equal(out["advantages"], plain["advantages"])
    np.testing.assert_array_equal(out["vf_preds"], plain["vf_preds"])


def _unusual(col: np.ndarray, dtype: str) -> np.ndarray:
    """``col`` in ``dtype``, read-only and strided (every other element of a larger array)."""
    wide = np.repeat(col.astype(dtype), 2)[::2]
    wide.flags.writeable = False
    return wide


@pytest.mark.parametrize("connector", ["GAE", "DiscountedReturns"])
def test_columns_in_any_byte_order_width_and_layout_give_the_same_signal(connector: str) -> None:
    """Big-endian, float16, read-only and strided columns are read as the values they hold
    (the compiled passes take native arrays: others are converted, not refused)."""
    batch = batch_of([3, 1, 5, 2], ["term", "trunc", "cut", "both"], seed=3)
    batch["vf_preds"] = np.linspace(-1, 1, len(batch)).astype(np.float16).astype(np.float32)
    odd = batch.copy(deep=True)
    odd["rewards"] = _unusual(batch["rewards"], ">f4")
    odd["vf_preds"] = _unusual(batch["vf_preds"], "f2")
    odd["eps_id"] = _unusual(batch["eps_id"], ">i8")
    odd["t"] = _unusual(batch["t"], ">u2")
    odd["terminateds"] = _unusual(batch["terminateds"], "?")
    make = getattr(rc, connector)
    want = make(ctx(), gamma=0.9)(batch, ValuePolicy(False))
    got = make(ctx(), gamma=0.9)(odd, ValuePolicy(False))
    for name in ("advantages", "value_targets", "returns"):
        if name in want:
            np.testing.assert_array_equal(got[name], want[name])
