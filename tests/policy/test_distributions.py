"""The small-batch Python categorical sampler agrees with the numpy one draw for draw."""

from __future__ import annotations

import numpy as np
import pytest

from rlconnect.policy import distributions as d


@pytest.mark.parametrize("shape", [(1, 2), (3, 5), (4, 8)])
@pytest.mark.parametrize("explore", [True, False])
def test_python_and_numpy_categorical_agree(shape, explore, monkeypatch):
    logits = np.random.default_rng(0).normal(0, 3, (200, *shape)).astype(np.float32)
    py = [d._py_categorical(x, explore, np.random.default_rng(i)) for i, x in enumerate(logits)]
    monkeypatch.setattr(d, "_PY_CATEGORICAL_MAX", 0)  # force the vectorized path
    vec = [d._np_categorical(x, explore, np.random.default_rng(i)) for i, x in enumerate(logits)]
    for (a_py, lp_py), (a_np, lp_np) in zip(py, vec):
        assert a_py.dtype == np.int64 and lp_py.dtype == np.float32
        np.testing.assert_array_equal(a_py, a_np)
        np.testing.assert_allclose(lp_py, lp_np, atol=1e-5)


def test_python_categorical_samples_the_right_distribution():
    logits = np.log(np.array([[0.1, 0.6, 0.3]], np.float32))
    rng = np.random.default_rng(1)
    draws = np.array([d._py_categorical(logits, True, rng)[0][0] for _ in range(20000)])
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.1, 0.6, 0.3], atol=0.015)
    _, logp = d._py_categorical(logits, False, rng)
    np.testing.assert_allclose(logp, np.log(0.6), atol=1e-6)
