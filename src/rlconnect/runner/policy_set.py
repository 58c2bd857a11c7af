"""The runner's policies: one or a dict of them, their mapping function and their seeds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_POLICY_ID
from rlconnect.episodes import Episode
from rlconnect.errors import did_you_mean
from rlconnect.policy import Policy
from rlconnect.runner.config import RunnerConfig

__all__ = ["CheckedMapping", "policy_set"]


def _only(policy_id: str) -> Callable[..., str]:
    def mapping(agent_id: Any, episode: Episode, **kwargs: Any) -> str:
        return policy_id

    return mapping


class CheckedMapping:
    """A user's ``policy_mapping_fn`` whose every answer is checked against the runner's
    policy ids: an unknown id is a ValueError naming the agent, the id and the known ids
    at the first episode it is returned for (also with one policy, which would otherwise
    take every agent silently). It runs once per agent per episode; it pickles when the
    function does (remote runners)."""

    def __init__(self, fn: Callable[..., str], policy_ids: list[str]) -> None:
        self.fn: Callable[..., str] = fn.fn if isinstance(fn, CheckedMapping) else fn
        self.policy_ids = list(policy_ids)

    def __call__(self, agent_id: Any, episode: Episode, **kwargs: Any) -> str:
        """The user's answer for ``agent_id``; ValueError naming the runner's policy ids
        (and the nearest one) when it is not one of them."""
        pid = self.fn(agent_id, episode, **kwargs)
        if pid not in self.policy_ids:
            raise ValueError(
                f"policy_mapping_fn mapped agent {agent_id!r} to policy id {pid!r}, which is "
                f"not one of the runner's policies {self.policy_ids}"
                f"{did_you_mean(pid, self.policy_ids)}; return one of those ids"
            )
        return pid


def policy_set(
    policies: Policy | Mapping[str, Policy],
    mapping_fn: Callable[..., str] | None,
    config: RunnerConfig,
) -> tuple[dict[str, Policy], Callable[..., str]]:
    """Policies by id and the mapping function (every agent to the only policy when None;
    several policies need one). With ``config.seed`` each policy's generators are seeded
    from ``(seed, worker_index)``, a different stream per policy."""
    by_id = {DEFAULT_POLICY_ID: policies} if isinstance(policies, Policy) else dict(policies)
    if not by_id or not all(isinstance(p, Policy) for p in by_id.values()):
        raise TypeError("policies must be an rc.Policy or a non-empty dict of them")
    if mapping_fn is None:
        if len(by_id) > 1:
            raise ValueError(f"{len(by_id)} policies need a policy_mapping_fn(agent_id, episode)")
        mapping_fn = _only(next(iter(by_id)))
    else:
        mapping_fn = CheckedMapping(mapping_fn, list(by_id))
    if config.seed is not None:
        seeds = np.random.SeedSequence([config.seed, config.worker_index]).spawn(len(by_id))
        for p, ss in zip(by_id.values(), seeds):
            p.seed(int(ss.generate_state(1)[0] % (2**31)))
    return by_id, mapping_fn
