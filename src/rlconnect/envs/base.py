"""The env contract the runner drives: poll rows, send actions, reset or restart sub-envs.

Every kind of env the runner accepts (gymnasium envs, vector envs, multi-agent envs,
PettingZoo, external simulators) is adapted to ``BaseEnv``. One round is::

    rows = env.poll()          # results of the last actions + first obs of fresh episodes
    ...                        # the runner processes rows, decides actions
    env.try_reset(env_id)      # for sub-envs whose episode ended in ``rows``
    env.send_actions(env_ids, agent_ids, actions)   # for rows that must act
    env.all_actions_sent()     # the poll's actions are all out (EnvPool steps from here)

Rows are columnar: row ``i`` is agent ``agent_ids[i]`` of sub-env ``env_ids[i]``; adapters
make them with ``EnvRowsBuilder`` (``rlconnect.envs.rows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from rlconnect.envs.rows import EnvRows

__all__ = ["BaseEnv", "EnvRows", "NotAnEnvError", "ServedInference"]


class ServedInference(Protocol):
    """What an env may ask of the runner that drives it, outside sampling: actions for the
    observations of an episode it serves without recording it (an ExternalEnv's episodes
    started with ``training_enabled=False``), and the end of such an episode. The runner
    hands it over with ``BaseEnv.attach_inference``; the env never holds the runner."""

    def compute_actions(
        self, obs_by_agent: Mapping[Any, Any], *, explore: bool, env_id: int
    ) -> dict[Any, Any]:
        """Env actions by agent id through the runner's pipelines and policies in eval
        mode; the connector state of ``env_id`` (frame stacks, RNN state) is kept."""
        ...

    def reset(self, env_id: int) -> None:
        """Drop the connector state kept for ``env_id`` (its episode ended)."""
        ...


class NotAnEnvError(TypeError):
    """An env creator returned something that is not an env of any accepted kind."""


class BaseEnv:
    """N sub-environments stepped together; the only env type the runner talks to.

    ``observation_space(agent_id)`` / ``action_space(agent_id)`` give each agent's spaces;
    single-agent envs use ``rc.DEFAULT_AGENT_ID``. ``possible_agents`` lists agent ids when
    known up front. A fresh BaseEnv has not been reset: the first ``poll()`` resets every
    sub-env (sub-env ``i`` seeded ``seed + i`` when a seed was given).
    """

    num_envs: int = 1
    is_multi_agent: bool = False
    possible_agents: tuple = ()
    #: a batched tensor simulator, driven by the tensor kernel (``rlconnect.envs.tensor_envs``)
    on_tensors: bool = False

    def observation_space(self, agent_id: Any) -> gym.Space:
        """The observation space of ``agent_id``."""
        raise NotImplementedError

    def action_space(self, agent_id: Any) -> gym.Space:
        """The action space of ``agent_id``."""
        raise NotImplementedError

    def poll(self) -> EnvRows:
        """Step sub-envs that received actions, reset those asked to; return their rows."""
        raise NotImplementedError

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Queue actions (a stacked batch or a list, one row per ``(env_id, agent_id)``)."""
        raise NotImplementedError

    def all_actions_sent(self) -> None:
        """Every action the last poll's rows call for has been given to ``send_actions``.

        The runner calls this once per poll, after the last policy's actions are sent and
        before it records the poll, so an env that steps its sub-envs as one batch (EnvPool)
        can start that step here and run it while the runner records. Does nothing by
        default: an env that steps as actions arrive needs no signal.
        """

    def attach_inference(self, inference: ServedInference) -> None:
        """The runner that drives this env serves the episodes it does not record through
        ``inference`` (an ExternalEnv's untrained episodes). Does nothing by default: an
        env whose every episode is sampled needs none."""

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll (its episode ended)."""
        raise NotImplementedError

    def soft_reset(self, env_id: int) -> None:
        """Start a new episode in ``env_id`` without resetting it (the soft horizon).

        The next poll hands out the sub-env's last observations again as the first rows
        of the new episode; the env itself keeps running.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support soft resets")

    def try_restart(self, env_id: int) -> None:
        """Close and rebuild sub-env ``env_id`` (it raised); it resets at the next poll."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart sub-environments")

    def close(self) -> None:
        """Release every sub-env."""
