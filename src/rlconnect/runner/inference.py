"""Inference outside sampling: the training-time pipelines and policy, in eval mode.

``Inference.compute_actions({agent_id: obs})`` runs, per policy, exactly what sampling
runs: the policy's agent pipeline, then ``rlconnect.runner.acting.act`` (the policy,
``on_policy_output`` and the action pipeline), and returns the env actions. For the
call both pipelines are switched to eval mode (filters do not update) and afterwards back
to the mode each member was in; their timings are left as they were, so
``perf_stats()`` only reflects sampling.

Rows are keyed by a reserved sub-env id, :data:`INFERENCE_ENV_ID` (-1), which no sampling
sub-env uses; per-agent connector state (frame stacks, previous actions, RNN state) made by
the call is dropped after it, so every call is a fresh episode start. To keep that state
across calls (serving an episode step by step), pass your own ``env_id`` (negative, or >=
``num_envs``): the state is then kept until you call ``runner.agent_pipeline(pid).reset(
env_id)`` and ``runner.action_pipeline(pid).reset(env_id)`` (``Inference.reset(env_id)``
does both for every policy). ``Inference`` is the ``ServedInference`` a runner attaches to
its env (``rlconnect.envs.base``).

Every observation is checked first, as a deployed policy checks it
(``rlconnect.connectors.observations``): a wrong shape or structure, NaN or inf, or a
dtype not castable to the space's raises ``EnvCheckError`` naming the field, and nothing
of the call reaches any state (an ``env_id``'s RNN state or frame stack stays as it was).

With ``explore=True`` the policy samples from its own generators, which advances the
streams the runner samples with (as any policy call does); ``explore=False`` takes the
distribution's mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tree

from rlconnect.connectors.observations import check_observation
from rlconnect.connectors.policy_step import eval_mode, first_rows
from rlconnect.episodes import Episode
from rlconnect.policy import Policy
from rlconnect.runner.acting import act
from rlconnect.runner.pipelines import PolicyPipelines

__all__ = ["INFERENCE_ENV_ID", "Inference", "eval_mode"]

INFERENCE_ENV_ID = -1
"""The sub-env id of rows made by ``compute_actions`` (never a sampling sub-env)."""


class Inference:
    """Env actions for raw observations, through the runner's live pipelines and policies."""

    def __init__(
        self,
        policies: Mapping[str, Policy],
        pipes: PolicyPipelines,
        mapping_fn: Callable[..., str],
        num_envs: int,
    ) -> None:
        self.policies, self.pipes, self.mapping_fn, self.num_envs = (
            policies,
            pipes,
            mapping_fn,
            num_envs,
        )

    def _env_id(self, env_id: int | None) -> int:
        if env_id is None:
            return INFERENCE_ENV_ID
        if isinstance(env_id, bool) or not isinstance(env_id, int | np.integer):
            raise TypeError(f"env_id must be an int, got {env_id!r}")
        if 0 <= env_id < self.num_envs:
            raise ValueError(
                f"env_id={env_id} is one of this runner's sampling sub-envs "
                f"(0..{self.num_envs - 1}); use a negative id or one >= num_envs for "
                "inference state"
            )
        return int(env_id)

    def _by_policy(self, agent_ids: list[Any], policy_id: str | None) -> dict[str, list[Any]]:
        if policy_id is not None:
            pids = [policy_id] * len(agent_ids)
        else:
            probe = Episode(-1, INFERENCE_ENV_ID, self.mapping_fn)
            pids = [probe.policy_for(a) for a in agent_ids]
        groups: dict[str, list[Any]] = {}
        for pid, agent in zip(pids, agent_ids):
            if pid not in self.policies:
                raise ValueError(
                    f"agent {agent!r} maps to unknown policy {pid!r}; policies: "
                    f"{list(self.policies)}"
                )
            groups.setdefault(pid, []).append(agent)
        return groups

    def compute_actions(
        self,
        obs_by_agent: Mapping[Any, Any],
        *,
        policy_id: str | None = None,
        explore: bool = False,
        env_id: int | None = None,
    ) -> dict[Any, Any]:
        """Env actions by agent id for raw env observations by agent id (see the module
        doc). ``policy_id`` serves every agent with that policy; None maps each agent with
        the runner's ``policy_mapping_fn``."""
        if not isinstance(obs_by_agent, Mapping):
            raise TypeError(
                f"obs_by_agent must be a dict agent_id -> obs, got {type(obs_by_agent)}"
            )
        eid = self._env_id(env_id)
        groups = self._by_policy(list(obs_by_agent), policy_id)
        for pid, agents in groups.items():  # all checked before any state changes
            space = self.pipes.agent[pid].input_space
            for a in agents:
                path = "obs" if len(obs_by_agent) == 1 else f"obs[{a!r}]"
                check_observation(space, obs_by_agent[a], path)
        out: dict[Any, Any] = {}
        for pid, agents in groups.items():
            obs = [obs_by_agent[a] for a in agents]
            out.update(zip(agents, self._run(pid, agents, obs, explore, eid)))
        return {a: out[a] for a in obs_by_agent}

    def reset(self, env_id: int) -> None:
        """Drop the connector state every policy's pipelines keep for ``env_id`` (an
        episode served step by step has ended)."""
        for pid in self.policies:
            self.pipes.agent[pid].reset(env_id)
            self.pipes.action[pid].reset(env_id)

    def _run(
        self, pid: str, agents: list[Any], obs: list[Any], explore: bool, eid: int
    ) -> list[Any]:
        pipe, action_pipe = self.pipes.agent[pid], self.pipes.action[pid]
        env_ids = np.full(len(agents), eid, dtype=np.int64)
        data = first_rows(pipe.input_space, obs, env_ids, tuple(agents))
        try:
            with eval_mode(pipe, action_pipe):
                data = pipe(data)
                _, env_actions = act(
                    pid,
                    self.policies[pid],
                    self.pipes,
                    data,
                    env_ids,
                    tuple(agents),
                    explore=explore,
                )
        finally:
            if eid == INFERENCE_ENV_ID:
                pipe.reset(eid)
                action_pipe.reset(eid)
        return [tree.map_structure(lambda a, i=i: a[i], env_actions) for i in range(len(agents))]
