"""`SampleBatch`: rows of experience stored column-wise, with the column normalization it needs.

Columns are numpy arrays (first axis = rows) or dict/tuple nests of them; see `rlconnect.batches`.
"""

from __future__ import annotations

import copy as _copy
import numbers
from collections.abc import (
    ItemsView,
    Iterator,
    KeysView,
    Mapping,
    MutableMapping,
    ValuesView,
)
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import tree

from rlconnect.batches.compare import _sample_batches_equal
from rlconnect.batches.compressed import CompressedColumn
from rlconnect.batches.lazy import LazyColumn
from rlconnect.batches.take import take_rows
from rlconnect.batches.tensors import column_device, is_tensor, leaf_to_numpy, leaf_to_tensor
from rlconnect.batches.tensors import tensor_kind as _tensor_kind

if TYPE_CHECKING:
    import torch

    from rlconnect.batches.sequences import SequenceBatch

__all__ = ["DEFAULT_AGENT_ID", "DEFAULT_POLICY_ID", "Column", "SampleBatch"]

DEFAULT_POLICY_ID = "default_policy"
DEFAULT_AGENT_ID = "agent0"

Column = Any  # np.ndarray or torch.Tensor, or a dict/tuple nest of them

_PLAIN_SCALARS = (numbers.Number, np.generic, str, bytes)


def _list_to_array(values: list) -> np.ndarray:
    """Convert a Python list of rows; dicts/objects become a 1-D object array."""
    plain = all(isinstance(v, (*_PLAIN_SCALARS, np.ndarray, list, tuple)) for v in values)
    if plain:
        try:
            arr = np.asarray(values)
        except ValueError:  # ragged rows
            arr = None
        if arr is not None and arr.dtype != object:
            return arr
    return _object_array(values)


