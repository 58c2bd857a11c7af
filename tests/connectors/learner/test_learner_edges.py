"""Learner connectors on the edges an outside check found (issue 55): slices of a larger
batch, narrow and integer dtypes, empty batches, huge finite rewards."""

from __future__ import annotations

import numpy as np
import pytest
from learner_fakes import ValuePolicy, batch_of, ctx

import rlconnect as rc


def test_normalizing_a_minibatch_slice_leaves_the_parent_batch_as_it_was():
    """Before: ``adv -= mean`` wrote through the slice's view into the parent batch, so a
    PPO loop normalising minibatches corrupted the advantages of later epochs."""
    parent = rc.SampleBatch({"advantages": np.arange(8, dtype=np.float32)})
    before = parent["advantages"].copy()
    part = parent[2:6]
    out = rc.NormalizeAdvantages(ctx())(part, ValuePolicy())
    np.testing.assert_array_equal(parent["advantages"], before)
    a = before[2:6].astype(np.float64)
    np.testing.assert_allclose(out["advantages"], (a - a.mean()) / a.std(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.int32, np.float64])
def test_normalize_takes_any_real_dtype_and_gives_float32(dtype):
    """Before: float16 advantages above ~256 overflowed (``adv * adv``) to all zeros, and
    int64 ones raised numpy's casting error."""
    values = np.array([300.0, 900.0, -600.0, 1200.0, 0.0])
    out = rc.NormalizeAdvantages(ctx())(
        rc.SampleBatch({"advantages": values.astype(dtype)}), ValuePolicy()
    )["advantages"]
    a = values.astype(dtype).astype(np.float64)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (a - a.mean()) / a.std(), rtol=1e-6)
    assert abs(float(out.std()) - 1.0) < 1e-5
