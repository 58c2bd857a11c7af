"""The built-in learner connectors on batches of torch tensors (the tensor path): the same
columns as on numpy within float32 rounding, on the batch's device, with the numpy path's
errors, and no host read but the one that reads the checks (none when deferred).

CUDA is not here: device "cpu" tensors take the tensor path; the code is device-agnostic.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import tree
from hypothesis import given, settings
from learner_fakes import batch_of, ctx
from tensor_fakes import HostReads, TensorBatch, TorchValuePolicy, host, runner_like, to_tensors

import rlconnect as rc
from rlconnect.connectors.learner.scan import discounted_window_sum, linear_suffix_scan
from rlconnect.connectors.learner.torch_checks import deferred_checks
from rlconnect.connectors.learner.torch_scan import reverse_linear_scan, window_sum


def _connectors() -> list[rc.LearnerConnector]:
    c = ctx()
    return [
        rc.GAE(c, gamma=0.97, lambda_=0.9),
        rc.DiscountedReturns(c, gamma=0.95),
        rc.NStepReturns(c, n=3, gamma=0.9),
        rc.NStepReturns(c, n=100, gamma=0.99),
        rc.VTrace(c, gamma=0.95, clip_rho=1.2, clip_c=0.9, clip_pg_rho=1.1),
    ]


CONNECTORS = _connectors()
IDS = ["GAE", "DiscountedReturns", "NStep3", "NStep100", "VTrace"]


def assert_same(numpy_out: rc.SampleBatch, tensor_out: rc.SampleBatch, before: set[str]) -> None:
    """Every column the connector added (or replaced) is a tensor on the batch's device
    and equals the numpy path's within float32 rounding."""
    added = set(numpy_out.keys()) - before
    assert added and added == set(tensor_out.keys()) - before
    for name in sorted(added):
        for a, b in zip(tree.flatten(numpy_out[name]), tree.flatten(tensor_out[name])):
            assert isinstance(b, torch.Tensor) and b.device.type == "cpu", name
            assert host(b).dtype == a.dtype, name
            np.testing.assert_allclose(host(b), a, rtol=2e-6, atol=2e-6, err_msg=name)


def _both(conn: rc.LearnerConnector, batch: rc.SampleBatch, policy: rc.Policy) -> None:
    tensors = to_tensors(batch)
    assert_same(conn(batch.copy(), policy), conn(tensors.copy(), policy), set(batch.keys()))


@pytest.mark.parametrize("conn", CONNECTORS, ids=IDS)
@pytest.mark.parametrize("agents", [1, 3])
@pytest.mark.parametrize("blocks", [True, False], ids=["rows_per_env", "general"])
def test_runner_layout_equals_numpy(conn: rc.LearnerConnector, agents: int, blocks: bool) -> None:
    batch = runner_like(6, 24, seed=agents, agents=agents, end_p=0.15)
    if not blocks:
        del batch.meta["rows_per_env"]
    _both(conn, batch, TorchValuePolicy())


@pytest.mark.parametrize("conn", [CONNECTORS[0], CONNECTORS[2], CONNECTORS[4]], ids=IDS[::2])
def test_recurrent_bootstrap_and_state_outputs(conn: rc.LearnerConnector) -> None:
    batch = runner_like(4, 16, seed=3, recurrent=True)
    _both(conn, batch, TorchValuePolicy(recurrent=True))


def test_gae_without_vf_preds_adds_them_from_one_call() -> None:
    batch = runner_like(5, 20, seed=4)
    del batch["vf_preds"]
    policy = TorchValuePolicy()
    tensors = to_tensors(batch)
    out = rc.GAE(ctx())(tensors.copy(), policy)
    assert policy.value_calls == [2 * len(batch)]  # rows and bootstraps: one call
    assert_same(rc.GAE(ctx())(batch.copy(), policy), out, set(batch.keys()))


def test_a_policy_answering_tensors_with_numpy_is_taken() -> None:
    batch = runner_like(3, 12, seed=5)
    for conn in CONNECTORS:
        _both(conn, batch, TorchValuePolicy(numpy_out=True))


def test_half_precision_and_integer_inputs() -> None:
    batch = runner_like(3, 12, seed=6)
    batch["rewards"] = batch["rewards"].astype(np.float16)
    batch["vf_preds"] = np.round(batch["vf_preds"] * 4).astype(np.int32)
    for conn in CONNECTORS:
        _both(conn, batch, TorchValuePolicy())


