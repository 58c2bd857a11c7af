"""What learner connectors read: finite float columns, and state values from the policy.

All bootstrap values of a batch (the value of each truncated or cut trajectory's last
``new_obs``, from its ``state_out_*`` for a recurrent policy) come from one
``policy.compute_values`` call, together with the values of the rows themselves when a
connector needs those too. Every input is checked to be finite before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches.columns import NEXT_INPUTS_OF
from rlconnect.connectors.learner.trajectories import Trajectories

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch
    from rlconnect.policy import Policy

__all__ = [
    "as_float32",
    "check_finite",
    "float_column",
    "new_columns",
    "next_values",
    "policy_inputs",
    "require_log_likelihoods",
    "require_values",
    "values_and_bootstrap",
]


def check_finite(values: np.ndarray, what: str, who: str, rows: np.ndarray | None = None) -> None:
    """Raise ValueError naming the first row (of the batch: ``rows[i]`` when given) where
    ``values`` is NaN or infinite, ``what`` it is and ``who`` read it."""
    with np.errstate(over="ignore"):  # a finite sum that overflows is looked at below
        total = np.sum(values)
    if np.isfinite(total):  # one reduction, no temporary: NaN and inf propagate
        return
    ok = np.isfinite(values)
    if ok.all():  # finite values whose sum overflows
        return
    i = int(np.flatnonzero(~ok.reshape(len(values), -1).all(axis=1))[0])
    row = i if rows is None else int(rows[i])
    raise ValueError(
        f"{who}: {what} is {np.asarray(values[i]).tolist()} at row {row}; learner connectors "
        "need finite rewards and values (fix the env or the policy, or drop those rows); the "
        "batch is unchanged"
    )


FLOAT32_MAX = float(np.finfo(np.float32).max)


def as_float32(values: np.ndarray, what: str, who: str) -> np.ndarray:
    """``values`` (finite, summed in float64) as the float32 column they are stored in; a
    ValueError naming the first row whose value lies beyond float32's range (where the
    cast would silently give inf), what it is and the fix."""
    with np.errstate(over="ignore"):
        out = values.astype(np.float32)
    with np.errstate(over="ignore"):
        total = np.sum(out)
    if np.isfinite(total) or np.isfinite(out).all():
        return out
    i = int(np.flatnonzero(~np.isfinite(out))[0])
    raise ValueError(
        f"{who}: {what} at row {i} is {float(values[i]):.6g}, beyond float32's range "
        f"(+-{FLOAT32_MAX:.4g}), so it would be stored as inf; scale or clip the rewards "
        "(e.g. RunnerConfig(clip_rewards=...) or a reward-scaling connector); the batch is "
        "unchanged"
    )


def float_column(batch: SampleBatch, name: str, who: str, finite: bool = True) -> np.ndarray:
    """Column ``name``, one real number per row (not copied: read it only), checked finite
    unless ``finite`` is False (for a caller whose result shows any non-finite input and
    that checks its inputs when it does)."""
    if name not in batch:
        raise ValueError(f"{who} needs a {name!r} column; the batch has {sorted(batch.keys())}")
    values = np.asarray(batch[name])
    if values.shape != (len(batch),) or values.dtype.kind not in "biuf":
        raise ValueError(
            f"{who}: column {name!r} must be one real number per row, got {values.dtype} "
            f"{values.shape}"
        )
    if finite:
        check_finite(values, f"column {name!r}", who)
    return values


def new_columns(batch: SampleBatch, names: tuple[str, ...], who: str) -> None:
    """Raise ValueError if the batch already has one of the columns ``who`` adds."""
    taken = [n for n in names if n in batch]
    if taken:
        raise ValueError(
            f"{who} adds {list(names)} but the batch already has {taken}; learner connectors "
            "never change existing columns (drop them first, or run the connector once)"
        )


def policy_inputs(
    batch: SampleBatch, policy: Policy, rows: np.ndarray | None, *, after: bool, who: str
) -> dict[str, Any]:
    """``compute_values`` / ``compute_actions`` input for ``rows`` (None: all rows): their
    ``obs`` and ``state_in_*``, or with ``after`` the step after them: ``new_obs``,
    ``state_out_*`` as ``state_in_*``, and when the batch has ``prev_actions`` /
    ``prev_rewards`` their values at that next step, ``new_prev_actions`` /
    ``new_prev_rewards`` (``NEXT_INPUTS_OF``: what the policy is fed there, which the
    recorded ``actions`` / ``rewards`` are not once a connector such as ``ClipReward``
    follows ``PrevActionsRewards``)."""
    names = {"obs": "new_obs" if after else "obs"}
    for i in range(policy.num_state_tensors()):
        names[f"state_in_{i}"] = f"state_{'out' if after else 'in'}_{i}"
    for prev, next_col in NEXT_INPUTS_OF.items():
        if prev in batch:
            names[prev] = next_col if after else prev
    missing = [col for col in names.values() if col not in batch]
    if missing:
        hint = ""
        if any(col in NEXT_INPUTS_OF.values() for col in missing):
            hint = (
                " (the runner records new_prev_actions / new_prev_rewards next to new_obs; "
                "a batch made elsewhere needs them, each row's next prev_* input)"
            )
        raise ValueError(
            f"{who} needs columns {missing} to compute values with {type(policy).__name__}; "
            f"the batch has {sorted(batch.keys())}{hint}"
        )
    if rows is None:
        return {key: batch[col] for key, col in names.items()}
    needed = batch.copy()  # shallow: only the needed columns' rows are taken below, so a
    for col in list(needed.keys()):  # compressed or frame-stacked column is not expanded
        if col not in names.values():
            del needed[col]
    picked = needed.take(rows)
    return {key: picked[col] for key, col in names.items()}


def _concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    if len(parts) == 1:
        return parts[0]
    return {
        k: tree.map_structure(lambda *xs: np.concatenate(xs), *(p[k] for p in parts))
        for k in parts[0]
    }


def values_and_bootstrap(
    batch: SampleBatch, policy: Policy, traj: Trajectories, *, rows_too: bool, who: str
) -> tuple[np.ndarray | None, np.ndarray]:
    """``(row_values, after_last)``, float64: the value of every row (only with ``rows_too``,
    else None) and, per trajectory, the value after its last row (0 when terminated), all
    from ONE ``policy.compute_values`` call (none when nothing needs a value)."""
    n, boot_rows = len(batch), traj.bootstrap_rows
    parts = []
    if rows_too and n:
        parts.append(policy_inputs(batch, policy, None, after=False, who=who))
    if len(boot_rows):
        parts.append(policy_inputs(batch, policy, boot_rows, after=True, who=who))
    want = (n if rows_too else 0) + len(boot_rows)
    values = np.zeros(0)
    if parts:
        values = np.asarray(policy.compute_values(_concat(parts)), dtype=np.float64)
        if values.shape != (want,):
            raise ValueError(
                f"{who}: {type(policy).__name__}.compute_values returned shape {values.shape} "
                f"for {want} rows"
            )
    row_values = values[:n] if rows_too else None
    if row_values is not None:
        check_finite(row_values, "the policy's value (compute_values of obs)", who)
    boot = values[len(values) - len(boot_rows) :]
    check_finite(boot, "the bootstrap value (compute_values of new_obs)", who, boot_rows)
    after_last = np.zeros(len(traj.last_rows))
    after_last[~traj.terminated] = boot
    return row_values, after_last


def next_values(values: np.ndarray, last: np.ndarray, after_last: np.ndarray) -> np.ndarray:
    """(N,) float64: for each row the value of the next row of its trajectory, and
    ``after_last`` (the bootstrap, or 0 after a termination) after each ``last`` row."""
    out = np.empty(len(values))
    out[:-1] = values[1:]
    out[last] = after_last
    return out


def _zeros(space: gym.Space) -> Any:
    """One all-zero row of ``space``, batched (leading axis 1)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _zeros(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_zeros(s) for s in space.spaces)
    return np.zeros((1, *(space.shape or ())), dtype=space.dtype or np.float32)


