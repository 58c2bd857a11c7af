"""The segmented scans against sequential float64 loops: on long trajectories where a
closed form with growing powers of the discount would lose precision, and on many short
ones with the value given after each."""

from __future__ import annotations

import numpy as np
import pytest

from rlconnect.connectors.learner.scan import (
    discounted_suffix_sum,
    discounted_window_sum,
    gae_columns,
    linear_suffix_scan,
)


def _segments(lengths: list[int]) -> np.ndarray:
    ends = np.cumsum(lengths) - 1
    return np.repeat(ends, lengths) - np.arange(int(sum(lengths)))


def _last_rows(lengths: list[int]) -> np.ndarray:
    return np.cumsum(lengths) - 1


def _loop(x: np.ndarray, coef: np.ndarray, lengths: list[int]) -> np.ndarray:
    y, start = np.zeros(len(x)), 0
    for n in lengths:
        run = 0.0
        for t in range(start + n - 1, start - 1, -1):
            run = x[t] + coef[t] * run
            y[t] = run
        start += n
    return y


LENGTHS = [1, 2, 3000, 7, 1, 5000, 64, 65, 4096, 1]


@pytest.mark.parametrize("discount", [0.0, 0.3, 0.9405, 0.999, 1.0])
def test_discounted_suffix_sum_is_exact_to_float64_rounding(discount: float) -> None:
    x = np.random.default_rng(0).normal(size=sum(LENGTHS)) * 10.0 ** np.random.default_rng(
        1
    ).integers(-3, 4, sum(LENGTHS))
    y = discounted_suffix_sum(x, _last_rows(LENGTHS), discount)
    ref = _loop(x, np.full(len(x), discount), LENGTHS)
    np.testing.assert_allclose(y, ref, rtol=1e-11, atol=1e-11 * np.abs(x).max())


def _loop_after(
    x: np.ndarray, discount: float, lengths: list[int], after: np.ndarray
) -> np.ndarray:
    """The sequential reference, with ``after[k]`` after trajectory ``k``'s last row."""
    y, start = np.zeros(len(x)), 0
    for k, n in enumerate(lengths):
        run = float(after[k])
        for t in range(start + n - 1, start - 1, -1):
            run = x[t] + discount * run
            y[t] = run
        start += n
    return y


@pytest.mark.parametrize("discount", [0.0, 1e-30, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_discounted_suffix_sums_of_short_trajectories_with_a_value_after_each(
    discount: float, dtype: type[np.floating]
) -> None:
    """Trajectories of 1-40 rows, each followed by its own value (a bootstrap, or 0),
    summed in float64 whatever the dtype returned."""
    rng = np.random.default_rng(4)
    lengths = list(rng.integers(1, 41, 200))
    x = (rng.normal(size=sum(lengths)) * 10.0 ** rng.integers(-3, 4, sum(lengths))).astype(dtype)
    after = rng.normal(size=len(lengths)) * (rng.random(len(lengths)) < 0.5)
    y = discounted_suffix_sum(x, _last_rows(lengths), discount, after=after, dtype=dtype)
    assert y.dtype == dtype
    ref = _loop_after(x.astype(np.float64), discount, lengths, after).astype(dtype)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize(("gamma", "lam"), [(0.0, 0.95), (0.99, 0.0), (0.99, 0.95), (1.0, 1.0)])
def test_gae_columns_are_the_sequential_loop_of_the_deltas(gamma: float, lam: float) -> None:
    rng = np.random.default_rng(5)
    lengths = list(rng.integers(1, 41, 100))
    rewards = rng.normal(size=sum(lengths)).astype(np.float32)
    values = rng.normal(size=sum(lengths)).astype(np.float32)
    after = rng.normal(size=len(lengths)) * (rng.random(len(lengths)) < 0.5)
    last = _last_rows(lengths)
    following = np.append(values[1:], 0.0).astype(np.float64)
    following[last] = after
    delta = rewards + gamma * following - values.astype(np.float64)
    ref = _loop_after(delta, gamma * lam, lengths, np.zeros(len(lengths)))
    advantages, targets = gae_columns(rewards, values, last, after, gamma, lam)
    assert advantages.dtype == targets.dtype == np.float32
    np.testing.assert_allclose(advantages, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(targets, ref + values, rtol=1e-6, atol=1e-6)


def test_discounted_suffix_sum_of_nothing() -> None:
    assert discounted_suffix_sum(np.zeros(0), np.zeros(0, dtype=np.int64), 0.9).shape == (0,)


def test_linear_suffix_scan_with_per_row_coefficients() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=sum(LENGTHS))
    coef = rng.uniform(0.0, 1.0, len(x))
    y = linear_suffix_scan(x, coef, _last_rows(LENGTHS))
    np.testing.assert_allclose(y, _loop(x, coef, LENGTHS), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 100, 5001, 10**9])
@pytest.mark.parametrize("discount", [0.0, 0.5, 0.97, 1.0])
def test_window_sums_cover_at_most_n_rows_of_the_trajectory(n: int, discount: float) -> None:
    lengths = [1, 2, 300, 7, 130, 64, 65]
    x = np.random.default_rng(3).normal(size=sum(lengths))
    rem = _segments(lengths)
    y = discounted_window_sum(x, _last_rows(lengths), discount, n)
    ref = np.array(
        [sum(discount**i * x[t + i] for i in range(min(n, rem[t] + 1))) for t in range(len(x))]
    )
    np.testing.assert_allclose(y, ref, rtol=1e-11, atol=1e-11)