ENDS = st.sampled_from(["term", "trunc", "both", "cut"])


@st.composite
def general_batches(draw: st.DrawFn) -> rc.SampleBatch:
    """1-8 trajectories of 1-12 rows, maybe two agents of one episode in turns."""
    k = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(1, 12), min_size=k, max_size=k))
    ends = draw(st.lists(ENDS, min_size=k, max_size=k))
    two_agents = draw(st.booleans())
    eps = [i // 2 for i in range(k)] if two_agents else None
    agents = [i % 2 for i in range(k)] if two_agents else None
    batch = batch_of(lengths, ends, seed=draw(st.integers(0, 2**16)), eps=eps, agents=agents)
    batch["vf_preds"] = np.asarray(batch["obs"][:, 1] * 2, np.float32)
    return batch


@settings(max_examples=40, deadline=None)
@given(general_batches(), st.sampled_from(range(len(CONNECTORS))))
def test_general_batches_equal_numpy(batch: rc.SampleBatch, which: int) -> None:
    _both(CONNECTORS[which], batch, TorchValuePolicy())


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 20),
    st.integers(1, 3),
    st.floats(0.0, 0.6),
    st.integers(0, 2**16),
    st.sampled_from(range(len(CONNECTORS))),
)
def test_runner_layouts_equal_numpy(
    n: int, steps: int, agents: int, end_p: float, seed: int, which: int
) -> None:
    batch = runner_like(n, steps, seed=seed, agents=agents, end_p=end_p)
    _both(CONNECTORS[which], batch, TorchValuePolicy())


def test_normalize_advantages_equals_numpy_and_writes_a_new_tensor() -> None:
    rng = np.random.default_rng(7)
    adv = rng.normal(3.0, 2.0, 40).astype(np.float32)
    parent = TensorBatch({"advantages": torch.tensor(adv)})
    child = parent[5:30]  # a view of the parent's storage
    out = rc.NormalizeAdvantages(ctx())(child, None)  # type: ignore[arg-type]
    np.testing.assert_array_equal(host(parent["advantages"]), adv)  # untouched
    expected = (adv[5:30] - adv[5:30].mean()) / adv[5:30].std()
    np.testing.assert_allclose(host(out["advantages"]), expected, rtol=1e-5, atol=1e-6)
    assert out["advantages"].dtype == torch.float32
    same = TensorBatch({"advantages": torch.full((4,), 2.5)})
    zeros = rc.NormalizeAdvantages(ctx())(same, None)["advantages"]  # type: ignore[arg-type]
    assert host(zeros).tolist() == [0.0] * 4  # std floored


def test_pipeline_on_tensors_equals_numpy() -> None:
    batch = runner_like(4, 32, seed=8)
    pipe = rc.LearnerConnectorPipeline(ctx(), [rc.GAE(ctx()), rc.NormalizeAdvantages(ctx())])
    policy = TorchValuePolicy()
    tensors = to_tensors(batch)
    assert_same(pipe(batch, policy), pipe(tensors, policy), set(batch.keys()))
    assert "advantages" not in tensors  # the pipeline worked on a copy


# --- host reads ----------------------------------------------------------------------


def _reads(fn: Any) -> list[str]:
    with HostReads() as reads:
        fn()
    return reads.calls


def test_the_counter_counts_what_the_contract_names() -> None:
    x = torch.arange(4.0)
    calls = _reads(lambda: (x.sum().item(), bool(x[0]), x.tolist(), x[x > 1], np.asarray(x)))
    assert calls == ["item", "__bool__", "tolist", "nonzero", "__array__"]


@pytest.mark.parametrize("blocks", [True, False], ids=["rows_per_env", "general"])
def test_no_host_read_with_deferred_checks(blocks: bool) -> None:
    batch = runner_like(8, 16, seed=9, agents=2, recurrent=True)
    if not blocks:
        del batch.meta["rows_per_env"]
    tensors, policy = to_tensors(batch), TorchValuePolicy(recurrent=True)
    pipe = rc.LearnerConnectorPipeline(ctx(), [rc.GAE(ctx()), rc.NormalizeAdvantages(ctx())])
    for conn in [*CONNECTORS, pipe]:
        with deferred_checks() as checks:
            assert _reads(lambda c=conn: c(tensors.copy(), policy)) == [], conn
        assert _reads(checks.raise_if_bad) == ["tolist"]  # all the call's checks: one read


