"""What a policy's two pipelines do around one policy call, outside sampling.

Inference through a runner (``runner.compute_single_action``) and a deployed policy
(``rlconnect.deploy``) run the same three steps, so that both give the same actions for the
same observations, bit for bit::

    data = first_rows(agent_pipe.input_space, obs_batch, env_ids, agent_ids, rewards)
    with eval_mode(agent_pipe, action_pipe):
        data = agent_pipe(data)
        actions, state_outs, fetches = policy.compute_actions(data, explore=explore)
        outputs, env_actions = respond(agent_pipe, action_pipe, data.env_ids,
                                       data.agent_ids, actions, state_outs, fetches)

Sampling uses :func:`respond` too, on the rows of a poll.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import SampleBatch
from rlconnect.connectors.base import ActionData, AgentData
from rlconnect.connectors.pipeline import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
)
from rlconnect.spaces import stack_samples

__all__ = ["eval_mode", "first_rows", "respond"]


@contextlib.contextmanager
def eval_mode(*pipes: ConnectorPipeline) -> Iterator[None]:
    """Switch ``pipes`` to eval mode; restore each member's mode and the timings after."""
    saved = [(pipe, pipe.ctx.is_training, [(c, c.is_training) for c in pipe]) for pipe in pipes]
    with contextlib.ExitStack() as stack:
        for pipe in pipes:
            stack.enter_context(pipe.untimed())
            pipe.in_eval()
        try:
            yield
        finally:
            for pipe, ctx_mode, members in saved:
                for c, was_training in members:
                    if was_training:
                        c.in_training()
                    else:
                        c.in_eval()
                pipe.ctx.is_training = ctx_mode


def first_rows(
    input_space: gym.Space,
    obs: Any,
    env_ids: np.ndarray,
    agent_ids: tuple,
    rewards: np.ndarray | None = None,
) -> AgentData:
    """Agent-pipeline input for raw observations served one step at a time: ``obs`` (a
    batch of ``input_space``, or a list of single observations, stacked here), the
    ``rewards`` received with them (zeros when None), not done, empty infos, ``t`` 0."""
    n = len(env_ids)
    if isinstance(obs, list):
        obs = stack_samples(input_space, obs)
    infos = np.empty(n, dtype=object)
    for i in range(n):
        infos[i] = {}
    cols = {
        "obs": obs,
        "rewards": np.zeros(n, dtype=np.float64) if rewards is None else rewards,
        "terminateds": np.zeros(n, dtype=bool),
        "truncateds": np.zeros(n, dtype=bool),
        "infos": infos,
        "t": np.zeros(n, dtype=np.int64),
    }
    return AgentData(env_ids, agent_ids, cols)


def respond(
    agent_pipe: AgentConnectorPipeline,
    action_pipe: ActionConnectorPipeline,
    env_ids: Any,
    agent_ids: tuple,
    actions: Any,
    state_outs: Sequence[Any],
    fetches: dict[str, Any],
) -> tuple[dict[str, Any], Any]:
    """The policy's outputs as recorded (``actions``, fetches, ``state_out_i``) and the env
    actions: the agent pipeline sees the outputs (``on_policy_output``: previous actions,
    RNN state), then the action pipeline maps the actions."""
    outputs = {"actions": actions, **fetches}
    for i, s in enumerate(state_outs):
        outputs[SampleBatch.state_out(i)] = s
    out = ActionData.trusted(env_ids, agent_ids, dict(outputs))
    if not agent_pipe.empty:
        agent_pipe.on_policy_output(out)
    return outputs, action_pipe(out)["actions"]
