"""`to_tensordict`: a batch in TorchRL's layout.

TorchRL's losses and advantage modules read a transition as ``observation`` and
``action`` at the root and what the step led to under ``"next"``: ``("next",
"observation")``, ``("next", "reward")``, ``("next", "done")``, ``("next", "terminated")``,
``("next", "truncated")``, the last four shaped ``[..., 1]``. The other columns keep their
names at the root (``action_logp``, ``vf_preds``, ``eps_id``, ``state_in_0``, ...; tell a
loss where its inputs are with ``loss.set_keys(sample_log_prob="action_logp")``). Dict
columns become nested TensorDicts, tuple columns too (keys ``"0"``, ``"1"``, ...).

A TensorDict holds tensors only: ``infos`` is left out by default (``exclude``), and any
other column torch has no dtype for raises `InteropError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import SampleBatch
from rlconnect.batches.tensors import tensor_kind
from rlconnect.batches.time_major import slot_layout
from rlconnect.interop.errors import InteropError, import_peer, single_agent, with_columns

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

__all__ = ["to_tensordict"]

#: rlconnect column -> TorchRL key, for the columns TorchRL names itself
_RENAMED: dict[str, Any] = {
    SampleBatch.OBS: "observation",
    SampleBatch.ACTIONS: "action",
    SampleBatch.NEXT_OBS: ("next", "observation"),
}
#: per-row scalars TorchRL keeps as [..., 1]
_FLAGS: dict[str, Any] = {
    SampleBatch.REWARDS: ("next", "reward"),
    SampleBatch.TERMINATEDS: ("next", "terminated"),
    SampleBatch.TRUNCATEDS: ("next", "truncated"),
}
_NEEDED = (*_RENAMED, *_FLAGS)


def to_tensordict(
    batch: SampleBatch,
    *,
    device: torch.device | str | None = None,
    time_dim: bool = False,
    exclude: Iterable[str] = (SampleBatch.INFOS,),
) -> TensorDict:
    """``batch`` as a ``tensordict.TensorDict`` in TorchRL's layout (module docstring).

    ``batch_size`` is ``[B]``, or with ``time_dim=True`` ``[N, T]``: one row per sub-env,
    time last, as a TorchRL collector lays out ``N`` envs (what ``GAE`` needs to bootstrap
    each sub-env from its own next value; the batch must have equal rows per sub-env, see
    `SampleBatch.time_major`). ``device``: where the tensors go (default: the batch's own
    device, the CPU for numpy; CPU tensors share the arrays' memory where torch allows).
    ``("next", "done")`` is ``terminated | truncated``.

    Raises:
        InteropError: if the batch lacks ``obs``, ``new_obs``, ``actions``, ``rewards``,
            ``terminateds`` or ``truncateds``, or holds a column torch has no dtype for
            (name it in ``exclude``).
        ValueError: for ``time_dim=True`` on unequal rows per sub-env.
        ImportError: if tensordict is not installed (``rlconnect[torchrl]``).
    """
    tensordict = import_peer("tensordict", "torchrl")
    batch = single_agent(batch, "to_tensordict")
    with_columns(batch, _NEEDED, "to_tensordict")
    skip = set(exclude)
    for name in batch:
        if name not in skip and not all(map(tensor_kind, tree.flatten(batch[name]))):
            raise InteropError(
                f"column {name!r} cannot go into a TensorDict (torch has no dtype for "
                f"{_dtypes(batch[name])}); leave it out with exclude=(..., {name!r})"
            )
    target = device if device is not None else (batch.device or "cpu")
    tensors = batch.to(target)
    source: dict[Any, Any] = {}
    for name in tensors:
        if name in skip:
            continue
        value = _as_dicts(tensors[name])
        if name in _FLAGS:
            value = value.unsqueeze(-1)
        _put(source, _FLAGS.get(name, _RENAMED.get(name, name)), value)
    nxt = source["next"]
    nxt["done"] = nxt["terminated"] | nxt["truncated"]
    out = tensordict.TensorDict(source, batch_size=[len(batch)], device=target)
    return _with_time_dim(out, batch) if time_dim else out


def _put(source: dict[Any, Any], key: Any, value: Any) -> None:
    if isinstance(key, tuple):
        source.setdefault(key[0], {})[key[1]] = value
    else:
        source[key] = value


def _as_dicts(column: Any) -> Any:
    """Tuples of a nest as dicts keyed "0", "1", ... (namedtuples by field), for TensorDict."""
    if isinstance(column, Mapping):
        return {str(k): _as_dicts(v) for k, v in column.items()}
    if isinstance(column, tuple):
        names = getattr(column, "_fields", None) or [str(i) for i in range(len(column))]
        return {n: _as_dicts(v) for n, v in zip(names, column)}
    return column


def _dtypes(column: Any) -> str:
    kinds = {str(getattr(leaf, "dtype", type(leaf).__name__)) for leaf in tree.flatten(column)}
    return ", ".join(sorted(kinds))


def _with_time_dim(td: TensorDict, batch: SampleBatch) -> TensorDict:
    """``[B]`` -> ``[N, T]``, sub-env major (rows gathered into that order if need be)."""
    import torch

    order, rows = slot_layout(batch)
    if order is not None:
        td = td[torch.as_tensor(np.asarray(order), device=td.device)]
    return td.reshape(len(batch) // rows, rows)