def test_one_host_read_per_connector_and_per_pipeline_call() -> None:
    tensors, policy = to_tensors(runner_like(8, 16, seed=10)), TorchValuePolicy()
    for conn in CONNECTORS:
        assert _reads(lambda c=conn: c(tensors.copy(), policy)) == ["tolist"]
    pipe = rc.LearnerConnectorPipeline(ctx(), [rc.GAE(ctx()), rc.NormalizeAdvantages(ctx())])
    assert _reads(lambda: pipe(tensors, policy)) == ["tolist"]


def test_takes_tensors_declared() -> None:
    assert rc.LearnerConnector.takes_tensors is False
    assert all(type(c).takes_tensors for c in CONNECTORS)
    assert rc.NormalizeAdvantages.takes_tensors

    class Plain(rc.LearnerConnector):
        def __call__(self, batch: rc.SampleBatch, policy: rc.Policy) -> rc.SampleBatch:
            return batch

    pipe = rc.LearnerConnectorPipeline(ctx(), [rc.GAE(ctx())])
    assert pipe.takes_tensors and pipe.tensor_refusals() == []
    name = pipe.append(Plain(ctx()))
    assert not pipe.takes_tensors and pipe.tensor_refusals() == [name]


# --- the scans -----------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [8, None])
def test_reverse_scan_equals_the_compiled_pass(blocks: int | None) -> None:
    rng = np.random.default_rng(11)
    x, coef = rng.normal(size=64), rng.uniform(0.5, 1.5, 64)
    last = np.flatnonzero(rng.random(64) < 0.2)
    last = np.union1d(last, np.arange(7, 64, 8))  # every block ends a trajectory
    masked = coef.copy()
    masked[last] = 0.0
    got = reverse_linear_scan(torch.tensor(x), torch.tensor(masked), blocks)
    np.testing.assert_allclose(host(got), linear_suffix_scan(x, coef, last), rtol=1e-12)


def test_window_sum_equals_the_compiled_pass() -> None:
    rng = np.random.default_rng(12)
    x = rng.normal(size=50)
    last = np.union1d(np.flatnonzero(rng.random(50) < 0.15), [49])
    same_next = np.ones(50, bool)
    same_next[last] = False
    for n in (1, 2, 5, 60):
        got = window_sum(torch.tensor(x), torch.tensor(same_next), 0.9, n, 50)
        np.testing.assert_allclose(host(got), discounted_window_sum(x, last, 0.9, n), rtol=1e-12)


# --- errors --------------------------------------------------------------------------


def _error(conn: rc.LearnerConnector, batch: rc.SampleBatch, policy: rc.Policy) -> str:
    with pytest.raises(ValueError) as exc:
        conn(batch, policy)
    return str(exc.value)


@pytest.mark.parametrize("conn", CONNECTORS, ids=IDS)
def test_a_non_finite_reward_is_named_as_on_numpy(conn: rc.LearnerConnector) -> None:
    batch = runner_like(3, 10, seed=13)
    batch["rewards"][17] = np.nan
    tensors, policy = to_tensors(batch), TorchValuePolicy()
    message = _error(conn, tensors, policy)
    assert message == _error(conn, batch, policy) and "row 17" in message
    assert set(tensors.keys()) == set(batch.keys())  # unchanged


def test_bootstrap_values_are_checked_only_where_needed() -> None:
    batch = runner_like(3, 10, seed=14)
    batch.meta.clear()
    batch["new_obs"][5] = np.inf  # row 5 is inside a trajectory: its value is never used
    boot = int(
        np.flatnonzero(~batch["terminateds"] & (batch["eps_id"] != np.roll(batch["eps_id"], -1)))[0]
    )
    _both(rc.GAE(ctx()), batch, TorchValuePolicy())
    batch["new_obs"][boot] = np.nan
    message = _error(rc.GAE(ctx()), to_tensors(batch), TorchValuePolicy())
    assert message == _error(rc.GAE(ctx()), batch, TorchValuePolicy())
    assert f"bootstrap value (compute_values of new_obs) is nan at row {boot}" in message


