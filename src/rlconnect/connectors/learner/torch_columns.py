"""What learner connectors read from a batch of torch tensors, on its device, with no host read.

The tensor counterparts of :mod:`.trajectories` and :mod:`.values`: trajectories as
per-row masks (``same_next``: row ``t+1`` is in row ``t``'s trajectory) rather than a
list of last rows (whose length only the host would know), float columns in the scans'
dtype, and the values of one ``policy.compute_values`` call. Every check is a flag added
to a :class:`.torch_checks.PendingChecks`; the named error it stands for is found on the
host, with the numpy path's own functions and messages, only when a flag is set.

Trajectories are found from ``eps_id`` / ``agent_index`` as on numpy. When
``batch.meta["rows_per_env"] = T`` (the runner's tensor batches: ``N`` sub-envs, or
multi-agent slots, of ``T`` rows each in time order), each block of ``T`` rows also ends
its last trajectory: a trajectory never spans two sub-envs, and an eps_id that runs on
from one block into the next is refused (the numpy path would take it as one trajectory).

Bootstrap values: on numpy only the last rows of truncated and cut trajectories are given
to ``compute_values``; which rows those are is data the host does not have, so on tensors
the call gets the ``new_obs`` (and ``state_out_*``) of every row, and the values of the
rows that need none are dropped: one call on ``rows`` more rows than numpy's (``2 *
rows`` when the rows' own values are computed too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch
import tree

from rlconnect.connectors.learner.torch_checks import PendingChecks
from rlconnect.connectors.learner.torch_scan import compute_dtype
from rlconnect.connectors.learner.trajectories import find_trajectories
from rlconnect.connectors.learner.values import check_finite, policy_inputs

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = [
    "TensorTrajectories",
    "add_finite_checks",
    "find_tensor_trajectories",
    "next_values",
    "tensor_float",
    "tensor_values",
]


@attrs.frozen
class TensorTrajectories:
    """The trajectories of a batch of tensors, as per-row masks on its device.

    Attributes:
        rows: the batch's rows.
        rows_per_env: ``T`` when the batch is laid out in blocks of ``T`` rows, else None.
        same_next: (rows,) bool, True where the next row is in the same trajectory.
        terminating: (rows,) bool, True on the last row of a terminated trajectory.
        bootstrap: (rows,) bool, True on the last row of a truncated or cut trajectory.
    """

    rows: int
    rows_per_env: int | None
    same_next: torch.Tensor
    terminating: torch.Tensor
    bootstrap: torch.Tensor

    @property
    def device(self) -> torch.device:
        """The device of the masks (the batch's)."""
        return self.same_next.device

    @property
    def dtype(self) -> torch.dtype:
        """What the scans sum in (:func:`.torch_scan.compute_dtype`)."""
        return compute_dtype(self.device)

    @property
    def longest(self) -> int:
        """An upper bound on a trajectory's rows, known without a host read."""
        return self.rows_per_env or self.rows

    def last_index(self) -> torch.Tensor:
        """(rows,) int64: for each row, the row that ends its trajectory."""
        index = torch.arange(self.rows, device=self.device)
        ends = torch.where(self.same_next, self.rows, index)
        return ends.flip(0).cummin(0).values.flip(0)


def _rows_per_env(batch: SampleBatch, who: str) -> int | None:
    value = batch.meta.get("rows_per_env")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{who}: batch.meta['rows_per_env'] must be an int >= 1, got {value!r}")
    if len(batch) % int(value):
        raise ValueError(
            f"{who}: batch.meta['rows_per_env'] is {value} but the batch has {len(batch)} rows, "
            "not a multiple of it (drop the key from meta for a batch not laid out in blocks)"
        )
    return int(value)


def _device(batch: SampleBatch, who: str) -> torch.device:
    for name in ("eps_id", "rewards", "terminateds"):
        col = batch.get(name)
        if isinstance(col, torch.Tensor):
            return col.device
    raise ValueError(f"{who}: a batch of tensors needs 'eps_id' as a torch tensor")


def column_tensor(batch: SampleBatch, name: str, who: str, device: torch.device) -> torch.Tensor:
    """Column ``name`` as a tensor on ``device`` (a numpy column is copied there; a tensor
    on another device is refused, naming both devices)."""
    col = batch[name]
    if not isinstance(col, torch.Tensor):
        return torch.as_tensor(np.asarray(col), device=device)
    if col.device != device:
        raise ValueError(
            f"{who}: column {name!r} is on {col.device} but the batch's 'eps_id' is on "
            f"{device}; move the batch to one device (batch.to(device))"
        )
    return col


def _key(batch: SampleBatch, name: str, who: str, device: torch.device) -> torch.Tensor | None:
    if name not in batch:
        return None
    col = column_tensor(batch, name, who, device)
    if col.dim() != 1 or len(col) != len(batch):
        raise ValueError(f"{who}: column {name!r} must be a 1-D array, got {tuple(col.shape)}")
    return col


def _required(batch: SampleBatch, name: str, what: str, who: str, device: torch.device) -> Any:
    col = _key(batch, name, who, device)
    if col is None:
        raise ValueError(f"{who} needs {what}; the batch has {sorted(batch.keys())}")
    return col


def _key_not_above(eps: torch.Tensor, agent: torch.Tensor | None) -> torch.Tensor:
    """(rows-1,) bool: the key ``(eps_id, agent_index)`` of row ``i+1`` is not above row
    ``i``'s."""
    if agent is None:
        return eps[1:] <= eps[:-1]
    lower = (eps[1:] < eps[:-1]) | ((eps[1:] == eps[:-1]) & (agent[1:] <= agent[:-1]))
    return lower


def _scattered_keys(
    eps: torch.Tensor, agent: torch.Tensor | None, same_next: torch.Tensor, blocks: int | None
) -> torch.Tensor:
    """Bool flags, True somewhere when a key's rows may be in two separate runs.

    With ``blocks`` (the runner's layout, whose eps_ids grow from one episode to the next
    of a sub-env): True where a run is followed in its block by one whose key is not
    above its own (a false alarm when eps_ids do not grow; the host then checks). Else
    exact, by a stable sort of the rows by key, which keeps each key's rows in row order:
    a key in one run has one run number in all its sorted rows."""
    ends = ~same_next
    if blocks:
        inside = torch.arange(1, len(eps), device=eps.device) % blocks != 0
        return ends[:-1] & inside & _key_not_above(eps, agent)
    run = torch.cumsum(ends, 0) - ends.long()
    order = torch.argsort(agent, stable=True) if agent is not None else None
    keys = eps if order is None else eps[order]
    by_key = torch.argsort(keys, stable=True)
    order = by_key if order is None else order[by_key]
    same_key = eps[order][1:] == eps[order][:-1]
    if agent is not None:
        same_key &= agent[order][1:] == agent[order][:-1]
    return same_key & (run[order][1:] != run[order][:-1])


def _host_keys(batch: SampleBatch, names: list[str]) -> SampleBatch:
    from rlconnect.batches import SampleBatch as Batch

    return Batch({n: np.asarray(torch.as_tensor(batch[n]).cpu()) for n in names})


def _explain_structure(batch: SampleBatch, who: str, names: list[str], blocks: int | None) -> None:
    """Raise the numpy path's error for this batch's trajectories (a host copy of its key
    columns), if it has one. With ``blocks``, a key in two blocks is two trajectories: a
    key in two runs is an error only inside one block."""
    keys = _host_keys(batch, names)
    try:
        find_trajectories(keys, who)
    except ValueError as exc:
        if blocks is None or "are not contiguous" not in str(exc):
            raise
        block = np.arange(len(keys)) // blocks
        agent = keys.get("agent_index", 0)
        keys["agent_index"] = block * (int(np.max(agent, initial=0)) + 1) + agent
        find_trajectories(keys, who)


def _spans_blocks(who: str, blocks: int) -> None:
    raise ValueError(
        f"{who}: an eps_id runs on from one block of batch.meta['rows_per_env'] = {blocks} "
        "rows into the next: with rows_per_env each sub-env's rows are its own trajectories "
        "(drop the key from meta for a batch not laid out so)"
    )


def _same_key_next(eps: torch.Tensor, agent: torch.Tensor | None) -> torch.Tensor:
    """(rows,) bool: row ``i+1`` has row ``i``'s key (False on the last row)."""
    same = torch.zeros(len(eps), dtype=torch.bool, device=eps.device)
    same[:-1] = eps[1:] == eps[:-1]
    if agent is not None:
        same[:-1] &= agent[1:] == agent[:-1]
    return same


def find_tensor_trajectories(
    batch: SampleBatch, who: str, checks: PendingChecks
) -> TensorTrajectories:
    """The trajectories of a batch of tensors; their checks (not contiguous, not in
    ``t`` order, going on after an end, with ``rows_per_env`` running on into the next
    block) are added to ``checks``, not read."""
    device = _device(batch, who)
    blocks = _rows_per_env(batch, who)
    eps = _required(batch, "eps_id", "an 'eps_id' column to find trajectories", who, device)
    term = _required(batch, "terminateds", "a 'terminateds' column", who, device).bool()
    agent = _key(batch, "agent_index", who, device)
    trunc = _key(batch, "truncateds", who, device)
    t = _key(batch, "t", who, device)
    same_next = _same_key_next(eps, agent)
    if blocks:
        block_ends = same_next.view(-1, blocks)[:, -1]
        checks.add(block_ends.clone(), lambda: _spans_blocks(who, blocks))
        block_ends.fill_(False)
    ended = term if trunc is None else term | trunc.bool()
    bad = [same_next & ended, _scattered_keys(eps, agent, same_next, blocks)]
    if t is not None and not t.is_complex() and t.dtype != torch.bool:
        bad.append(same_next[:-1] & (t[1:] <= t[:-1]))
    names = [n for n in ("eps_id", "agent_index", "terminateds", "truncateds", "t") if n in batch]
    flag = torch.stack([b.any() for b in bad])
    checks.add(flag, lambda: _explain_structure(batch, who, names, blocks))
    last = ~same_next
    return TensorTrajectories(len(batch), blocks, same_next, last & term, last & ~term)


def tensor_float(batch: SampleBatch, name: str, who: str, traj: TensorTrajectories) -> Any:
    """Column ``name``, one real number per row, in the scans' dtype (a new tensor when
    that is not its dtype; read it only). Not checked finite: see :func:`add_finite_checks`."""
    if name not in batch:
        raise ValueError(f"{who} needs a {name!r} column; the batch has {sorted(batch.keys())}")
    col = column_tensor(batch, name, who, traj.device)
    if tuple(col.shape) != (len(batch),) or col.is_complex():
        raise ValueError(
            f"{who}: column {name!r} must be one real number per row, got {col.dtype} "
            f"{tuple(col.shape)}"
        )
    return col.to(traj.dtype)


def _host(x: torch.Tensor) -> np.ndarray:
    return np.asarray(x.detach().cpu())


def add_finite_checks(
    checks: PendingChecks,
    who: str,
    entries: list[tuple[str, torch.Tensor, torch.Tensor | None]],
) -> None:
    """One check that every ``(what, values, rows)`` entry is finite (only on the rows
    where the bool mask ``rows`` is True, when given: ``values`` must be 0 on the others);
    its error names the first bad entry's first bad row as the numpy path does
    (:func:`.values.check_finite`). The flag is one sum per entry (NaN and inf reach it;
    a sum that overflows is a false alarm, which the host's check then clears)."""
    if not entries:
        return
    bad = [~torch.isfinite(values.sum()) for _, values, _ in entries]

    def explain() -> None:
        for what, values, rows in entries:
            if rows is None:
                check_finite(_host(values), what, who)
            else:
                mask = _host(rows)
                check_finite(_host(values)[mask], what, who, np.flatnonzero(mask))

    checks.add(torch.stack(bad), explain)


def _joined(parts: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """The inputs of one ``compute_values`` call: the parts' columns on ``device``, one
    after the other (a single part as it is, not copied)."""

    def cat(*xs: Any) -> torch.Tensor:
        leaves = [torch.as_tensor(x, device=device) for x in xs]
        return leaves[0] if len(leaves) == 1 else torch.cat(leaves)

    return {k: tree.map_structure(cat, *(p[k] for p in parts)) for k in parts[0]}


def tensor_values(
    batch: SampleBatch,
    policy: Policy,
    traj: TensorTrajectories,
    checks: PendingChecks,
    *,
    rows_too: bool,
    who: str,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(row_values, after)`` in the scans' dtype from ONE ``policy.compute_values`` call:
    the value of every row (only with ``rows_too``, else None) and, per row, the value
    after it when it ends a truncated or cut trajectory (0 on every other row). The
    policy may return a tensor on any device or a numpy array."""
    n = len(batch)
    zeros = torch.zeros(n, dtype=traj.dtype, device=traj.device)
    if not n:
        return (zeros if rows_too else None), zeros
    parts = [policy_inputs(batch, policy, None, after=False, who=who)] if rows_too else []
    parts.append(policy_inputs(batch, policy, None, after=True, who=who))
    got = policy.compute_values(_joined(parts, traj.device))
    values = torch.as_tensor(got, device=traj.device).to(traj.dtype)
    if tuple(values.shape) != (len(parts) * n,):
        raise ValueError(
            f"{who}: {type(policy).__name__}.compute_values returned shape "
            f"{tuple(values.shape)} for {len(parts) * n} rows"
        )
    row_values = values[:n] if rows_too else None
    after = torch.where(traj.bootstrap, values[-n:], zeros)
    entries = [] if row_values is None else [(_OBS_VALUE, row_values, None)]
    add_finite_checks(checks, who, [*entries, (_BOOT_VALUE, after, traj.bootstrap)])
    return row_values, after


_OBS_VALUE = "the policy's value (compute_values of obs)"
_BOOT_VALUE = "the bootstrap value (compute_values of new_obs)"


def next_values(
    values: torch.Tensor, traj: TensorTrajectories, after: torch.Tensor
) -> torch.Tensor:
    """(rows,): for each row the value of the next row of its trajectory, and ``after``
    (the bootstrap, or 0 after a termination) on each trajectory's last row."""
    following = torch.cat((values[1:], values[:1]))  # (the wrapped row is never taken)
    return torch.where(traj.same_next, following, after)
