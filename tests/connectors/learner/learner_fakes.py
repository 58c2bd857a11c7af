"""Small fakes for learner connector tests: policies with known values, hand-made batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

import rlconnect as rc

OBS = gym.spaces.Box(-10, 10, (2,), np.float32)
ACT = gym.spaces.Discrete(3)


def ctx() -> rc.ConnectorContext:
    return rc.ConnectorContext(OBS, ACT)


class ValuePolicy(rc.Policy):
    """V(obs, state) = obs[:, 0] + 0.5 * obs[:, 1] (+ state_in_0[:, 0] when recurrent);
    logits = obs[:, :1] * [0, 1, 2]. Counts its compute_values calls and rows."""

    def __init__(self, recurrent: bool = False) -> None:
        super().__init__(OBS, ACT, seed=0)
        self.recurrent = recurrent
        self.value_calls: list[int] = []

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(2, np.float32)] if self.recurrent else []

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> Any:
        raise NotImplementedError

    def compute_values(self, input_batch: Mapping[str, Any]) -> np.ndarray:
        obs = np.asarray(input_batch["obs"], np.float64)
        self.value_calls.append(len(obs))
        v = obs[:, 0] + 0.5 * obs[:, 1]
        if self.recurrent:
            v = v + np.asarray(input_batch["state_in_0"])[:, 0]
        return v.astype(np.float32)

    def logits(self, input_batch: Mapping[str, Any]) -> np.ndarray:
        obs = np.asarray(input_batch["obs"], np.float64)
        return obs[:, :1] * np.arange(3.0)

    def compute_log_likelihoods(self, input_batch: Mapping[str, Any], actions: Any) -> np.ndarray:
        z = self.logits(input_batch)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return logp[np.arange(len(z)), np.asarray(actions)].astype(np.float32)


def batch_of(
    lengths: list[int],
    ends: list[str],
    *,
    seed: int = 0,
    eps: list[int] | None = None,
    agents: list[int] | None = None,
    recurrent: bool = False,
) -> rc.SampleBatch:
    """Trajectories of the given lengths, one after the other; ``ends[i]`` is "term",
    "trunc", "both" or "cut". ``eps[i]`` / ``agents[i]`` set the trajectory's eps_id
    (default: i) and agent_index (default: no such column)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list[Any]] = {k: [] for k in ("eps_id", "t", "terminateds", "truncateds")}
    for i, (n, end) in enumerate(zip(lengths, ends)):
        cols["eps_id"] += [i if eps is None else eps[i]] * n
        cols["t"] += list(range(n))
        cols["terminateds"] += [False] * (n - 1) + [end in ("term", "both")]
        cols["truncateds"] += [False] * (n - 1) + [end in ("trunc", "both")]
    total = sum(lengths)
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["terminateds"] = out["terminateds"].astype(bool)
    out["truncateds"] = out["truncateds"].astype(bool)
    out["rewards"] = rng.normal(size=total).astype(np.float32)
    out["obs"] = rng.uniform(-1, 1, (total, 2)).astype(np.float32)
    out["new_obs"] = rng.uniform(-1, 1, (total, 2)).astype(np.float32)
    out["actions"] = rng.integers(0, 3, total)
    out["action_logp"] = np.log(rng.uniform(0.2, 0.6, total)).astype(np.float32)
    if agents is not None:
        out["agent_index"] = np.repeat(np.asarray(agents), lengths)
    if recurrent:
        out["state_in_0"] = rng.normal(size=(total, 2)).astype(np.float32)
        out["state_out_0"] = rng.normal(size=(total, 2)).astype(np.float32)
    return rc.SampleBatch(out)