def test_trajectory_errors_are_the_numpy_path_s() -> None:
    scattered = batch_of([3, 2, 3], ["cut", "cut", "term"], eps=[0, 1, 0])
    goes_on = batch_of([4], ["cut"])
    goes_on["terminateds"][1] = True
    unordered = batch_of([4], ["cut"])
    unordered["t"][2] = 0
    for batch in (scattered, goes_on, unordered):
        expected = _error(rc.DiscountedReturns(ctx()), batch, TorchValuePolicy())
        assert (
            _error(rc.DiscountedReturns(ctx()), to_tensors(batch), TorchValuePolicy()) == expected
        )


def test_deferred_errors_are_raised_by_raise_if_bad() -> None:
    batch = runner_like(3, 10, seed=15)
    batch["vf_preds"][4] = np.nan
    tensors = to_tensors(batch)
    with deferred_checks() as checks:
        out = rc.GAE(ctx())(tensors, TorchValuePolicy())  # no read, no raise
    assert "advantages" in out
    with pytest.raises(ValueError, match="column 'vf_preds' is nan at row 4"):
        checks.raise_if_bad()
    checks.raise_if_bad()  # cleared


def test_layout_errors() -> None:
    batch = runner_like(2, 6, seed=16)
    batch["eps_id"][6:9] = batch["eps_id"][5]  # runs on from block 0 into block 1
    batch["t"][6:9] = batch["t"][5] + np.arange(1, 4)
    batch["terminateds"][5] = batch["truncateds"][5] = False
    with pytest.raises(ValueError, match="runs on from one block"):
        rc.GAE(ctx())(to_tensors(batch), TorchValuePolicy())
    batch = runner_like(2, 6, seed=16)
    batch.meta["rows_per_env"] = 5
    with pytest.raises(ValueError, match="not a multiple of it"):
        rc.GAE(ctx())(to_tensors(batch), TorchValuePolicy())


def test_a_column_on_another_device_is_refused() -> None:
    tensors = to_tensors(runner_like(2, 6, seed=17))
    tensors["rewards"] = torch.zeros(len(tensors), device="meta")
    with pytest.raises(ValueError, match="'rewards' is on meta but the batch's 'eps_id' is on cpu"):
        rc.DiscountedReturns(ctx())(tensors, TorchValuePolicy())


def test_eps_ids_that_do_not_grow_are_checked_on_the_host() -> None:
    batch = runner_like(4, 16, seed=18)
    batch["eps_id"] = -batch["eps_id"]  # each sub-env's episodes now count down
    for conn in CONNECTORS:
        _both(conn, batch, TorchValuePolicy())  # a false alarm of the device test: no error
    inside = runner_like(1, 8, seed=19, end_p=0.0)
    inside["eps_id"][:] = [5, 5, 6, 6, 5, 5, 7, 7]  # eps 5 comes back inside the block
    inside["t"][:] = [0, 1, 0, 1, 2, 3, 0, 1]
    inside["truncateds"][[1, 3, 5]] = True
    with pytest.raises(ValueError, match="are not contiguous"):
        rc.GAE(ctx())(to_tensors(inside), TorchValuePolicy())


def test_a_key_in_two_blocks_is_two_trajectories_with_rows_per_env() -> None:
    batch = runner_like(3, 6, seed=20, end_p=0.0)
    batch["eps_id"][12:] = batch["eps_id"][0]  # sub-env 2's rows share sub-env 0's eps_id
    out = rc.DiscountedReturns(ctx())(to_tensors(batch), TorchValuePolicy())
    del batch.meta["rows_per_env"]
    with pytest.raises(ValueError, match="are not contiguous"):  # numpy: one scattered key
        rc.DiscountedReturns(ctx())(batch.copy(), TorchValuePolicy())
    batch["agent_index"] = np.arange(18) // 6  # blocks told apart: numpy's trajectories
    numpy_out = rc.DiscountedReturns(ctx())(batch, TorchValuePolicy())
    np.testing.assert_allclose(host(out["returns"]), numpy_out["returns"], rtol=2e-6)


@pytest.mark.parametrize("conn", CONNECTORS, ids=IDS)
def test_an_empty_batch(conn: rc.LearnerConnector) -> None:
    empty = runner_like(2, 4, seed=21)[0:0]
    empty.meta.clear()
    out = conn(to_tensors(empty), TorchValuePolicy())
    added = set(out.keys()) - set(empty.keys())
    assert added and all(len(tree.flatten(out[k])[0]) == 0 for k in added)
