"""Checks of what envs return against their spaces, naming env id, agent id and field."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.batches.take import take_rows
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.errors import EnvCheckError
from rlconnect.spaces import check_batch, stack_samples

__all__ = ["check_rows"]


def _labels(rows: EnvRows, idx: np.ndarray) -> list[str]:
    return [f"env {rows.env_ids[i]} / agent {rows.agent_ids[i]!r}" for i in idx.tolist()]


def check_rows(env: BaseEnv, rows: EnvRows) -> None:
    """Raise EnvCheckError if any row's obs, reward or flags do not fit the env's spaces."""
    if not len(rows):
        return
    idx_all = np.arange(len(rows))
    rewards = np.asarray(rows.rewards)
    bad = ~np.isfinite(rewards)
    if bad.any():
        raise EnvCheckError(f"non-finite rewards from {', '.join(_labels(rows, idx_all[bad])[:5])}")
    groups: dict[Any, list[int]] = {}
    for i, a in enumerate(rows.agent_ids):
        groups.setdefault(a, []).append(i)
    for agent, members in groups.items():
        space = env.observation_space(agent)
        idx = np.asarray(members)
        if rows.stacked:
            obs = rows.obs if len(groups) == 1 else take_rows(rows.obs, idx)
        else:
            try:
                obs = stack_samples(space, [rows.obs[i] for i in members])
            except Exception as exc:
                raise EnvCheckError(
                    f"observations of {', '.join(_labels(rows, idx)[:5])} do not fit {space}: {exc}"
                ) from None
        try:
            check_batch(space, obs, field="obs", row_labels=_labels(rows, idx))
        except ValueError as exc:
            raise EnvCheckError(f"env returned a bad observation: {exc}") from None
