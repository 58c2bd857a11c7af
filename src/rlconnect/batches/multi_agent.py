"""`MultiAgentBatch` (per-policy SampleBatches), `batches_equal` and `concat_samples`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import tree

from rlconnect.batches.compare import _sample_batches_equal, _values_equal
from rlconnect.batches.lazy import concat_lazy
from rlconnect.batches.sample_batch import SampleBatch
from rlconnect.batches.tensors import is_tensor
from rlconnect.batches.time_major import ROWS_PER_ENV

if TYPE_CHECKING:
    import torch

__all__ = ["MultiAgentBatch", "batches_equal", "concat_samples"]


def batches_equal(a: SampleBatch | MultiAgentBatch, b: SampleBatch | MultiAgentBatch) -> bool:
    """True if both have the same columns, nest structures, dtypes and values (NaN == NaN).

    `meta` is not compared. MultiAgentBatches compare `env_steps` and each policy batch.
    """
    if isinstance(a, MultiAgentBatch) and isinstance(b, MultiAgentBatch):
        return (
            a.env_steps() == b.env_steps()
            and a.policy_batches.keys() == b.policy_batches.keys()
            and all(batches_equal(v, b.policy_batches[k]) for k, v in a.policy_batches.items())
        )
    if not (isinstance(a, SampleBatch) and isinstance(b, SampleBatch)):
        return False
    return _sample_batches_equal(a, b)


class MultiAgentBatch:
    """Per-policy SampleBatches collected over `env_steps` environment steps."""

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int):
        if isinstance(env_steps, bool) or not isinstance(env_steps, (int, np.integer)):
            raise TypeError(f"env_steps must be an int, got {env_steps!r}")
        if env_steps < 0:
            raise ValueError(f"env_steps must be >= 0, got {env_steps}")
        for pid, batch in policy_batches.items():
            if not isinstance(batch, SampleBatch):
                raise TypeError(
                    f"policy_batches[{pid!r}] must be a SampleBatch, got {type(batch).__name__}"
                )
        self.policy_batches: dict[str, SampleBatch] = dict(policy_batches)
        self._env_steps = int(env_steps)

    def env_steps(self) -> int:
        """Environment steps these rows were collected over."""
        return self._env_steps

    def agent_steps(self) -> int:
        """Total rows over all policies."""
        return sum(len(b) for b in self.policy_batches.values())

    @property
    def count(self) -> int:
        """Same as `env_steps()`."""
        return self._env_steps

    @property
    def nbytes(self) -> int:
        """Bytes held by all policy batches."""
        return sum(b.nbytes for b in self.policy_batches.values())

    @property
    def device(self) -> torch.device | None:
        """The torch device of the policy batches' tensor columns; None for numpy batches."""
        for batch in self.policy_batches.values():
            device = batch.device
            if device is not None:
                return device
        return None

    def to(self, device: torch.device | str) -> MultiAgentBatch:
        """Every policy batch's columns as torch tensors on ``device`` (see `SampleBatch.to`:
        no copy from numpy on the CPU where torch allows; object columns such as ``infos``
        are left out)."""
        return MultiAgentBatch(
            {pid: b.to(device) for pid, b in self.policy_batches.items()}, self._env_steps
        )

    def numpy(self) -> MultiAgentBatch:
        """Every policy batch's tensor columns as numpy arrays (see `SampleBatch.numpy`)."""
        return MultiAgentBatch(
            {pid: b.numpy() for pid, b in self.policy_batches.items()}, self._env_steps
        )

    def copy(self, deep: bool = False) -> MultiAgentBatch:
        """Copy with each policy batch copied (see `SampleBatch.copy`)."""
        return MultiAgentBatch(
            {pid: b.copy(deep=deep) for pid, b in self.policy_batches.items()}, self._env_steps
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiAgentBatch):
            return NotImplemented
        return batches_equal(self, other)

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as dict is

    def __repr__(self) -> str:
        per_policy = ", ".join(f"{pid}: {len(b)}" for pid, b in self.policy_batches.items())
        return (
            f"MultiAgentBatch(env_steps={self._env_steps}, "
            f"agent_steps={self.agent_steps()}, rows={{{per_policy}}})"
        )


