"""Padded sequences for recurrent learners: :func:`chop_into_sequences` and :class:`SequenceBatch`.

A recurrent learner replays an agent's rows in time order from the state the policy had
before the first of them. :func:`chop_into_sequences` cuts every agent trajectory of a
batch (the rows of one ``eps_id`` and, in a multi-agent policy batch, one ``agent_index``,
ordered by ``t``) into consecutive pieces of ``max_seq_len`` rows (each trajectory's last
piece may be shorter), pads every column to ``(num_seqs, max_seq_len, ...)`` and keeps each
piece's first ``state_in_*`` row as its initial state. :meth:`SequenceBatch.unpad` maps
padded results (log-probabilities, values) back to the batch's own row order.

Everything is index arithmetic over all rows at once: a stable sort by trajectory, then each
row's position in its trajectory, its piece and its offset in the piece.

>>> import numpy as np
>>> from rlconnect.batches import SampleBatch
>>> b = SampleBatch({"eps_id": [5, 5, 5, 8, 8], "t": [0, 1, 2, 0, 1],
...                  "obs": np.arange(5.0), "state_in_0": np.arange(5)[:, None]})
>>> seq = chop_into_sequences(b, max_seq_len=2)
>>> seq["obs"]
array([[0., 1.],
       [2., 0.],
       [3., 4.]])
>>> seq.seq_lens, seq["state_in_0"][:, 0]
(array([2, 1, 2], dtype=int32), array([0, 2, 3]))
>>> bool((seq.unpad(seq["obs"]) == b["obs"]).all())
True
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tree

from rlconnect.batches.minibatch import own_objects
from rlconnect.batches.sample_batch import SampleBatch
from rlconnect.batches.take import take_rows
from rlconnect.batches.tensors import is_tensor, leaf_to_numpy

__all__ = ["SequenceBatch", "chop_into_sequences"]

_STATE_IN = "state_in_"


class SequenceBatch(Mapping):
    """Padded columns of a batch's trajectory pieces (made by :func:`chop_into_sequences`).

    ``seq[col]`` is ``(num_seqs, max_seq_len, ...)`` for every column of the batch except
    ``state_in_*``, which is ``(num_seqs, ...)``: each piece's first row's state.
    ``seq["seq_lens"]`` (int32) and ``seq["mask"]`` (bool, True on the first
    ``seq_lens[s]`` steps of piece ``s``) are also attributes. Iterating yields column names.
    """

    def __init__(
        self,
        columns: dict[str, Any],
        max_seq_len: int,
        row_seq: np.ndarray,
        row_pos: np.ndarray,
    ) -> None:
        self._columns = columns
        self.max_seq_len = max_seq_len
        self.seq_lens: np.ndarray = columns["seq_lens"]
        self.mask: np.ndarray = columns["mask"]
        self._row_seq = row_seq
        self._row_pos = row_pos

    @property
    def num_seqs(self) -> int:
        """How many pieces (the padded columns' first axis)."""
        return len(self.seq_lens)

    @property
    def num_rows(self) -> int:
        """How many rows the batch had (the unmasked steps of all pieces)."""
        return len(self._row_seq)

    def __getitem__(self, key: str) -> Any:
        return self._columns[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        """Number of columns (a Mapping); the number of pieces is :attr:`num_seqs`."""
        return len(self._columns)

    def unpad(self, padded: Any) -> Any:
        """``(num_seqs, max_seq_len, ...)`` -> ``(rows, ...)`` in the batch's row order.

        Works on numpy arrays, torch tensors and nests of them; ``seq.unpad(seq[col])``
        equals ``batch[col]`` exactly.

        Raises:
            ValueError: if a leaf's first two axes are not ``(num_seqs, max_seq_len)``.
        """
        expected = (self.num_seqs, self.max_seq_len)

        def unpad_leaf(leaf: Any) -> Any:
            if tuple(leaf.shape[:2]) != expected:
                raise ValueError(
                    f"unpad needs (num_seqs, max_seq_len, ...) = {expected} leading axes, "
                    f"got shape {tuple(leaf.shape)}"
                )
            if is_tensor(leaf):
                import torch

                seq = torch.as_tensor(self._row_seq, device=leaf.device)
                return leaf[seq, torch.as_tensor(self._row_pos, device=leaf.device)]
            return leaf[self._row_seq, self._row_pos]

        return tree.map_structure(unpad_leaf, padded)

    def take(self, index: np.ndarray) -> SequenceBatch:
        """The pieces at ``index`` (int array), in that order, in arrays of their own.

        Its `unpad` gives rows in piece order (piece by piece, each in time order)."""
        columns = {name: own_objects(take_rows(col, index)) for name, col in self._columns.items()}
        mask = np.asarray(leaf_to_numpy(columns["mask"]))
        row_seq, row_pos = np.nonzero(mask)
        return SequenceBatch(columns, self.max_seq_len, row_seq, row_pos)

    def __repr__(self) -> str:
        return (
            f"SequenceBatch(num_seqs={self.num_seqs}, max_seq_len={self.max_seq_len}, "
            f"rows={self.num_rows}, columns={sorted(self._columns)})"
        )


def _codes(column: Any, name: str) -> np.ndarray:
    """Integer codes of a 1-D key column (equal values, equal codes)."""
    values = np.asarray(leaf_to_numpy(column))
    if values.ndim != 1:
        raise ValueError(f"{name!r} must be a 1-D column to cut trajectories, got {values.shape}")
    if values.dtype.kind in "biu":
        return values
    return np.unique(values, return_inverse=True)[1].reshape(-1)


def _pieces(batch: SampleBatch, max_seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows in trajectory order (``order``), and for each sorted row its piece and offset."""
    n = len(batch)
    trajectory = [_codes(batch[SampleBatch.EPS_ID], SampleBatch.EPS_ID)]
    if SampleBatch.AGENT_INDEX in batch:
        trajectory.append(_codes(batch[SampleBatch.AGENT_INDEX], SampleBatch.AGENT_INDEX))
    time = [_codes(batch[SampleBatch.T], SampleBatch.T)] if SampleBatch.T in batch else []
    order = np.lexsort([*time, *trajectory[::-1]])  # stable: episode, agent, t, then row
    same = np.ones(max(n - 1, 0), bool)
    for key in trajectory:
        sorted_key = key[order]
        same &= sorted_key[1:] == sorted_key[:-1]
    idx = np.arange(n)
    starts = np.where(np.concatenate(([True], ~same))[:n], idx, 0)
    offset = (idx - np.maximum.accumulate(starts)) % max_seq_len
    seq_id = np.cumsum(offset == 0) - 1
    return order, seq_id, offset


def chop_into_sequences(batch: SampleBatch | Mapping[str, Any], max_seq_len: int) -> SequenceBatch:
    """Cut every agent trajectory of ``batch`` into padded pieces of ``max_seq_len`` rows.

    See the module docstring; call it on each policy batch of a ``MultiAgentBatch``.
    Padding is zeros of each column's dtype (None for object columns such as ``infos``);
    nested columns are padded leaf by leaf. The order of the pieces is unspecified.

    Raises:
        ValueError: if ``max_seq_len`` is not an int >= 1 (bools included), or the batch
            has no ``eps_id`` column.
        TypeError: for a ``MultiAgentBatch`` (chop each of its policy batches).
    """
    if not isinstance(batch, SampleBatch):
        if not isinstance(batch, Mapping) or hasattr(batch, "policy_batches"):
            raise TypeError(
                "chop_into_sequences takes a SampleBatch; for a MultiAgentBatch call it on "
                f"each of its policy_batches, got {type(batch).__name__}"
            )
        batch = SampleBatch(batch)
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int | np.integer):
        raise ValueError(f"max_seq_len must be an int >= 1, got {max_seq_len!r}")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be an int >= 1, got {max_seq_len!r}")
    max_seq_len = int(max_seq_len)
    if SampleBatch.EPS_ID not in batch:
        raise ValueError(
            f"chop_into_sequences needs an {SampleBatch.EPS_ID!r} column to find "
            f"trajectories; the batch has {sorted(batch.keys())}"
        )
    order, seq_id, offset = _pieces(batch, max_seq_len)
    num_seqs = int(seq_id[-1]) + 1 if len(seq_id) else 0
    row_seq = np.empty_like(seq_id)
    row_seq[order] = seq_id
    row_pos = np.empty_like(offset)
    row_pos[order] = offset
    firsts = order[offset == 0]  # each piece's first row, in piece order

    shape = (num_seqs, max_seq_len)
    columns: dict[str, Any] = {}
    for name, column in batch.items():
        if name.startswith(_STATE_IN):
            columns[name] = take_rows(column, firsts)
        else:
            columns[name] = tree.map_structure(lambda x: _pad(x, shape, row_seq, row_pos), column)
    seq_lens: Any = np.bincount(seq_id, minlength=num_seqs).astype(np.int32)
    mask: Any = np.arange(max_seq_len)[None, :] < seq_lens[:, None]
    device = batch.device
    if device is not None:  # a tensor batch: its sequences are tensors on its device
        import torch

        seq_lens, mask = (torch.from_numpy(x).to(device) for x in (seq_lens, mask))
    columns["seq_lens"], columns["mask"] = seq_lens, mask
    return SequenceBatch(columns, max_seq_len, row_seq, row_pos)


def _pad(leaf: Any, shape: tuple[int, int], row_seq: np.ndarray, row_pos: np.ndarray) -> Any:
    """``leaf``'s rows at ``[row_seq, row_pos]`` of zeros (None for objects) of ``shape``."""
    if is_tensor(leaf):
        import torch

        out = leaf.new_zeros((*shape, *leaf.shape[1:]))
        seq = torch.as_tensor(row_seq, device=leaf.device)
        out[seq, torch.as_tensor(row_pos, device=leaf.device)] = leaf
        return out
    leaf = np.asarray(leaf)
    make = np.empty if leaf.dtype == object else np.zeros
    padded = make((*shape, *leaf.shape[1:]), dtype=leaf.dtype)
    padded[row_seq, row_pos] = leaf
    return padded
