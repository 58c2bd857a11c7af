"""The EnvRunner of ``rlconnect sample``: the env, one default policy per distinct pair of
spaces, and the hint for image observations without a preset."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.cli.errors import UsageError
from rlconnect.cli.settings import resolve_env


class SharedPolicies:
    """``policy_mapping_fn``: each agent to the policy of its pair of spaces."""

    def __init__(self, policy_of_agent: dict[Any, str]) -> None:
        self.policy_of_agent = policy_of_agent

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        """The policy id of ``agent_id`` (episode and keyword arguments unused: the pairing
        of spaces alone decides)."""
        return self.policy_of_agent[agent_id]


def group_agents(env: Any) -> dict[str, list[Any]]:
    """Policy id -> agents: one policy per distinct (observation, action) space pair,
    ``default_policy`` when every agent has the same spaces."""
    from rlconnect.batches import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID

    agents = list(env.possible_agents) or [DEFAULT_AGENT_ID]
    groups: list[tuple[gym.Space, gym.Space, list[Any]]] = []
    for agent in agents:
        spaces = (env.observation_space(agent), env.action_space(agent))
        for group in groups:
            if (group[0], group[1]) == spaces:
                group[2].append(agent)
                break
        else:
            groups.append((*spaces, [agent]))
    if len(groups) == 1:
        return {DEFAULT_POLICY_ID: groups[0][2]}
    return {f"policy_{i}": members for i, (_, _, members) in enumerate(groups)}


def image_hint(space: gym.Space, preset: str | None) -> str | None:
    """A hint when observations look like images and no preset prepares them."""
    if preset is not None or not isinstance(space, gym.spaces.Box):
        return None
    shape = space.shape
    if space.dtype == "uint8" and len(shape) in (2, 3) and min(shape[:2]) >= 32:
        return (
            f"observations are images {shape} and go to an MLP unchanged; "
            "--preset atari grayscales, resizes to 84x84 and stacks 4 frames"
        )
    return None


def build_runner(run: dict[str, Any], config: Any, hints: list[str] | None = None) -> Any:
    """The EnvRunner for ``rlconnect sample``: default pipelines, random or MLP policies
    (one per distinct pair of spaces), hints appended to ``hints``."""
    from rlconnect import policy
    from rlconnect.batches import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID
    from rlconnect.connectors import ConnectorContext, default_agent_pipeline
    from rlconnect.envs import make_base_env
    from rlconnect.envs.make import NotAnEnvError
    from rlconnect.runner import EnvRunner

    try:
        env = make_base_env(resolve_env(run["env"]), config.env_settings())
    except NotAnEnvError as exc:  # ``--env os:getcwd``: the flag names no env
        raise UsageError(f"--env {run['env']!r}: {exc}") from None
    try:
        groups = group_agents(env) if env.is_multi_agent else {DEFAULT_POLICY_ID: []}
        policies = {}
        for pid, agents in groups.items():
            agent = agents[0] if agents else DEFAULT_AGENT_ID
            obs_space, act_space = env.observation_space(agent), env.action_space(agent)
            hint = image_hint(obs_space, config.preset)
            if hint and hints is not None and hint not in hints:
                hints.append(hint)
            ctx = ConnectorContext(obs_space, act_space, config.connector_config())
            space = default_agent_pipeline(ctx).output_space
            policy_cls = policy.RandomPolicy if run["policy"] == "random" else policy.MLPPolicy
            policies[pid] = policy_cls(space, act_space, seed=config.seed)
        mapping = None
        if env.is_multi_agent:
            mapping = SharedPolicies({a: pid for pid, agents in groups.items() for a in agents})
        return EnvRunner(env, policies, policy_mapping_fn=mapping, config=config)
    except BaseException:
        env.close()
        raise
