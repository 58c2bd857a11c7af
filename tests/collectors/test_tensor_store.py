"""TensorStore: the tensor path's per-column [T, R] storage, reused by every sample.

What is attacked: a built batch owns its memory (the next sample writes over the store,
a single round included, where a transpose could be a view), rows come out slot major in
time order (nested columns too), kept rows are gathered as the whole batch has them, a
column this sample did not write is not handed out, and the cheap finite check fires on
every NaN or inf, its rare false alarm (finite values whose sum overflows) cleared by the
exact locator.
"""

from __future__ import annotations

import pytest
import torch

from rlconnect.collectors.tensor_store import TensorStore


def _fill(store: TensorStore, base: float, names: tuple[str, ...] = ("obs", "rewards")) -> None:
    for k in range(store.rounds):
        row = base + 10.0 * k + torch.arange(store.rows, dtype=torch.float32)
        columns = {
            "obs": torch.stack([row, -row], 1),
            "rewards": row,
            "new_obs": {"pos": row[:, None].repeat(1, 3)},
            "t": k,
        }
        store.write(k, {name: columns[name] for name in names})


@pytest.mark.parametrize("rounds", [1, 4])
def test_a_batch_keeps_its_rows_when_the_store_is_written_over(rounds: int) -> None:
    store = TensorStore(rounds, 3, torch.device("cpu"))
    _fill(store, 0.0)
    batch = store.build({"env_id": torch.arange(3)})
    kept = {name: batch[name].clone() for name in batch}
    _fill(store, 1000.0)
    again = store.build({"env_id": torch.arange(3)})
    for name, value in kept.items():
        assert torch.equal(batch[name], value), name
    assert not torch.equal(again["rewards"], batch["rewards"])


def test_rows_come_out_slot_major_in_time_order_nests_included() -> None:
    store = TensorStore(4, 3, torch.device("cpu"))
    _fill(store, 0.0, ("obs", "rewards", "new_obs", "t"))
    batch = store.build({"env_id": torch.arange(3), "weights_seq": 7})
    expected = torch.tensor([10.0 * k + r for r in range(3) for k in range(4)])
    assert torch.equal(batch["rewards"], expected)
    assert torch.equal(batch["obs"], torch.stack([expected, -expected], 1))
    assert torch.equal(batch["new_obs"]["pos"], expected[:, None].repeat(1, 3))
    assert batch["t"].tolist() == [0, 1, 2, 3] * 3
    assert batch["env_id"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert batch["weights_seq"].tolist() == [7] * 12


def test_a_column_the_last_sample_did_not_write_is_not_handed_out() -> None:
    store = TensorStore(2, 3, torch.device("cpu"))
    _fill(store, 0.0, ("obs", "rewards", "t"))
    store.build({})
    _fill(store, 0.0, ("obs", "rewards"))
    assert "t" not in store.build({})


def test_kept_rows_are_gathered_slot_major_from_a_reused_store() -> None:
    """``keep`` (slot-major indices) picks the same rows as the whole batch, every sample."""
    store = TensorStore(4, 3, torch.device("cpu"))
    keep = torch.tensor([0, 1, 5, 8, 9, 10, 11])
    for base in (0.0, 1000.0):
        _fill(store, base, ("obs", "rewards", "new_obs", "t"))
        whole = store.build({"env_id": torch.arange(3), "weights_seq": 7})
        kept = store.build({"env_id": torch.arange(3), "weights_seq": 7}, keep)
        assert len(kept) == len(keep) and "rows_per_env" not in kept.meta
        for name in ("obs", "rewards", "t", "env_id", "weights_seq"):
            assert torch.equal(kept[name], whole[name][keep]), name
        assert torch.equal(kept["new_obs"]["pos"], whole["new_obs"]["pos"][keep])


@pytest.mark.parametrize(
    ("column", "value"),
    [("obs", float("nan")), ("new_obs", float("inf")), ("rewards", -float("inf"))],
)
def test_the_cheap_check_fires_on_every_nan_and_inf(column: str, value: float) -> None:
    store = TensorStore(4, 3, torch.device("cpu"))
    _fill(store, 0.0, ("obs", "rewards", "new_obs"))
    names = ("obs", "new_obs", "rewards")
    assert not store.any_nonfinite(names)
    leaf = store.column(column)
    (leaf["pos"] if isinstance(leaf, dict) else leaf)[2, 1] = value
    assert store.any_nonfinite(names)
    first, is_reward, with_step = store.first_nonfinite()
    assert first.tolist() == [4, 2, 4]
    assert bool(is_reward[1]) == (column == "rewards")
    assert int(with_step[1]) == (column != "obs")


@pytest.mark.parametrize(("dtype", "big"), [(torch.float32, 3e38), (torch.float64, 1e308)])
def test_a_sum_that_overflows_is_a_false_alarm_the_locator_clears(
    dtype: torch.dtype, big: float
) -> None:
    store = TensorStore(2, 3, torch.device("cpu"))
    for k in range(2):
        row = torch.full((3,), big, dtype=dtype)
        store.write(k, {"obs": row, "new_obs": row, "rewards": torch.zeros(3)})
    assert store.any_nonfinite(("obs", "new_obs", "rewards"))  # the sum is inf
    first, _, _ = store.first_nonfinite()
    assert first.tolist() == [2, 2, 2]  # no row holds a NaN or inf


@pytest.mark.parametrize(
    ("tail", "dtype"),
    [
        ((4,), torch.float32),
        ((2,), torch.float32),
        ((3,), torch.float32),
        ((2, 2), torch.int64),
        ((2,), torch.bool),
        ((), torch.float64),
    ],
)
def test_every_row_width_comes_out_as_a_transpose_of_the_rounds(
    tail: tuple[int, ...], dtype: torch.dtype
) -> None:
    """Rows of 2 to 16 bytes move as one wide element; others element by element."""
    rounds, rows = 70, 90  # past the size where torch's blocked 2-D transpose applies
    values = torch.randint(0, 1000, (rounds, rows, *tail)).to(dtype)
    store = TensorStore(rounds, rows, torch.device("cpu"))
    for k in range(rounds):
        store.write(k, {"x": values[k]})
    expected = values.transpose(0, 1).reshape(rows * rounds, *tail)
    assert torch.equal(store.build({})["x"], expected)
