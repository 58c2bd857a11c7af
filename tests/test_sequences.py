"""chop_into_sequences: pieces of whole trajectories, padding, and an exact unpad."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tree
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
import rlconnect.batches.sequences
from rlconnect.batches import SampleBatch, chop_into_sequences


def _random_batch(seed: int, n_traj: int, max_len: int, multi_agent: bool) -> SampleBatch:
    """Trajectories of random lengths, rows shuffled, episodes shared by two agents."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, n_traj)
    n = int(lengths.sum())
    traj = np.repeat(np.arange(n_traj), lengths)
    t = np.concatenate([np.arange(k) for k in lengths]) if n else np.zeros(0, int)
    eps = traj // 2 if multi_agent else traj  # two agents share an episode
    columns = {
        "eps_id": (eps * 7919 + 3).astype(np.int64),
        "t": t,
        "obs": rng.normal(size=(n, 2, 2)).astype(np.float32),
        "actions": rng.integers(-5, 5, n).astype(np.int8),
        "terminateds": rng.random(n) < 0.5,
        "infos": np.array([{"row": i} for i in range(n)] + [None], dtype=object)[:n],
        "nested": {"a": rng.integers(0, 9, (n, 3)), "b": (rng.random(n),)},
        "state_in_0": rng.normal(size=(n, 3)).astype(np.float32),
    }
    if multi_agent:
        columns["agent_index"] = (traj % 2).astype(np.int64)
    perm = rng.permutation(n)
    return SampleBatch(columns).take(perm)


def _leaves(column):
    return tree.flatten(column)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_traj=st.integers(0, 9),
    max_len=st.integers(1, 12),
    max_seq_len=st.integers(1, 6),
    multi_agent=st.booleans(),
)
def test_pieces_padding_and_unpad_are_exact(
    seed: int, n_traj: int, max_len: int, max_seq_len: int, multi_agent: bool
) -> None:
    batch = _random_batch(seed, n_traj, max_len, multi_agent)
    seq = chop_into_sequences(batch, max_seq_len)
    n = len(batch)
    assert seq.seq_lens.dtype == np.int32 and seq["seq_lens"] is seq.seq_lens
    assert seq.mask.dtype == bool and seq.mask.shape == (seq.num_seqs, max_seq_len)
    np.testing.assert_array_equal(seq.mask.sum(1), seq.seq_lens)
    assert all(seq.mask[s, : seq.seq_lens[s]].all() for s in range(seq.num_seqs))
    assert not any(seq.mask[s, seq.seq_lens[s] :].any() for s in range(seq.num_seqs))
    assert int(seq.seq_lens.sum()) == n
    # unpad(padded) == batch[col] exactly, dtype kept, nested leaf by leaf
    for name in batch:
        if name.startswith("state_in_"):
            continue
        back = seq.unpad(seq[name])
        for got, want in zip(_leaves(back), _leaves(batch[name]), strict=True):
            assert got.dtype == want.dtype
            assert got.shape == want.shape
            if want.dtype == object:
                assert list(got) == list(want)
            else:
                np.testing.assert_array_equal(got, want)
        for pad, want in zip(_leaves(seq[name]), _leaves(batch[name]), strict=True):
            assert pad.shape == (seq.num_seqs, max_seq_len, *want.shape[1:])
            padding = pad[~seq.mask]
            if want.dtype == object:
                assert all(v is None for v in padding)
            else:
                assert not padding.any()
    # every piece is consecutive t of one trajectory; only a trajectory's last is short
    key = seq["eps_id"] * 2 + (seq["agent_index"] if multi_agent else 0)
    lengths: dict[int, int] = {}
    starts: dict[int, list[int]] = {}
    for s in range(seq.num_seqs):
        k, m = key[s][seq.mask[s]], seq["t"][s][seq.mask[s]]
        assert (k == k[0]).all()
        np.testing.assert_array_equal(m, np.arange(m[0], m[0] + len(m)))
        assert m[0] % max_seq_len == 0
        lengths[int(k[0])] = max(lengths.get(int(k[0]), 0), int(m[-1]) + 1)
        starts.setdefault(int(k[0]), []).append(int(m[0]))
        # state_in is the piece's first row's state
        first = (batch["eps_id"] * 2 + (batch["agent_index"] if multi_agent else 0) == k[0]) & (
            batch["t"] == m[0]
        )
        np.testing.assert_array_equal(seq["state_in_0"][s], batch["state_in_0"][first][0])
    for k, length in lengths.items():
        assert sorted(starts[k]) == list(range(0, length, max_seq_len))
    assert seq.num_seqs == sum(-(-length // max_seq_len) for length in lengths.values())


def test_rows_without_t_keep_their_order_within_a_trajectory() -> None:
    batch = SampleBatch({"eps_id": [4, 9, 4, 4, 9], "obs": np.arange(5)})
    seq = chop_into_sequences(batch, 2)
    pieces = sorted(tuple(seq["obs"][s][seq.mask[s]]) for s in range(seq.num_seqs))
    assert pieces == [(0, 2), (1, 4), (3,)]
    np.testing.assert_array_equal(seq.unpad(seq["obs"]), batch["obs"])


def test_unpad_accepts_torch_tensors_and_checks_shapes() -> None:
    batch = SampleBatch({"eps_id": [1, 1, 1, 2], "obs": np.arange(8.0).reshape(4, 2)})
    seq = chop_into_sequences(batch, 2)
    back = seq.unpad(torch.from_numpy(seq["obs"]))
    assert isinstance(back, torch.Tensor)
    np.testing.assert_array_equal(back.numpy(), batch["obs"])
    with pytest.raises(ValueError, match="num_seqs, max_seq_len"):
        seq.unpad(np.zeros((seq.num_seqs, 3)))


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.0, "4", None])
def test_bad_max_seq_len_is_named(bad) -> None:
    batch = SampleBatch({"eps_id": [1], "obs": np.zeros((1, 2))})
    with pytest.raises(ValueError, match="max_seq_len"):
        chop_into_sequences(batch, bad)


def test_a_multi_agent_batch_is_refused_and_a_dict_taken() -> None:
    batch = SampleBatch({"eps_id": [1, 1], "obs": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="policy_batches"):
        chop_into_sequences(rc.MultiAgentBatch({"p": batch}, 2), 2)
    seq = chop_into_sequences({"eps_id": np.array([1, 1]), "obs": np.arange(2.0)}, 2)
    assert seq["obs"].tolist() == [[0.0, 1.0]]


def test_batch_without_eps_id_is_refused() -> None:
    with pytest.raises(ValueError, match="eps_id"):
        chop_into_sequences(SampleBatch({"obs": np.zeros((3, 2))}), 4)


def test_public_names() -> None:
    assert rc.chop_into_sequences is chop_into_sequences
    assert rc.SequenceBatch is rlconnect.batches.sequences.SequenceBatch
