"""DeployedPolicy: an exported policy file run on raw observations, one session per episode.

``load_policy(path)`` verifies the file, rebuilds the policy by registered kind and both
pipelines through the connector registry, all in eval mode (statistics frozen), and never
builds an env or a runner. Each call runs exactly what ``runner.compute_single_action``
runs (``rlconnect.connectors.policy_step``), so the actions are the same, bit for bit::

    policy = rc.load_policy("cartpole.policy")
    action = policy.compute_action(obs, session="player-7")   # keeps frame stacks, RNN state
    ...
    policy.end_session("player-7")                             # the episode ended

Sessions are independent. A lock makes every call atomic, so threads may call for
different sessions at once (the calls run one after another; batch sessions into one
``compute_actions`` call to share a forward pass).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Hashable, Sequence
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.checkpoints.pipelines import build_pipeline
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
)
from rlconnect.connectors.observations import check_observations, check_rewards
from rlconnect.connectors.policy_step import first_rows, respond
from rlconnect.deploy.policy_file import PolicyFile, read_policy_file
from rlconnect.errors import CheckpointError
from rlconnect.policy import Policy, get_policy_class, policy_from_spec
from rlconnect.spaces import describe_space

__all__ = ["DeployedPolicy", "load_policy"]


class DeployedPolicy:
    """A policy and its pipelines from an exported file (see the module docstring).

    Attributes:
        observation_space: what one raw observation must fit (the env's space).
        action_space: the space of the returned actions (the env's).
        policy_id: the id the policy had in the runner it was exported from.
        policy: the rebuilt ``rc.Policy`` (weights loaded; its generators seeded at load).
    """

    def __init__(
        self,
        file: PolicyFile,
        policy: Policy,
        agent_pipeline: AgentConnectorPipeline,
        action_pipeline: ActionConnectorPipeline,
    ) -> None:
        self.file = file
        self.policy_id = file.policy_id
        self.observation_space: gym.Space = file.observation_space
        self.action_space: gym.Space = file.action_space
        self.policy = policy
        self.agent_pipeline = agent_pipeline
        self.action_pipeline = action_pipeline
        self._lock = threading.Lock()
        self._sessions: dict[Hashable, int] = {}
        self._next_id = itertools.count()

    @property
    def sessions(self) -> list[Hashable]:
        """The open sessions (each holds per-episode connector state)."""
        with self._lock:
            return list(self._sessions)

    def compute_action(
        self, obs: Any, *, session: Hashable = None, reward: Any = None, explore: bool = False
    ) -> Any:
        """The env action for one raw observation. ``session`` keeps the episode's
        connector state from call to call (None: a fresh episode start at every call);
        ``reward`` is what the env returned with ``obs`` (ignored at a session's first call).
        ``explore=True`` samples from the policy's distribution instead of its mode."""
        sessions = None if session is None else [session]
        rewards = None if reward is None else [reward]
        return self.compute_actions([obs], sessions=sessions, rewards=rewards, explore=explore)[0]

    def compute_actions(
        self,
        obs_batch: Any,
        *,
        sessions: Sequence[Hashable] | None = None,
        rewards: Any = None,
        explore: bool = False,
    ) -> list[Any]:
        """One env action per row of ``obs_batch`` (a stacked batch of the observation
        space, or a list of observations), row ``i`` for ``sessions[i]`` (each at most
        once per call; None: a fresh episode start for that row). Bad input raises before
        any session changes: ``EnvCheckError`` naming the field for observations and
        rewards, ValueError for repeated sessions."""
        rows = None if sessions is None else len(sessions)
        with self._lock:
            obs = check_observations(self.observation_space, obs_batch, rows)
            n = len(tree.flatten(obs)[0])
            reward_col = check_rewards(rewards, n)
            env_ids, opened = self._env_ids(sessions, n)
            try:
                env_actions = self._step(obs, env_ids, reward_col, explore)
            except BaseException:
                for session in opened:  # a session opened by a failed call is not kept
                    self._reset(self._sessions.pop(session))
                raise
            finally:
                for eid in env_ids[env_ids < 0].tolist():  # rows without a session
                    self._reset(eid)
        return [tree.map_structure(lambda a, i=i: a[i], env_actions) for i in range(n)]

    def end_session(self, session: Hashable) -> None:
        """Drop the session's per-episode state (its episode ended); unknown ones are
        ignored, so ending twice is harmless."""
        with self._lock:
            eid = self._sessions.pop(session, None)
            if eid is not None:
                self._reset(eid)

    def _env_ids(
        self, sessions: Sequence[Hashable] | None, n: int
    ) -> tuple[np.ndarray, list[Hashable]]:
        """Pipeline row ids: a session's own id (>= 0), or -1 - i for a row without one
        (``sessions`` None, or a None entry); and the sessions this call opens."""
        if sessions is None:
            return -1 - np.arange(n, dtype=np.int64), []
        if isinstance(sessions, str | bytes) or not isinstance(sessions, Sequence):
            raise TypeError(f"sessions must be a list of session keys, got {type(sessions)}")
        named = [s for s in sessions if s is not None]
        if len(set(named)) != len(named):
            raise ValueError(f"a session appears more than once in one call: {list(sessions)}")
        opened = [s for s in named if s not in self._sessions]
        for s in opened:
            self._sessions[s] = next(self._next_id)
        ids = [-1 - i if s is None else self._sessions[s] for i, s in enumerate(sessions)]
        return np.array(ids, dtype=np.int64), opened

    def _step(
        self, obs: Any, env_ids: np.ndarray, rewards: np.ndarray | None, explore: bool
    ) -> Any:
        agents = (DEFAULT_AGENT_ID,) * len(env_ids)
        data = first_rows(self.agent_pipeline.input_space, obs, env_ids, agents, rewards)
        data = self.agent_pipeline(data)
        actions, state_outs, fetches = self.policy.compute_actions(
            data,  # type: ignore[arg-type]  # AgentData reads like a Mapping, as in sampling
            explore=explore,
        )
        _, env_actions = respond(
            self.agent_pipeline, self.action_pipeline, env_ids, agents, actions, state_outs, fetches
        )
        return env_actions

    def _reset(self, env_id: int) -> None:
        self.agent_pipeline.reset(env_id)
        self.action_pipeline.reset(env_id)

    def __repr__(self) -> str:
        return (
            f"DeployedPolicy({self.policy_id!r}, {type(self.policy).__name__}, "
            f"obs {describe_space(self.observation_space)}, "
            f"pipelines {self.agent_pipeline!r} / {self.action_pipeline!r})"
        )


def _rebuild_policy(f: PolicyFile, seed: int | None) -> Policy:
    cls = get_policy_class(f.kind)  # UnknownPolicyError names the registered kinds
    try:  # the declared weights are checked against the stored ones before it is built
        policy = policy_from_spec(
            f.kind,
            f.policy_observation_space,
            f.policy_action_space,
            f.config,
            factory=cls,
            weights=f.weights,
        )
    except Exception as exc:  # the class's own validation of saved kwargs and weights
        raise CheckpointError(
            f"cannot load policy file {f.path!r}: cannot rebuild {f.kind} from its saved "
            f"config and weights: {type(exc).__name__}: {exc}"
        ) from None
    policy.seed(seed)
    return policy


def _pipelines(
    f: PolicyFile, policy: Policy
) -> tuple[AgentConnectorPipeline, ActionConnectorPipeline]:
    ctx = ConnectorContext.from_policy(
        policy, observation_space=f.observation_space, policy_id=f.policy_id
    )
    ctx.action_space = f.action_space
    ctx.is_training = False
    action_ctx = attrs.evolve(ctx, config={}, initial_states=list(ctx.initial_states))
    agent = build_pipeline(f.agent_pipeline, ctx, f"{f.path!r} agent pipeline")
    action = build_pipeline(f.action_pipeline, action_ctx, f"{f.path!r} action pipeline")
    if not isinstance(agent, AgentConnectorPipeline) or not isinstance(
        action, ActionConnectorPipeline
    ):
        raise CheckpointError(f"cannot load policy file {f.path!r}: its pipelines are swapped")
    out, want = agent.output_space, policy.observation_space
    if (getattr(out, "shape", None), getattr(out, "dtype", None)) != (
        getattr(want, "shape", None),
        getattr(want, "dtype", None),
    ):
        raise CheckpointError(
            f"cannot load policy file {f.path!r}: the agent pipeline outputs "
            f"{describe_space(out)} but the policy takes {describe_space(want)}"
        )
    agent.in_eval()
    action.in_eval()
    return agent, action


def load_policy(path: str | os.PathLike[str], *, seed: int | None = None) -> DeployedPolicy:
    """The policy exported to ``path`` by ``rc.export_policy``, ready to act.

    Everything is verified before anything is built; nothing is unpickled. ``seed`` seeds
    the generators ``explore=True`` samples with (None: fresh entropy). Raises
    ``CheckpointError`` for a damaged or altered file, ``UnknownPolicyError`` /
    ``UnknownConnectorError`` for kinds or connectors not registered in this process.
    """
    f = read_policy_file(path)
    policy = _rebuild_policy(f, seed)
    agent, action = _pipelines(f, policy)
    return DeployedPolicy(f, policy, agent, action)