def _object_array(values: list) -> np.ndarray:
    """1-D object array of `values`, filled element-wise so numpy never broadcasts a row."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _normalize(value: Any, name: str = "") -> Column:
    """Turn a user-given column into dict/tuple nests of numpy arrays (lists are rows)."""
    if name == SampleBatch.INFOS and isinstance(value, list):
        return _object_array(value)  # infos rows are objects, even when empty
    if isinstance(value, np.ndarray | LazyColumn) or is_tensor(value):
        return value
    if isinstance(value, Mapping):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [_normalize(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return _list_to_array(value)
    return np.asarray(value)


def _leaf_lengths(name: str, column: Column) -> list[tuple[str, int]]:
    """`(leaf name, leading length)` for each leaf; 0-d and leafless columns are errors."""
    if type(column) is np.ndarray and column.ndim:  # the common case, without dm-tree
        return [(name, column.shape[0])]
    out = []
    for path, leaf in tree.flatten_with_path(column):
        leaf_name = "/".join([name, *map(str, path)])
        if isinstance(leaf, LazyColumn):
            out.append((leaf_name, len(leaf)))
            continue
        if not (isinstance(leaf, np.ndarray) or is_tensor(leaf)) or leaf.ndim == 0:
            raise ValueError(
                f"column {leaf_name!r} must be an array with a leading row axis, got {leaf!r}"
            )
        out.append((leaf_name, leaf.shape[0]))
    if not out:
        raise ValueError(f"column {name!r} holds no arrays")
    return out


def _check_lengths(lengths: list[tuple[str, int]]) -> int:
    """Return the common row count, or raise ValueError naming every column and length."""
    if not lengths:
        return 0
    first_name, rows = lengths[0]
    bad = [f"{name}={n}" for name, n in lengths if n != rows]
    if bad:
        listing = ", ".join([f"{first_name}={rows}", *bad])
        raise ValueError(f"columns must all have the same number of rows, got {listing}")
    return rows


def _is_compressed(column: Column) -> bool:
    """An LZ4-compressed column, or frame stacks with an LZ4-compressed pool."""
    return isinstance(getattr(column, "pool", column), CompressedColumn)


def _map_rows(column: Column, index: Any) -> Column:
    if isinstance(column, LazyColumn):
        return column.take(leaf_to_numpy(index))
    if not isinstance(index, slice):
        return take_rows(column, index)
    if isinstance(column, np.ndarray) or is_tensor(column):  # a view
        return column[index]
    return tree.map_structure(lambda leaf: leaf[index], column)


class _DecompressedValues(ValuesView):
    """Values of a batch holding lazy columns, each read (materialised) on access."""

    def __init__(self, batch: SampleBatch) -> None:
        super().__init__(batch)
        self._batch = batch

    def __len__(self) -> int:  # columns, not rows (``len(batch)`` counts rows)
        return len(self._batch.keys())


class _DecompressedItems(ItemsView):
    """Items of a batch holding lazy columns, each read (materialised) on access."""

    def __init__(self, batch: SampleBatch) -> None:
        super().__init__(batch)
        self._batch = batch

    def __len__(self) -> int:  # columns, not rows (``len(batch)`` counts rows)
        return len(self._batch.keys())


class SampleBatch(MutableMapping):
    """Rows of experience stored column-wise; see the module docstring."""

    OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    INFOS = "infos"
    EPS_ID = "eps_id"
    ENV_ID = "env_id"
    AGENT_INDEX = "agent_index"
    T = "t"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    ENV_ACTIONS = "env_actions"
    RAW_OBS = "raw_obs"

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as dict is

    def __init__(self, columns: Mapping[str, Any] | None = None, *, meta: dict | None = None):
        self._columns: dict[str, Column] = {}
        self._count = 0
        self.meta: dict = dict(meta) if meta else {}
        if columns:
            normalized = {}
            for key, value in columns.items():
                if not isinstance(key, str):
                    raise TypeError(f"column names must be str, got {key!r}")
                normalized[key] = _normalize(value, key)
            lengths = [ln for k, v in normalized.items() for ln in _leaf_lengths(k, v)]
            self._count = _check_lengths(lengths)
            self._columns = normalized

    @staticmethod
    def state_in(i: int) -> str:
        """Name of the i-th RNN input-state column."""
        return f"state_in_{i}"

    @staticmethod
    def state_out(i: int) -> str:
        """Name of the i-th RNN output-state column."""
        return f"state_out_{i}"

    @classmethod
    def _from_normalized(cls, columns: dict[str, Column], count: int, meta: dict) -> SampleBatch:
        """Build without re-validating (columns come from an already valid batch)."""
        out = cls.__new__(cls)
        out._columns, out._count, out.meta = columns, count, dict(meta)
        return out

    # --- mapping protocol -------------------------------------------------------------
    @overload
    def __getitem__(self, key: str) -> Column: ...
    @overload
    def __getitem__(self, key: slice) -> SampleBatch: ...
    def __getitem__(self, key: str | slice) -> Column | SampleBatch:
        if isinstance(key, str):
            column = self._columns[key]
            if isinstance(column, LazyColumn):  # stored compactly: a fresh array
                return column.materialize()
            return column
        if isinstance(key, slice):
            count = len(range(*key.indices(self._count)))
            cols = {k: _map_rows(v, key) for k, v in self._columns.items()}
            return self._from_normalized(cols, count, self.meta)
        raise TypeError(
            f"SampleBatch indices must be column names or slices, got {type(key).__name__};"
            " use batch.take(indices) for index arrays"
        )

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"column names must be str, got {key!r}")
        column = _normalize(value, key)
        lengths = _leaf_lengths(key, column)
        if any(k != key for k in self._columns):
            lengths = [(f"existing rows ({self._count})", self._count), *lengths]
        self._count = _check_lengths(lengths)
        self._columns[key] = column

    def __delitem__(self, key: str) -> None:
        del self._columns[key]
        if not self._columns:
            self._count = 0

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        """Number of rows (not columns)."""
        return self._count

    # The Mapping mixin views would use __len__ (rows); return the column dict's views.
    def keys(self) -> KeysView[str]:
        """Column names (a live, read-only view)."""
        return self._columns.keys()

    def values(self) -> ValuesView[Column]:
        """Columns (a live, read-only view; lazy columns are materialised)."""
        if self._has_lazy():
            return _DecompressedValues(self)
        return self._columns.values()

    def items(self) -> ItemsView[str, Column]:
        """`(name, column)` pairs (a live, read-only view; lazy columns materialised)."""
        if self._has_lazy():
            return _DecompressedItems(self)
        return self._columns.items()

    def _has_lazy(self) -> bool:
        return any(isinstance(c, LazyColumn) for c in self._columns.values())

    def compressed_columns(self) -> list[str]:
        """Names of the columns held LZ4-compressed, or with an LZ4-compressed frame pool
        (see `rlconnect.batches.compressed`)."""
        return [k for k, c in self._columns.items() if _is_compressed(c)]

    def lazy_columns(self) -> dict[str, str]:
        """``{name: kind}`` of the columns not held as plain arrays (``"CompressedColumn"``,
        ``"FrameStackColumn"``; see `rlconnect.batches.lazy`)."""
        return {k: type(c).__name__ for k, c in self._columns.items() if isinstance(c, LazyColumn)}

    def __contains__(self, key: object) -> bool:
        return key in self._columns

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleBatch):
            return NotImplemented
        return _sample_batches_equal(self, other)

    @property
    def count(self) -> int:
        """Number of rows."""
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes held by all leaf arrays (object arrays: 8 bytes per element pointer); lazy
        columns count what they hold, storage they share (a frame pool) once."""
        total = 0
        shared: dict[int, Any] = {}  # storage of lazy columns, by identity
        for leaf in tree.flatten(list(self._columns.values())):
            if isinstance(leaf, LazyColumn):
                shared.update((id(part), part) for part in leaf.storage())
            else:
                total += int(leaf.nbytes)
        return total + sum(int(part.nbytes) for part in shared.values())

    # --- row operations ---------------------------------------------------------------
    def take(self, indices: Any) -> SampleBatch:
        """New batch of the rows selected by an int index array or a boolean mask (numpy
        arrays, lists or torch tensors; a tensor index stays on its device)."""
        if is_tensor(indices):
            return self._take_tensor_index(indices)
        idx = np.asarray(indices)
        if idx.dtype == bool:
            if idx.shape != (self._count,):
                raise IndexError(
                    f"boolean mask has shape {idx.shape}, batch has {self._count} rows"
                )
        elif idx.size == 0:
            idx = idx.astype(np.intp)
        elif not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"take() needs integer or boolean indices, got dtype {idx.dtype}")
        idx = np.atleast_1d(idx)
        count = int(idx.sum()) if idx.dtype == bool else len(idx)
        cols = {k: _map_rows(v, idx) for k, v in self._columns.items()}
        return self._from_normalized(cols, count, self.meta)

    def _take_tensor_index(self, idx: torch.Tensor) -> SampleBatch:
        """`take` with a torch index (the rows are counted with one host read)."""
        if idx.dtype.is_floating_point or idx.dtype.is_complex:
            raise IndexError(f"take() needs integer or boolean indices, got dtype {idx.dtype}")
        idx = idx.reshape(-1)
        if str(idx.dtype) == "torch.bool":
            if tuple(idx.shape) != (self._count,):
                raise IndexError(
                    f"boolean mask has shape {tuple(idx.shape)}, batch has {self._count} rows"
                )
            count = int(idx.sum())
        else:
            count = len(idx)
        cols = {k: _map_rows(v, idx) for k, v in self._columns.items()}
        return self._from_normalized(cols, count, self.meta)

    def copy(self, deep: bool = False) -> SampleBatch:
        """Shallow copy (shares arrays), or deep copy (new arrays, copied objects and meta)."""
        if not deep:
            return self._from_normalized(dict(self._columns), self._count, self.meta)

        def copy_leaf(leaf: Any) -> Any:
            if isinstance(leaf, LazyColumn):
                return leaf  # immutable
            if is_tensor(leaf):
                return leaf.clone()
            return _copy.deepcopy(leaf) if leaf.dtype == object else leaf.copy()

        cols = {k: tree.map_structure(copy_leaf, v) for k, v in self._columns.items()}
        return self._from_normalized(cols, self._count, _copy.deepcopy(self.meta))

    def split_by_episode(self) -> list[SampleBatch]:
        """One batch per `eps_id`, in order of first appearance, rows in time order."""
        if self.EPS_ID not in self._columns:
            raise KeyError(
                f"split_by_episode() needs an {self.EPS_ID!r} column; "
                f"batch has {sorted(self._columns)}"
            )
        eps = leaf_to_numpy(self._columns[self.EPS_ID])
        if not isinstance(eps, np.ndarray) or eps.ndim != 1:
            raise ValueError(f"{self.EPS_ID!r} must be a 1-D array to split by episode")
        if self._count == 0:
            return []
        _, first, inverse = np.unique(eps, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.intp)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        group = rank[inverse.ravel()]
        t = leaf_to_numpy(self._columns.get(self.T))
        if isinstance(t, np.ndarray) and t.ndim == 1:
            order = np.lexsort((t, group))  # stable: by episode, then t, then row
        else:
            order = np.argsort(group, kind="stable")
        ordered = self.take(order)
        ends = np.cumsum(np.bincount(group))
        starts = np.concatenate(([0], ends[:-1]))
        return [ordered[int(s) : int(e)] for s, e in zip(starts, ends)]

    # --- the hand-over to a learner --------------------------------------------------
    @property
    def device(self) -> torch.device | None:
        """The torch device of the batch's tensor columns; None for a numpy batch."""
        for column in self._columns.values():
            device = column_device(column)
            if device is not None:
                return device
        return None

    def to(self, device: torch.device | str) -> SampleBatch:
        """A batch of the same rows whose columns are torch tensors on ``device``.

        numpy columns go through ``torch.from_numpy``: on the CPU the tensors share the
        arrays' memory (no copy), except read-only arrays, arrays of non-native byte order
        and arrays with negative strides, which are copied first. Tensor columns are moved
        (not copied when already there). Nested columns stay nested. Columns torch has no
        dtype for, object columns such as ``infos`` and string columns, are left out; lazy
        columns (compressed, frame stacks) are materialised. ``meta`` is kept.
        """
        cols = {
            name: tree.map_structure(lambda leaf: leaf_to_tensor(leaf, device), column)
            for name, column in self._columns.items()
            if all(map(_tensor_kind, tree.flatten(column)))
        }
        return self._from_normalized(cols, self._count, self.meta)

    def numpy(self) -> SampleBatch:
        """A batch of the same rows whose tensor columns are numpy arrays (a CPU tensor's
        memory is shared, a device's copied to the host); numpy columns are kept as they are."""
        cols = {k: tree.map_structure(leaf_to_numpy, v) for k, v in self._columns.items()}
        return self._from_normalized(cols, self._count, self.meta)

    def minibatches(
        self,
        size: int,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        epochs: int = 1,
        drop_last: bool = False,
    ) -> Iterator[SampleBatch]:
        """Minibatches of ``size`` rows, ``epochs`` times over the batch, each owning its data.

        Every minibatch holds gathered copies (object rows such as ``infos`` deep-copied),
        so an in-place change to one never reaches this batch or another minibatch. Each
        epoch visits every row once, in the order of one permutation (``shuffle``) or in
        row order; the last minibatch of an epoch is shorter unless ``drop_last``. With
        ``seed`` the order is reproducible (numpy's generator for numpy batches,
        ``torch.randperm`` on the batch's device for tensor batches). ``meta`` is kept,
        except ``rows_per_env``, which no longer describes the rows.

        Raises:
            ValueError: if ``size`` is not an int from 1 to ``len(batch)``, or ``epochs``
                not an int >= 1.
        """
        from rlconnect.batches.minibatch import check_count, gather_owned, minibatch_indices

        size = check_count(size, "size", at_most=self._count, what="rows of the batch")
        epochs = check_count(epochs, "epochs")
        meta = {k: v for k, v in self.meta.items() if k != "rows_per_env"}
        indices = minibatch_indices(
            self._count, size, shuffle=shuffle, seed=seed, epochs=epochs,
            drop_last=drop_last, device=self.device,
        )  # fmt: skip
        for idx in indices:
            cols = {k: gather_owned(v, idx) for k, v in self._columns.items()}
            yield self._from_normalized(cols, len(idx), meta)

    def sequence_minibatches(
        self,
        size: int,
        max_seq_len: int,
        *,
        shuffle: bool = True,
        seed: int | None = None,
        epochs: int = 1,
        drop_last: bool = False,
    ) -> Iterator[SequenceBatch]:
        """Minibatches of ``size`` padded sequences for a recurrent learner.

        The batch is cut once with `rlconnect.batches.chop_into_sequences` (every agent
        trajectory in pieces of ``max_seq_len`` rows); each minibatch is a `SequenceBatch`
        of ``size`` of those pieces, with ``mask``, ``seq_lens`` and each piece's initial
        ``state_in_*``, in arrays of its own. Its ``unpad`` gives the rows piece by piece.
        ``shuffle``, ``seed``, ``epochs`` and ``drop_last`` are as for `minibatches`,
        over pieces instead of rows.

        Raises:
            ValueError: if ``size`` is not an int from 1 to the number of pieces,
                ``max_seq_len`` not an int >= 1, or the batch has no ``eps_id``.
        """
        from rlconnect.batches.minibatch import check_count, minibatch_indices
        from rlconnect.batches.sequences import chop_into_sequences

        sequences = chop_into_sequences(self, max_seq_len)
        size = check_count(size, "size", at_most=sequences.num_seqs, what="sequences")
        epochs = check_count(epochs, "epochs")
        indices = minibatch_indices(
            sequences.num_seqs, size, shuffle=shuffle, seed=seed, epochs=epochs,
            drop_last=drop_last,
        )  # fmt: skip
        for idx in indices:
            yield sequences.take(idx)

    def time_major(self) -> dict[str, Column]:
        """Every column shaped ``[T, N, ...]``: ``N`` sub-envs in ``env_id`` order, ``T``
        rows each in time order (CleanRL's ``(num_steps, num_envs)`` layout).

        A view of the columns when the rows are already sub-env major (as the runner hands
        them out with ``RunnerConfig(equal_rows=True)`` and on the tensor path), a gathered
        copy otherwise. In a multi-agent policy batch each (sub-env, agent) pair is one of
        the ``N``, agent-major. See `rlconnect.batches.time_major`.

        Raises:
            ValueError: if the sub-envs have different numbers of rows (naming
                ``RunnerConfig(equal_rows=True)``), the batch has no ``env_id``, or an
                episode's rows are out of time order.
        """
        from rlconnect.batches.time_major import fold_time_major

        return fold_time_major(self)

    def __repr__(self) -> str:
        parts = []
        for name, column in self._columns.items():
            for path, leaf in tree.flatten_with_path(column):
                label = "/".join([name, *map(str, path)])
                shape = str(tuple(leaf.shape[1:])) if leaf.ndim > 1 else ""
                parts.append(f"{label}{shape} {leaf.dtype}")
        body = ": " + ", ".join(parts) if parts else ""
        return f"SampleBatch({self._count} rows{body})"