def _merge_meta(metas: Sequence[dict]) -> dict:
    """Keep keys whose values agree; conflicting values become a list of distinct values."""
    seen: dict[str, list] = {}
    for meta in metas:
        for key, value in meta.items():
            values = seen.setdefault(key, [])
            if not any(_values_equal(value, v) for v in values):
                values.append(value)
    return {k: v[0] if len(v) == 1 else v for k, v in seen.items()}


def _concat_sample_batches(batches: Sequence[SampleBatch]) -> SampleBatch:
    meta = _merge_meta([b.meta for b in batches])
    full = [b for b in batches if len(b) > 0]
    # rows per sub-env add up (time_major() then checks every sub-env has that many);
    # a part without the key leaves the sum unknown
    declared = [b.meta.get(ROWS_PER_ENV) for b in full]
    meta.pop(ROWS_PER_ENV, None)
    if declared and all(isinstance(d, int) for d in declared):
        meta[ROWS_PER_ENV] = sum(declared)
    if not full:  # keep the columns (schema) of the first empty batch that has any
        schema = next((b for b in batches if b.keys()), SampleBatch())
        return SampleBatch._from_normalized(dict(schema._columns), 0, meta)
    names = list(full[0].keys())
    for b in full[1:]:
        if set(b.keys()) != set(names):
            differ = sorted(set(names).symmetric_difference(b.keys()))
            raise ValueError(
                f"cannot concatenate batches with different columns; differing: {differ}"
            )
    columns = {}
    memo: dict = {}  # storage shared by columns (a frame pool) is joined once
    for name in names:
        lazy = concat_lazy([b._columns[name] for b in full], memo)
        if lazy is not None:  # all lazy columns of one kind: stays lazy
            columns[name] = lazy
            continue
        parts = [b[name] for b in full]
        try:
            columns[name] = tree.map_structure(_concat_leaves, *parts)
        except (ValueError, TypeError) as err:
            raise ValueError(f"cannot concatenate column {name!r}: {err}") from err
    return SampleBatch._from_normalized(columns, sum(len(b) for b in full), meta)


def _concat_leaves(*leaves: Any) -> Any:
    """One leaf of rows: torch.cat when any part is a tensor (numpy parts join it on its
    device), else np.concatenate."""
    first = next((leaf for leaf in leaves if is_tensor(leaf)), None)
    if first is None:
        return np.concatenate(leaves)
    import torch

    return torch.cat([torch.as_tensor(leaf, device=first.device) for leaf in leaves])


@overload
def concat_samples(batches: Iterable[SampleBatch]) -> SampleBatch: ...
@overload
def concat_samples(batches: Iterable[MultiAgentBatch]) -> MultiAgentBatch: ...
@overload
def concat_samples(
    batches: Iterable[SampleBatch | MultiAgentBatch],
) -> SampleBatch | MultiAgentBatch: ...
def concat_samples(batches: Iterable[Any]) -> SampleBatch | MultiAgentBatch:
    """Concatenate rows: SampleBatches -> SampleBatch, MultiAgentBatches -> MultiAgentBatch.

    Empty SampleBatches are skipped; the others must have the same column names. No batches
    gives an empty SampleBatch. MultiAgentBatches concatenate per policy id (union of
    ids) and sum `env_steps`.
    """
    items = list(batches)
    kinds = {type(b) for b in items}
    bad = [k.__name__ for k in kinds if not issubclass(k, (SampleBatch, MultiAgentBatch))]
    if bad:
        raise TypeError(f"concat_samples() takes SampleBatch or MultiAgentBatch, got {bad}")
    is_multi = [isinstance(b, MultiAgentBatch) for b in items]
    if any(is_multi) and not all(is_multi):
        raise TypeError("cannot concatenate a mix of SampleBatch and MultiAgentBatch")
    if not items or not is_multi[0]:
        return _concat_sample_batches(items)
    policy_ids: dict[str, None] = {}
    for b in items:
        policy_ids.update(dict.fromkeys(b.policy_batches))
    merged = {
        pid: _concat_sample_batches(
            [b.policy_batches[pid] for b in items if pid in b.policy_batches]
        )
        for pid in policy_ids
    }
    return MultiAgentBatch(merged, sum(b.env_steps() for b in items))
