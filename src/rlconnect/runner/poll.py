"""The shapes one poll takes through a kernel's step, after the env's own ``EnvRows``
(shape 1, ``rlconnect.envs.rows``): ``PollFacts`` (2), what the kernel adds to the rows,
and ``PolicyStep`` (3), each policy's rows, pipeline data and outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from rlconnect.connectors import AgentData
from rlconnect.envs.rows import EnvRows

__all__ = ["PolicyStep", "PollFacts"]


class PollFacts(NamedTuple):
    """Shape (2): what the kernel adds to a poll's ``EnvRows``, derived once and read by
    every phase of its step: episode begins (``firsts``), ends (``done``, ``done_envs``),
    and for multi-agent rows each row's trajectory, agent index and policy.

    ``columns`` are the poll's rows as the agent pipelines take them: each policy's
    ``AgentData`` holds its rows of these columns (a policy that takes every row holds
    the dict itself), and what the pipeline leaves in it is what gets recorded. A frozen
    record (the kernel makes one per poll with ``tuple.__new__``: no Python call)."""

    poll: int  #: the poll's number
    rows: EnvRows  #: the rows, screened
    full: bool  #: row i is sub-env i (single-agent rows of every sub-env)
    firsts: list[int]  #: sub-envs whose episode begins at this poll
    #: per row: ``obs`` (``observation_fn`` applied), ``rewards`` (multi-agent: with those
    #: held for it), ``terminateds``, ``truncateds`` (by the horizon too), ``infos`` and
    #: ``t`` (the episode's length)
    columns: dict[str, Any]
    done: np.ndarray  #: per row: done (it does not act)
    some_done: bool  #: whether any row is done
    done_envs: Mapping[int, tuple[bool, bool]]  #: sub-envs whose episode ends, with its flags
    #: multi-agent (else None): transitions each sub-env completed; per row: its
    #: trajectory id, agent index and policy (``AgentSlots.look_up``)
    agent_steps: np.ndarray | None
    traj: np.ndarray | None
    agent_index: np.ndarray | None
    policies: np.ndarray | None


class PolicyStep:
    """Shape (3): one policy's part of a poll, numpy arrays or torch tensors alike: its
    rows as the agent pipeline made them (``data``, an ``AgentData``: what the policy
    gets, then, with the bookkeeping added, what is recorded) and what the policy
    answered (``outputs``; ``acted``: the rows that acted, None: all).

    The numpy kernel adds its own per-row facts: the flag and length columns it made
    (``made``: recorded as one number each when every row shares it and no connector
    replaced them), trajectory ids, agent indices, done rows and the env's observations
    (``obs``, for ``keep_raw_obs``)."""

    __slots__ = (
        "acted",
        "agent_index",
        "data",
        "done",
        "made",
        "obs",
        "outputs",
        "pid",
        "traj",
    )

    def __init__(
        self,
        pid: str,
        data: AgentData,
        made: tuple[Any, Any, Any] = (None, None, None),
        traj: Any = None,
        agent_index: Any = 0,
        done: Any = None,
        obs: Any = None,
    ) -> None:
        self.pid = pid
        self.data = data
        self.made = made  #: ``terminateds``, ``truncateds`` and ``t`` as the kernel made them
        self.traj = traj  #: trajectory ids (None: single-agent, read when recorded)
        self.agent_index = agent_index
        self.done = done
        self.obs = obs
        self.outputs: dict[str, Any] | None = None
        self.acted: Any = None
