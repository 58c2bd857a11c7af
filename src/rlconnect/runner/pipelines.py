"""Each policy's agent, action and learner pipeline: built from the config or given, then
checked.

The learner pipeline (empty by default) runs on every batch of its policy that the runner
hands out (``PolicyPipelines.learn``); a member that needs what the policy cannot give
(values, log-probabilities) is refused here, when the runner is built.

The agent pipeline of a policy takes the raw observations of the agents mapped to it, so
it is built for their observation space. For a multi-agent env that space is found
without calling the user's ``policy_mapping_fn``: when every agent has the same spaces,
or when the agents whose spaces fit the policy (through the default chain) all share one
pair of spaces. Only when that leaves it ambiguous is the mapping function asked, with a
placeholder episode (``episode_id == -1``), once per agent at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID, SampleBatch
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    AgentData,
    Connector,
    ConnectorContext,
    ConnectorPipeline,
    LearnerConnector,
    LearnerConnectorPipeline,
    default_action_pipeline,
    default_agent_pipeline,
)
from rlconnect.envs.base import BaseEnv
from rlconnect.episodes import Episode
from rlconnect.errors import did_you_mean
from rlconnect.policy import Policy
from rlconnect.runner.config import RunnerConfig
from rlconnect.spaces import describe_space

__all__ = [
    "PipelineSpec",
    "PipelineSpecs",
    "PolicyPipelines",
    "build_pipelines",
    "check_agent_output",
]

PipelineSpec = Any  # a pipeline, or a callable ctx -> pipeline (learner: or a list of members)


def _specs(value: Mapping[str, PipelineSpec] | None) -> dict[str, PipelineSpec]:
    return dict(value or {})


@attrs.frozen
class PipelineSpecs:
    """What a runner is given for its pipelines, by policy id, one map per kind: a
    pipeline, a callable ``ctx -> pipeline`` (what a remote runner gets: it must pickle),
    or for the learner pipeline also a list of learner connectors. Policies left out get
    the default agent and action pipelines and an empty learner pipeline."""

    agent: dict[str, PipelineSpec] = attrs.field(factory=dict, converter=_specs)
    action: dict[str, PipelineSpec] = attrs.field(factory=dict, converter=_specs)
    learner: dict[str, PipelineSpec] = attrs.field(factory=dict, converter=_specs)


@attrs.define
class PolicyPipelines:
    """The live agent and action pipeline of every policy id (restore replaces entries)."""

    agent: dict[str, AgentConnectorPipeline] = attrs.field(factory=dict)
    action: dict[str, ActionConnectorPipeline] = attrs.field(factory=dict)
    learner: dict[str, LearnerConnectorPipeline] = attrs.field(factory=dict)
    #: the learner pipeline members last checked against each policy (edits are checked
    #: before they first run)
    _checked: dict[str, tuple[str, ...]] = attrs.field(factory=dict, init=False)

    def learn(self, batches: dict[str, SampleBatch], policies: Mapping[str, Policy]) -> None:
        """Each policy batch through its policy's learner pipeline, with that policy, in
        place (an empty pipeline costs a length check)."""
        for pid, batch in batches.items():
            pipe = self.learner.get(pid)
            if pipe is None or not len(pipe):
                continue
            if self._checked.get(pid) != tuple(pipe.names):  # built, edited or restored
                check_learner(pipe, pid, policies[pid])
                self._checked[pid] = tuple(pipe.names)
            batches[pid] = pipe(batch, policies[pid])

    def closing_inputs(self, pid: str, env_id: int, agent_id: Any, reward: float) -> dict[str, Any]:
        """The columns of the row that closes the trajectory of agent ``agent_id`` of
        sub-env ``env_id``, which ended without a final observation having received
        ``reward`` since it last acted: what policy ``pid``'s agent pipeline makes of it
        (``AgentConnectorPipeline.closing_row``: the ``rewards`` as every row records
        them, the ``prev_actions`` / ``prev_rewards`` the agent would be fed next), one
        row each. Called before the episode's end resets the pipeline's state."""
        data = AgentData.trusted(
            np.array([env_id], np.int64), (agent_id,), {"rewards": np.array([reward])}
        )
        return self.agent[pid].closing_row(data).columns

    def episode_resets(self) -> list[Callable[[int], None]]:
        """The ``reset(env_id)`` of every member that keeps per-episode state: what an
        episode's end must call. Members that do not override ``Connector.reset`` keep
        none and are left out (read at each call: pipelines are edited in place)."""
        out: list[Callable[[int], None]] = []
        for pipes in (self.agent, self.action):
            for pipe in pipes.values():
                if type(pipe).reset is not ConnectorPipeline.reset:  # a pipeline of its own
                    out.append(pipe.reset)
                    continue
                for _, c in pipe.items():
                    if getattr(c.reset, "__func__", None) is not Connector.reset:
                        out.append(c.reset)
        return out


@attrs.define
class DeferredLearning:
    """The learner pipelines on one ``sample()``'s tensor batches, their checks deferred
    to the tensor kernel's one host read. Calling it runs them (on a copy of the dict of
    batches) and returns the checks' flags for that read; ``result(values)`` then raises
    what the pipelines would have raised (their own error, or the first failed check's)
    and returns the batches they made."""

    pipelines: PolicyPipelines
    policies: Mapping[str, Policy]
    learned: dict[str, SampleBatch] = attrs.Factory(dict)
    checks: Any = None
    error: Exception | None = None

    def __call__(self, batches: dict[str, SampleBatch]) -> list[Any]:
        from rlconnect.connectors.learner import deferred_checks

        self.learned, self.error = dict(batches), None
        try:
            with deferred_checks() as self.checks:
                self.pipelines.learn(self.learned, self.policies)
        except Exception as exc:  # raised by result(): the batch is lost, the runner is not
            self.error = exc
            return []
        return list(self.checks.flags)

    def result(self, values: list[bool]) -> dict[str, SampleBatch]:
        """The learned batches, given the flags' values read with the sample."""
        if self.error is not None:
            raise self.error
        self.checks.raise_for(values)
        return self.learned


def check_agent_output(pid: str, pipe: AgentConnectorPipeline, obs: Any) -> None:
    """ValueError blaming the connector, not the policy, when the agent pipeline of
    ``pid`` emitted ``obs`` rows of another shape than its members declare (one shape
    compare per step; observation spaces without a shape are not checked)."""
    want = pipe.output_space.shape
    got = getattr(obs, "shape", None)
    if want is None or got is None or tuple(got[1:]) == tuple(want):
        return
    names = pipe.names
    own = [n for n, c in pipe.items() if not type(c).__module__.startswith("rlconnect.")]
    culprit = own[-1] if own else names[-1]
    others = [n for n in names if n != culprit]
    also = f" (or one of the members before it: {others})" if others else ""
    raise ValueError(
        f"connector {culprit!r}{also} in the agent pipeline of policy {pid!r} emitted obs "
        f"rows of shape {tuple(got[1:])}, but the pipeline declares {tuple(want)} (what the "
        "policy was built for); the policy was not called. Make the connector's output "
        "match its output_space(), or declare the shape it emits there"
    )


def _actions_fit(policy_space: gym.Space, env_space: gym.Space) -> bool:
    """Whether a policy acting in ``policy_space`` can drive an env taking ``env_space``
    through the default action chain: the same kind of space and size (Box bounds may
    differ: the chain unsquashes or clips into the env's)."""
    a: Any = policy_space
    b: Any = env_space  # the same type as ``a`` once checked below
    if type(a) is not type(b):
        return False
    if isinstance(a, gym.spaces.Dict):
        return a.keys() == b.keys() and all(_actions_fit(a[k], b[k]) for k in a.spaces)
    if isinstance(a, gym.spaces.Tuple):
        return len(a) == len(b) and all(_actions_fit(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, gym.spaces.Discrete):
        return int(a.n) == int(b.n)
    if isinstance(a, gym.spaces.MultiDiscrete):
        return np.array_equal(a.nvec, b.nvec)
    return getattr(a, "shape", None) == getattr(b, "shape", None)


def check_action_spaces(pid: str, policy: Policy, env_space: gym.Space) -> None:
    """ValueError naming both spaces when ``policy`` acts in a space the env's agents
    cannot take (a Box policy on a Discrete env): refused when the runner is built rather
    than at the first ``sample()``."""
    if _actions_fit(policy.action_space, env_space):
        return
    raise ValueError(
        f"policy {pid!r} ({type(policy).__name__}) acts in {describe_space(policy.action_space)}"
        f", but the env's agents mapped to it take {describe_space(env_space)}; build the "
        "policy for the env's action space, or give action_pipelines an entry for this "
        "policy that maps its actions into the env's"
    )


def _same_shape(a: gym.Space, b: gym.Space) -> bool:
    return getattr(a, "shape", None) == getattr(b, "shape", None) and getattr(
        a, "dtype", None
    ) == getattr(b, "dtype", None)


def _fits(policy: Policy, obs: gym.Space, action: gym.Space, config: dict) -> bool:
    """Whether agents with these spaces can feed ``policy`` through the default chain."""
    try:
        ctx = ConnectorContext(obs, action, dict(config))
        out = default_agent_pipeline(ctx).output_space
    except Exception:  # a space the default chain cannot take: not this policy's agents
        return False
    return _same_shape(out, policy.observation_space) and action == policy.action_space


def env_spaces(
    env: BaseEnv, pid: str, policy: Policy, mapping_fn: Callable[..., str], config: dict
) -> tuple[gym.Space, gym.Space]:
    """The raw (observation, action) spaces of the agents mapped to ``pid``."""
    if not env.is_multi_agent:
        return env.observation_space(DEFAULT_AGENT_ID), env.action_space(DEFAULT_AGENT_ID)
    agents = list(env.possible_agents)
    pairs = [(env.observation_space(a), env.action_space(a)) for a in agents]
    distinct = [p for i, p in enumerate(pairs) if p not in pairs[:i]]
    if len(distinct) == 1:
        return distinct[0]
    fitting = [p for p in distinct if _fits(policy, *p, config)]
    if len(fitting) == 1:
        return fitting[0]
    probe = Episode(-1, -1, mapping_fn)  # ambiguous: the mapping function decides
    for agent, pair in zip(agents, pairs):
        if probe.policy_for(agent) == pid:
            return pair
    return policy.observation_space, policy.action_space


def _built(spec: PipelineSpec, ctx: ConnectorContext) -> Any:
    """A given pipeline, or the one a callable ``ctx -> pipeline`` builds."""
    if callable(spec) and not hasattr(spec, "output_space"):
        return spec(ctx)
    return spec


def _learner_built(spec: PipelineSpec, ctx: ConnectorContext, pid: str) -> Any:
    """The learner pipeline a spec gives: a pipeline, a list of members, or what a
    callable ``ctx -> pipeline | list`` builds (None: empty)."""
    if spec is not None and not isinstance(spec, LearnerConnectorPipeline | list | tuple):
        if not callable(spec) or isinstance(spec, LearnerConnector):
            raise TypeError(
                f"learner_pipelines[{pid!r}] must be an rc.LearnerConnectorPipeline, a list "
                f"of learner connectors or a callable ctx -> pipeline, got {spec!r}"
            )
        spec = spec(ctx)
    if isinstance(spec, LearnerConnectorPipeline):
        return spec
    return LearnerConnectorPipeline(ctx, list(spec or []))


def _learner_pipeline(
    spec: PipelineSpec, ctx: ConnectorContext, pid: str, policy: Policy
) -> LearnerConnectorPipeline:
    """Policy ``pid``'s learner pipeline, refused now if a member needs what ``policy``
    cannot give (rather than at the first batch)."""
    learner_ctx = attrs.evolve(
        ctx, config=dict(ctx.config), initial_states=list(ctx.initial_states)
    )
    pipe = _learner_built(spec, learner_ctx, pid)
    if not isinstance(pipe, LearnerConnectorPipeline):
        raise TypeError(
            f"learner_pipelines[{pid!r}] built a {type(pipe).__name__}, not an "
            "rc.LearnerConnectorPipeline"
        )
    check_learner(pipe, pid, policy)
    return pipe


def check_learner(pipe: LearnerConnectorPipeline, pid: str, policy: Policy) -> None:
    """ValueError naming the policy, the member, what it lacks and the fix, if a member of
    ``pipe`` needs what ``policy`` cannot give."""
    try:
        pipe.check_policy(policy)
    except ValueError as exc:
        raise ValueError(f"policy {pid!r} ({type(policy).__name__}): {exc}") from None


def check_spec_ids(specs: PipelineSpecs, policy_ids: list[str]) -> None:
    """ValueError naming a policy id that ``agent_pipelines``, ``action_pipelines`` or
    ``learner_pipelines`` is keyed by and the runner has no policy for (a misspelling
    would otherwise leave that policy on the default pipelines, silently)."""
    for kind, given in (
        ("agent", specs.agent),
        ("action", specs.action),
        ("learner", specs.learner),
    ):
        for pid in given:
            if pid not in policy_ids:
                raise ValueError(
                    f"{kind}_pipelines has an entry for policy id {pid!r}, which is not one "
                    f"of the runner's policies {policy_ids}{did_you_mean(pid, policy_ids)}; "
                    "key it by one of those ids"
                )


def build_pipelines(
    env: BaseEnv,
    policies: Mapping[str, Policy],
    mapping_fn: Callable[..., str],
    config: RunnerConfig,
    specs: PipelineSpecs,
) -> PolicyPipelines:
    """Every policy's pipelines; a policy whose observation space does not match what
    its agent pipeline outputs is a ValueError naming both, as is a learner pipeline
    whose members need what the policy cannot give."""
    check_spec_ids(specs, list(policies))
    pipes = PolicyPipelines()
    connector_config = config.connector_config()
    device = getattr(env, "device", None)  # a tensor env's: the tensor path
    for pid, policy in policies.items():
        obs_space, action_space = env_spaces(env, pid, policy, mapping_fn, connector_config)
        ctx = ConnectorContext.from_policy(
            policy, connector_config, observation_space=obs_space, policy_id=pid
        )
        ctx.action_space = action_space
        ctx.device = None if device is None else str(device)
        ctx.is_training = config.explore
        action_ctx = attrs.evolve(
            ctx, config=dict(ctx.config), initial_states=list(ctx.initial_states)
        )
        agent_pipe = _built(specs.agent.get(pid), ctx)
        action_pipe = _built(specs.action.get(pid), action_ctx)
        if agent_pipe is None:
            agent_pipe = default_agent_pipeline(ctx)
        if action_pipe is None:
            check_action_spaces(pid, policy, action_space)
            action_pipe = default_action_pipeline(action_ctx)
        out, want = agent_pipe.output_space, policy.observation_space
        if not _same_shape(out, want):
            raise ValueError(
                f"policy {pid!r} expects observations {describe_space(want)} but its agent "
                f"pipeline ({' -> '.join(agent_pipe.names) or 'empty'}) outputs "
                f"{describe_space(out)}; build the policy for the pipeline's output space"
            )
        agent_pipe.feeds(f"policy {pid!r}", want)  # later edits keep what the policy takes
        action_pipe.feeds(f"the env of policy {pid!r}", action_pipe.output_space)
        if not config.explore:
            agent_pipe.in_eval()
            action_pipe.in_eval()
        pipes.agent[pid] = agent_pipe
        pipes.action[pid] = action_pipe
        pipes.learner[pid] = _learner_pipeline(specs.learner.get(pid), ctx, pid, policy)
    return pipes
