"""The hand-over to a learner (issue 54): to/numpy/device, minibatches, sequence
minibatches and time_major, on numpy and torch columns alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlconnect as rc
from rlconnect.batches import MultiAgentBatch, SampleBatch


def _batch(num_envs: int = 3, rows: int = 4, *, shuffled: bool = False) -> SampleBatch:
    """``num_envs`` sub-envs of ``rows`` rows each, sub-env major (or rows interleaved)."""
    n = num_envs * rows
    env = np.repeat(np.arange(num_envs), rows)
    t = np.tile(np.arange(rows), num_envs)
    order = np.arange(n)
    if shuffled:  # time-major interleaving: env 0 t0, env 1 t0, ...
        order = np.lexsort((env, t))
    cols = {
        "obs": np.arange(n * 2, dtype=np.float32).reshape(n, 2)[order],
        "actions": np.arange(n)[order],
        "rewards": np.linspace(0, 1, n, dtype=np.float32)[order],
        "env_id": env[order],
        "eps_id": (100 + env)[order],
        "t": t[order],
        "nested": {"a": np.arange(n, dtype=np.int32)[order], "b": (np.ones((n, 3)),)},
        "infos": [{"row": int(i)} for i in order],
    }
    return SampleBatch(cols)


# --- to / numpy / device ------------------------------------------------------------------
def test_to_cpu_shares_memory_and_leaves_out_object_columns():
    b = _batch()
    assert b.device is None
    tb = b.to("cpu")
    assert tb.device == torch.device("cpu")
    assert "infos" not in tb and set(tb.keys()) == set(b.keys()) - {"infos"}
    assert isinstance(tb["obs"], torch.Tensor)
    assert np.shares_memory(tb["obs"].numpy(), b["obs"])
    tb["obs"][0, 0] = 42.0  # the same memory
    assert b["obs"][0, 0] == 42.0
    assert isinstance(tb["nested"]["b"], tuple)
    assert isinstance(tb["nested"]["b"][0], torch.Tensor)
    assert tb["nested"]["a"].dtype == torch.int32


def test_to_copies_read_only_and_swapped_arrays():
    obs = np.arange(6.0, dtype=">f8")  # non-native byte order
    ro = np.arange(6)
    ro.flags.writeable = False
    rev = np.arange(6.0)[::-1]  # negative strides
    tb = SampleBatch({"obs": obs, "ro": ro, "rev": rev}).to("cpu")
    assert tb["obs"].tolist() == obs.tolist()
    assert not np.shares_memory(tb["ro"].numpy(), ro)
    tb["ro"][0] = 9  # writing the tensor cannot touch the read-only array
    assert ro[0] == 0
    assert tb["rev"].tolist() == rev.tolist()


def test_numpy_round_trip_and_multi_agent():
    b = _batch()
    back = b.to("cpu").numpy()
    assert back.device is None
    assert isinstance(back["obs"], np.ndarray)
    np.testing.assert_array_equal(back["obs"], b["obs"])
    assert isinstance(back["nested"]["b"], tuple)
    ma = MultiAgentBatch({"p0": b, "p1": b[:5]}, env_steps=12)
    tma = ma.to("cpu")
    assert tma.device == torch.device("cpu") and ma.device is None
    assert tma.env_steps() == 12 and len(tma.policy_batches["p1"]) == 5
    assert isinstance(tma.numpy().policy_batches["p0"]["obs"], np.ndarray)


def test_tensor_columns_slice_take_copy_concat():
    tb = _batch().to("cpu")
    assert len(tb[2:5]) == 3
    taken = tb.take(torch.tensor([0, 5]))
    assert taken["actions"].tolist() == [0, 5]
    assert tb.take(np.array([1, 2]))["actions"].tolist() == [1, 2]
    deep = tb.copy(deep=True)
    deep["obs"][0, 0] = -1.0
    assert tb["obs"][0, 0] != -1.0
    both = rc.concat_samples([tb, tb])
    assert isinstance(both["obs"], torch.Tensor) and len(both) == 24
    assert "obs(2,) torch.float32" in repr(tb)


# --- minibatches -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_minibatches_cover_every_row_once_per_epoch(kind: str):
    b = _batch(4, 5)  # 20 rows
    if kind == "torch":
        b = b.to("cpu")
    mbs = list(b.minibatches(6, seed=3, epochs=2))
    assert [len(m) for m in mbs] == [6, 6, 6, 2] * 2
    for epoch in (mbs[:4], mbs[4:]):
        seen = np.concatenate([np.asarray(m["actions"]) for m in epoch])
        assert sorted(seen.tolist()) == list(range(20))
    first = np.concatenate([np.asarray(m["actions"]) for m in mbs[:4]])
    second = np.concatenate([np.asarray(m["actions"]) for m in mbs[4:]])
    assert first.tolist() != second.tolist()  # a new permutation per epoch
    again = [np.asarray(m["actions"]).tolist() for m in b.minibatches(6, seed=3, epochs=2)]
    assert again == [np.asarray(m["actions"]).tolist() for m in mbs]
    other = [np.asarray(m["actions"]).tolist() for m in b.minibatches(6, seed=4, epochs=2)]
    assert other != again
    assert [len(m) for m in b.minibatches(6, seed=3, drop_last=True)] == [6, 6, 6]
    for m in mbs:  # the rows stay whole: each column's row i is the same source row
        np.testing.assert_array_equal(np.asarray(m["obs"])[:, 0], 2 * np.asarray(m["actions"]))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_minibatches_own_their_data(kind: str):
    b = _batch(2, 4)
    if kind == "torch":
        b = b.to("cpu")
    before = np.asarray(b.copy(deep=True)["obs"]).copy()
    mbs = list(b.minibatches(8, shuffle=False))
    mbs[0]["obs"][:] = 0  # in place, as NormalizeAdvantages does
    mbs[0]["nested"]["a"][:] = 0
    np.testing.assert_array_equal(np.asarray(b["obs"]), before)
    assert np.asarray(b["nested"]["a"]).tolist() == list(range(8))
    if kind == "numpy":
        mbs[0]["infos"][0]["row"] = -1
        assert b["infos"][0]["row"] == 0
    split = list(b.minibatches(4, shuffle=False))
    split[0]["rewards"][:] = 5
    assert (np.asarray(split[1]["rewards"]) != 5).all()


def test_minibatches_drop_rows_per_env_meta_and_keep_the_rest():
    b = _batch()
    b.meta.update(rows_per_env=4, policy_id="p")
    mb = next(b.minibatches(5, seed=0))
    assert mb.meta == {"policy_id": "p"}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"size": 0}, "size"),
        ({"size": -2}, "size"),
        ({"size": 13}, "size"),
        ({"size": 2.5}, "size"),
        ({"size": True}, "size"),
        ({"size": 4, "epochs": 0}, "epochs"),
    ],
)
def test_minibatches_bad_arguments_name_them(kwargs: dict, name: str):
    with pytest.raises(ValueError, match=name):
        list(_batch().minibatches(**kwargs))


# --- sequence minibatches -----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sequence_minibatches(kind: str):
    b = _batch(3, 5)  # 3 episodes of 5 rows: pieces of 2, 2, 1 each -> 9 pieces
    b["state_in_0"] = np.arange(15, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    if kind == "torch":
        b = b.to("cpu")
    seqs = list(b.sequence_minibatches(4, max_seq_len=2, seed=1))
    assert [s.num_seqs for s in seqs] == [4, 4, 1]
    rows = np.concatenate([np.asarray(s.unpad(s["actions"])) for s in seqs])
    assert sorted(rows.tolist()) == list(range(15))
    for s in seqs:
        assert tuple(s["obs"].shape[:2]) == (s.num_seqs, 2)
        lens = np.asarray(s.seq_lens)
        np.testing.assert_array_equal(np.asarray(s.mask).sum(1), lens)
        first = np.asarray(s["actions"])[:, 0]  # each piece's initial state is its 1st row's
        np.testing.assert_array_equal(np.asarray(s["state_in_0"])[:, 0], first)
        if kind == "torch":
            assert isinstance(s.mask, torch.Tensor) and isinstance(s["obs"], torch.Tensor)
    seqs[0]["obs"][:] = -7
    assert (np.asarray(b["obs"]) != -7).all()
    with pytest.raises(ValueError, match="size"):
        list(b.sequence_minibatches(10, max_seq_len=2))
    with pytest.raises(ValueError, match="max_seq_len"):
        list(b.sequence_minibatches(1, max_seq_len=0))


# --- time_major -------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_time_major_is_a_view_when_sub_env_major(kind: str):
    b = _batch(3, 4)
    b.meta["rows_per_env"] = 4
    if kind == "torch":
        b = b.to("cpu")
    tm = b.time_major()
    assert tuple(tm["obs"].shape) == (4, 3, 2)
    assert tuple(tm["rewards"].shape) == (4, 3)
    assert tuple(tm["nested"]["b"][0].shape) == (4, 3, 3)
    assert np.asarray(tm["env_id"])[0].tolist() == [0, 1, 2]
    assert np.asarray(tm["t"])[:, 1].tolist() == [0, 1, 2, 3]
    if kind == "numpy":
        assert np.shares_memory(tm["obs"], b["obs"])
        assert tm["infos"][2, 1] == {"row": 6}
    else:
        assert tm["obs"].data_ptr() == b["obs"].data_ptr()


def test_time_major_gathers_interleaved_rows_in_sub_env_order():
    b = _batch(3, 4, shuffled=True)
    tm = b.time_major()
    ref = _batch(3, 4).time_major()
    for name in ("obs", "actions", "env_id", "t"):
        np.testing.assert_array_equal(tm[name], ref[name])


def test_time_major_multi_agent_slots_are_agent_major():
    b = _batch(2, 3)
    two = rc.concat_samples([b, b])
    two["agent_index"] = np.repeat([0, 1], 6)
    tm = two.time_major()
    assert tm["agent_index"][0].tolist() == [0, 0, 1, 1]
    assert tm["env_id"][0].tolist() == [0, 1, 0, 1]


def test_time_major_refuses_unequal_rows_and_bad_layouts():
    b = _batch(3, 4)[:-1]  # the last sub-env is one row short
    with pytest.raises(ValueError, match=r"RunnerConfig\(equal_rows=True\)"):
        b.time_major()
    with pytest.raises(ValueError, match="3 to 4 rows"):
        b.to("cpu").time_major()
    declared = _batch(3, 4)
    declared.meta["rows_per_env"] = 6
    with pytest.raises(ValueError, match="rows_per_env"):
        declared.time_major()
    backwards = _batch(2, 3)
    backwards["t"] = np.array([2, 1, 0, 0, 1, 2])
    with pytest.raises(ValueError, match="time order"):
        backwards.time_major()
    with pytest.raises(ValueError, match="env_id"):
        SampleBatch({"obs": np.zeros(4)}).time_major()


def test_minibatches_and_to_with_a_compressed_column():
    from rlconnect.batches.compressed import CompressedColumn

    frames = np.arange(8 * 4 * 4, dtype=np.uint8).reshape(8, 4, 4)
    b = SampleBatch({"obs": CompressedColumn.compress(frames), "actions": np.arange(8)})
    mbs = list(b.minibatches(3, seed=0))
    for mb in mbs:
        np.testing.assert_array_equal(mb["obs"], frames[mb["actions"]])
    assert b.compressed_columns() == ["obs"] and mbs[0].compressed_columns() == ["obs"]
    tb = b.to("cpu")
    assert tb["obs"].dtype == torch.uint8 and tb["obs"].shape == (8, 4, 4)
    np.testing.assert_array_equal(tb["obs"].numpy(), frames)


def test_tensor_batches_compare_by_value():
    import rlconnect.batches

    b = _batch()
    del b["infos"]
    assert rlconnect.batches.batches_equal(b.to("cpu"), b.to("cpu"))
    other = b.to("cpu")
    other["obs"] = other["obs"] + 1
    assert not rlconnect.batches.batches_equal(b.to("cpu"), other)
    assert b.to("cpu").nbytes == b.nbytes
