"""The built-in learner connectors on a batch of torch tensors, on its device.

Each function here is what the connector of its name does when its batch's columns are
torch tensors (the connector's ``__call__`` hands the batch over): the same columns, the
same float32 results as on numpy within float32 rounding, every error the numpy path
raises with the same message, and no host read inside the call but the one that reads
its checks (:mod:`.torch_checks`: none inside ``deferred_checks()``). The scans are in
:mod:`.torch_scan`, the trajectories and values in :mod:`.torch_columns`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import tree

from rlconnect.connectors.learner.n_step import n_step_carried
from rlconnect.connectors.learner.torch_checks import check_scope
from rlconnect.connectors.learner.torch_columns import (
    add_finite_checks,
    column_tensor,
    find_tensor_trajectories,
    next_values,
    tensor_float,
    tensor_values,
)
from rlconnect.connectors.learner.torch_scan import compute_dtype, reverse_linear_scan, window_sum
from rlconnect.connectors.learner.values import new_columns, policy_inputs

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.connectors.learner.gae import GAE
    from rlconnect.connectors.learner.n_step import NStepReturns
    from rlconnect.connectors.learner.returns import DiscountedReturns
    from rlconnect.connectors.learner.vtrace import VTrace
    from rlconnect.policy import Policy

__all__ = [
    "gae_on_tensors",
    "n_step_on_tensors",
    "normalize_on_tensors",
    "returns_on_tensors",
    "vtrace_on_tensors",
]


def gae_on_tensors(conn: GAE, batch: SampleBatch, policy: Policy) -> SampleBatch:
    """:class:`.GAE` on tensors: one scan of the deltas, one ``compute_values`` call."""
    who = conn.name
    has_vf = "vf_preds" in batch
    new_columns(batch, ("advantages", "value_targets", *(() if has_vf else ("vf_preds",))), who)
    with check_scope() as checks:
        traj = find_tensor_trajectories(batch, who, checks)
        rewards = tensor_float(batch, "rewards", who, traj)
        values = tensor_float(batch, "vf_preds", who, traj) if has_vf else None
        row_values, after = tensor_values(
            batch, policy, traj, checks, rows_too=values is None, who=who
        )
        values = row_values if values is None else values
        assert values is not None  # (asked for with rows_too)
        delta = rewards + conn.gamma * next_values(values, traj, after) - values
        coef = traj.same_next.to(traj.dtype) * (conn.gamma * conn.lambda_)
        advantages = reverse_linear_scan(delta, coef, traj.rows_per_env)
        targets = (advantages + values).float()
        inputs = [("column 'rewards'", rewards, None), ("column 'vf_preds'", values, None)]
        add_finite_checks(checks, who, [*inputs, ("the value target", targets, None)])
    out = {"advantages": advantages.float(), "value_targets": targets}
    if not has_vf:
        out["vf_preds"] = values.float()
    batch.update(out)
    return batch


def returns_on_tensors(conn: DiscountedReturns, batch: SampleBatch, policy: Policy) -> SampleBatch:
    """:class:`.DiscountedReturns` on tensors: one scan of the rewards."""
    who = conn.name
    new_columns(batch, ("returns",), who)
    with check_scope() as checks:
        traj = find_tensor_trajectories(batch, who, checks)
        rewards = tensor_float(batch, "rewards", who, traj)
        add_finite_checks(checks, who, [("column 'rewards'", rewards, None)])
        _, after = tensor_values(batch, policy, traj, checks, rows_too=False, who=who)
        coef = traj.same_next.to(traj.dtype) * conn.gamma
        returns = reverse_linear_scan(rewards + conn.gamma * after, coef, traj.rows_per_env)
        returns = returns.float()
        add_finite_checks(checks, who, [("the return", returns, None)])
    batch["returns"] = returns
    return batch


def _rows(column: Any, index: torch.Tensor) -> Any:
    """The rows ``index`` of a column (a nest of tensors), gathered on the device."""
    return tree.map_structure(lambda x: torch.as_tensor(x, device=index.device)[index], column)


def n_step_on_tensors(conn: NStepReturns, batch: SampleBatch, policy: Policy) -> SampleBatch:
    """:class:`.NStepReturns` on tensors: ``min(n, T)`` whole-batch steps of window sums."""
    who = conn.name
    carried = n_step_carried(batch, policy, who)
    outputs = ("n_step_rewards", "n_step_new_obs", "n_step_discount")
    new_columns(batch, (*outputs, *(f"n_step_{c}" for c in carried)), who)
    with check_scope() as checks:
        traj = find_tensor_trajectories(batch, who, checks)
        rewards = tensor_float(batch, "rewards", who, traj)
        add_finite_checks(checks, who, [("column 'rewards'", rewards, None)])
        sums = window_sum(rewards, traj.same_next, conn.gamma, conn.n, traj.longest)
        add_finite_checks(checks, who, [("the n-step reward sum", sums, None)])
        index = torch.arange(len(batch), device=traj.device)
        k_minus_1 = torch.clamp(traj.last_index() - index, max=conn.n - 1)
        last = index + k_minus_1
        discount = torch.pow(conn.gamma, (k_minus_1 + 1).to(traj.dtype))
        discount = torch.where(traj.terminating[last], 0.0, discount)
    batch.update(
        {
            "n_step_rewards": sums.float(),
            "n_step_new_obs": _rows(batch["new_obs"], last),
            "n_step_discount": discount.float(),
            **{f"n_step_{c}": _rows(batch[c], last) for c in carried},
        }
    )
    return batch


def _vtrace_rho(conn: VTrace, batch: SampleBatch, policy: Policy, traj: Any, checks: Any) -> Any:
    """Importance weights exp(target logp - behaviour logp) of the recorded actions."""
    who = conn.name
    behaviour = tensor_float(batch, "action_logp", who, traj)
    add_finite_checks(checks, who, [("column 'action_logp'", behaviour, None)])
    if "actions" not in batch:
        raise ValueError(f"{who} needs an 'actions' column; the batch has {sorted(batch)}")
    inputs = policy_inputs(batch, policy, None, after=False, who=who)
    actions = column_tensor(batch, "actions", who, traj.device)
    got = policy.compute_log_likelihoods(inputs, actions)
    target = torch.as_tensor(got, device=traj.device).to(traj.dtype)
    if tuple(target.shape) != (len(batch),):
        raise ValueError(
            f"{who}: {type(policy).__name__}.compute_log_likelihoods returned shape "
            f"{tuple(target.shape)} for {len(batch)} rows"
        )
    what = "the policy's log-probability of the recorded action"
    add_finite_checks(checks, who, [(what, target, None)])
    return torch.exp(target - behaviour)


def vtrace_on_tensors(conn: VTrace, batch: SampleBatch, policy: Policy) -> SampleBatch:
    """:class:`.VTrace` on tensors: one scan of the clipped temporal differences."""
    who = conn.name
    new_columns(batch, ("vtrace_targets", "pg_advantages"), who)
    with check_scope() as checks:
        traj = find_tensor_trajectories(batch, who, checks)
        rewards = tensor_float(batch, "rewards", who, traj)
        add_finite_checks(checks, who, [("column 'rewards'", rewards, None)])
        rho = _vtrace_rho(conn, batch, policy, traj, checks)
        values, after = tensor_values(batch, policy, traj, checks, rows_too=True, who=who)
        assert values is not None  # (asked for with rows_too)
        delta = (conn.gamma * next_values(values, traj, after) + rewards - values) * torch.clamp(
            rho, max=conn.clip_rho
        )
        coef = torch.clamp(rho, max=conn.clip_c) * conn.gamma * traj.same_next
        targets = reverse_linear_scan(delta, coef, traj.rows_per_env) + values
        advantages = conn.gamma * next_values(targets, traj, after) + rewards - values
        advantages = (advantages * torch.clamp(rho, max=conn.clip_pg_rho)).float()
        targets = targets.float()
        add_finite_checks(
            checks,
            who,
            [("the V-trace advantage", advantages, None), ("the V-trace target", targets, None)],
        )
    batch.update({"vtrace_targets": targets, "pg_advantages": advantages})
    return batch


def normalize_on_tensors(who: str, batch: SampleBatch, floor: float) -> SampleBatch:
    """:class:`.NormalizeAdvantages` on tensors: a new float32 tensor (the batch's old
    ``advantages`` tensor, which a parent batch may share, is not written to)."""
    if "advantages" not in batch:
        raise ValueError(f"{who} needs a 'advantages' column; the batch has {sorted(batch)}")
    adv = batch["advantages"]
    if tuple(adv.shape) != (len(batch),) or adv.is_complex():
        raise ValueError(
            f"{who}: column 'advantages' must be one real number per row, got "
            f"{adv.dtype} {tuple(adv.shape)}"
        )
    if not len(batch):
        return batch
    with check_scope() as checks:
        add_finite_checks(checks, who, [("column 'advantages'", adv, None)])
        wide = adv.to(compute_dtype(adv.device))
        centred = wide - wide.mean()
        std = torch.sqrt(torch.mean(centred * centred)).clamp(min=floor)
        normalized = (centred / std).float()
    batch["advantages"] = normalized
    return batch
