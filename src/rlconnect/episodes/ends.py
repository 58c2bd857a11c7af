"""``EpisodeEnds``: what the episodes that ended (and the agents that left) at one poll
mean for the collectors, as one record the step hands to the collector group.

Episode bookkeeping decides *that* a trajectory or an episode ends; the collectors own the
rows. The tracker therefore never writes rows: it notes each end here, and the step's one
writer passes the record to ``PolicyCollectorGroup.record`` with the poll's rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = ["ClosingRow", "EpisodeEnds"]


class ClosingRow(NamedTuple):
    """The last row of a trajectory whose agent ended without a final observation: it
    repeats the agent's last row (so ``new_obs`` is its last observation) with the reward
    accumulated since its last action, the flags and the episode length ``t``.

    ``inputs``: what the agent pipeline makes of that reward for the agent's next row
    (``AgentConnectorPipeline.closing_row``: ``rewards`` as every row records them,
    ``prev_actions`` / ``prev_rewards`` what the agent would be fed next), one row per
    column, replacing the repeated ones; empty: ``reward`` is recorded as it is."""

    policy_id: str
    traj_id: int
    reward: float
    terminated: bool
    truncated: bool
    t: int
    inputs: Mapping[str, Any] = MappingProxyType({})


class EpisodeEnds:
    """What ended since the step last handed ends over (see the module docstring).

    - ``closing``: ``ClosingRow`` records, in the order the agents ended;
    - ``finished``: ids of the episodes that ended whole, with their ``env_steps`` and
      ``agent_steps`` in total (``agent_steps`` None: one agent, as many as env steps);
    - ``dropped``: ids of faulty episodes: none of their rows or steps may be handed out.
    """

    __slots__ = ("agent_steps", "closing", "dropped", "env_steps", "finished")

    def __init__(self) -> None:
        self.closing: list[ClosingRow] = []
        self.finished: list[int] = []
        self.env_steps = 0
        self.agent_steps: int | None = None
        self.dropped: list[int] = []

    def finish(self, eps_ids: list[int], env_steps: int, agent_steps: int | None) -> None:
        """Episodes ``eps_ids`` ended whole after these steps in total."""
        self.finished += eps_ids
        self.env_steps += env_steps
        if agent_steps is not None:
            self.agent_steps = (self.agent_steps or 0) + agent_steps