def _probe_batch(policy: Policy) -> dict[str, Any]:
    batch: dict[str, Any] = {"obs": _zeros(policy.observation_space)}
    for i, s in enumerate(policy.get_initial_state()):
        batch[f"state_in_{i}"] = np.asarray(s)[None]
    return batch


def _probe_actions(space: gym.Space) -> np.ndarray:
    """One valid action of ``space``, batched: the lowest for discrete spaces, else zeros."""
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        return np.asarray(space.start, dtype=np.int64)[None]
    return np.asarray(_zeros(space))


def require_values(policy: Policy, who: str) -> None:
    """ValueError (naming ``who``, the values and the fix) if ``policy`` has no
    ``compute_values``: it is called once on one all-zero row to find out. Only
    NotImplementedError means "no values"; any other error of this probe (a policy that
    reads more columns than obs and state) is left to the real call to report."""
    try:
        policy.compute_values(_probe_batch(policy))
    except NotImplementedError as exc:
        raise ValueError(
            f"{who} needs state values ('vf_preds' and the bootstrap values of truncated and "
            f"cut trajectories from policy.compute_values), but {exc}"
        ) from None
    except Exception:  # inconclusive probe: see the docstring
        pass


def require_log_likelihoods(policy: Policy, who: str) -> None:
    """ValueError (naming ``who``, ``action_logp`` and the fix) if ``policy`` has no action
    distribution to give log-probabilities of recorded actions (probed like
    :func:`require_values`)."""
    try:
        policy.compute_log_likelihoods(_probe_batch(policy), _probe_actions(policy.action_space))
    except NotImplementedError as exc:
        raise ValueError(
            f"{who} needs 'action_logp' of the recorded actions and the current policy's "
            f"log-probabilities of them (policy.compute_log_likelihoods), but {exc}"
        ) from None
    except Exception:  # inconclusive probe: see require_values
        pass
