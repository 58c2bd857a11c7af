"""Off-policy estimation: the value of a *target* policy from episodes a *behaviour*
policy recorded, by (weighted) importance sampling.

Each recorded row needs ``action_logp``, the behaviour policy's log-probability of the
action it took (``TorchPolicy`` / ``MLPPolicy`` record it; ``RandomPolicy`` does not). For
an episode with rewards ``r_t`` and per-step ratios ``pi(a_t|s_t) / mu(a_t|s_t)``, let
``p_t`` be the product of the ratios up to and including step ``t``. Then (per-decision
estimators, as in RLlib):

- ``is``: ``V = mean over episodes of sum_t gamma^t p_t r_t``, unbiased;
- ``wis``: ``V = mean over episodes of sum_t gamma^t (p_t / w_t) r_t``, where ``w_t`` is the
  mean of ``p_t`` over the episodes longer than ``t``; biased but of lower variance.

Each estimator reports the metrics ``v_behavior`` (mean discounted return of the recorded
episodes), ``v_target`` (the estimate), ``v_gain`` (``v_target / v_behavior``, NaN when
``v_behavior`` is 0), ``v_target_stderr`` (standard error of the per-episode estimates)
and ``num_episodes``.

>>> import numpy as np, rlconnect as rc
>>> # a one-step bandit: the behaviour policy played arms 0 and 1 uniformly ...
>>> logged = rc.SampleBatch({
...     "eps_id": np.arange(4), "t": np.zeros(4, np.int64), "actions": np.array([0, 1, 0, 1]),
...     "rewards": np.array([1.0, 0.0, 1.0, 0.0]), "action_logp": np.log(np.full(4, 0.5)),
...     "terminateds": np.ones(4, bool), "truncateds": np.zeros(4, bool)})
>>> # ... the target policy plays arm 0 with probability 0.9: its value is 0.9
>>> target = lambda b: np.log(np.where(b["actions"] == 0, 0.9, 0.1))
>>> est = estimate_off_policy([logged], target)
>>> round(est["is"]["v_target"], 6), round(est["wis"]["v_target"], 6), est["is"]["v_behavior"]
(0.9, 0.9, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, concat_samples
from rlconnect.batches.columns import trajectory_keys
from rlconnect.policy import Policy

__all__ = [
    "ImportanceSampling",
    "OffPolicyEstimator",
    "WeightedImportanceSampling",
    "collect_episodes",
    "estimate_off_policy",
    "target_logp",
]

Target = Policy | Callable[[SampleBatch], np.ndarray]


def target_logp(target: Target, batch: SampleBatch) -> np.ndarray:
    """``log pi(actions | obs)`` of every row, float64 ``(B,)``.

    ``target`` is a callable ``batch -> logp`` or a ``TorchPolicy`` (its model's
    distribution evaluated at the recorded ``actions``, i.e. the policy's own outputs).
    """
    if isinstance(target, Policy):
        dist = getattr(target, "dist", None)
        forward = getattr(target, "forward", None)
        if dist is None or not callable(forward):
            raise TypeError(
                f"{type(target).__name__} cannot give log-probabilities of given actions; "
                "pass a TorchPolicy or a callable batch -> logp"
            )
        import torch

        with torch.inference_mode():
            dist_inputs = forward(batch)[0]
            actions = torch.as_tensor(np.asarray(batch[SampleBatch.ACTIONS]))
            logp = dist.logp_torch(dist_inputs, actions)
        return logp.cpu().numpy().astype(np.float64)
    out = np.asarray(target(batch), dtype=np.float64)
    if out.shape != (len(batch),):
        raise ValueError(f"the target's logp has shape {out.shape}, expected ({len(batch)},)")
    return out


def collect_episodes(
    batches: Iterable[SampleBatch | MultiAgentBatch],
    *,
    policy_id: str = DEFAULT_POLICY_ID,
    complete_only: bool = True,
) -> list[SampleBatch]:
    """The episodes (one trajectory per ``eps_id`` and agent) of ``policy_id`` in
    ``batches``, rows in time order; ``complete_only`` keeps those that start at ``t == 0``
    and end terminated or truncated."""
    parts = []
    for b in batches:
        if isinstance(b, MultiAgentBatch):
            if policy_id in b.policy_batches:
                parts.append(b.policy_batches[policy_id])
        else:
            parts.append(b)
    parts = [p for p in parts if len(p)]
    if not parts:
        return []
    rows = concat_samples(parts)
    for col in ("eps_id", "t", "rewards", "actions", "action_logp"):
        if col not in rows:
            hint = (
                " (record with a policy that outputs action_logp, e.g. TorchPolicy)"
                if col == "action_logp"
                else ""
            )
            raise ValueError(f"off-policy estimation needs a {col!r} column{hint}")
    if "agent_index" in rows:  # one trajectory per (episode, agent)
        rows = SampleBatch({**rows, "eps_id": trajectory_keys(rows)}, meta=rows.meta)
    episodes = rows.split_by_episode()
    if complete_only:
        episodes = [
            e
            for e in episodes
            if e["t"][0] == 0 and bool(e["terminateds"][-1] or e["truncateds"][-1])
        ]
    return episodes


class OffPolicyEstimator:
    """Base of the estimators: ``estimate(episodes) -> metrics``; see the module docstring."""

    name = "base"

    def __init__(self, target: Target, *, gamma: float = 1.0) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r}: must lie in [0, 1]")
        self.target, self.gamma = target, float(gamma)

    def _matrices(self, episodes: Sequence[SampleBatch]) -> tuple[np.ndarray, ...]:
        """Rewards, cumulative ratios ``p_t`` and discounts as (episodes, max length)."""
        n, length = len(episodes), max(len(e) for e in episodes)
        rewards = np.zeros((n, length))
        ratios = np.zeros((n, length))
        rows = concat_samples(list(episodes))  # one call of the target for all rows
        log_ratio = target_logp(self.target, rows) - rows["action_logp"].astype(np.float64)
        lengths = np.array([len(e) for e in episodes])
        mask = np.arange(length)[None, :] < lengths[:, None]
        ratios[mask] = log_ratio  # row-major: episode by episode, in time order
        ratios = np.where(mask, np.exp(np.cumsum(ratios, axis=1)), 0.0)
        rewards[mask] = rows["rewards"]
        discounts = self.gamma ** np.arange(length)
        return rewards, ratios, mask, discounts

    def weights(self, ratios: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Weight of each (episode, step) reward; plain importance sampling: ``p_t``."""
        return ratios

    def estimate(self, episodes: Sequence[SampleBatch]) -> dict[str, float]:
        """The metrics of the module docstring over ``episodes`` (see ``collect_episodes``)."""
        if not episodes:
            raise ValueError("off-policy estimation needs at least one complete episode")
        rewards, ratios, mask, disc = self._matrices(episodes)
        v_b = (rewards * disc).sum(axis=1)
        v_t = (self.weights(ratios, mask) * rewards * disc).sum(axis=1)
        behavior, value = float(v_b.mean()), float(v_t.mean())
        n = len(episodes)
        return {
            "v_behavior": behavior,
            "v_target": value,
            "v_gain": value / behavior if behavior != 0 else math.nan,
            "v_target_stderr": float(v_t.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan,
            "num_episodes": n,
        }


class ImportanceSampling(OffPolicyEstimator):
    """Per-decision importance sampling (unbiased)."""

    name = "is"


class WeightedImportanceSampling(OffPolicyEstimator):
    """Per-decision weighted importance sampling: ratios normalised per step."""

    name = "wis"

    def weights(self, ratios: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``p_t / w_t`` with ``w_t`` the mean ``p_t`` over episodes longer than ``t``."""
        counts = mask.sum(axis=0)
        mean = (ratios * mask).sum(axis=0) / np.maximum(counts, 1)
        return np.where(mask, ratios / np.where(mean > 0, mean, 1.0), 0.0)


ESTIMATORS: dict[str, type[OffPolicyEstimator]] = {
    "is": ImportanceSampling,
    "wis": WeightedImportanceSampling,
}


def estimate_off_policy(
    batches: Iterable[SampleBatch | MultiAgentBatch],
    target: Target,
    *,
    estimators: Sequence[str] = ("is", "wis"),
    gamma: float = 1.0,
    policy_id: str = DEFAULT_POLICY_ID,
) -> dict[str, Any]:
    """``{estimator name: metrics}`` for ``target`` over the complete episodes of
    ``policy_id`` in ``batches`` (e.g. ``rc.read_batches(dir)``)."""
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimators {unknown}; known: {sorted(ESTIMATORS)}")
    episodes = collect_episodes(batches, policy_id=policy_id)
    return {e: ESTIMATORS[e](target, gamma=gamma).estimate(episodes) for e in estimators}
