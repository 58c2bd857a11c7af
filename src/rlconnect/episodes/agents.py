"""``AgentSlots``: the agents of every sub-env's running multi-agent episode, in arrays.

Agents come, go, take turns and get rewards in between; their ``(sub-env, agent)`` slots
are kept in flat arrays so a poll's rows are looked up and updated in bulk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlconnect.episodes.ends import ClosingRow
from rlconnect.episodes.episode import Episode
from rlconnect.episodes.table import EpisodeTable, PollRows
from rlconnect.episodes.trajectories import TrajectoryIds

__all__ = ["AgentSlots"]

_DUE_MAX = 256  # polls of multi-agent rewards logged before they are summed
_LAYOUTS_MAX = 64  # poll layouts kept (all forgotten when full)
#: each slot array: its name, the value of a slot without an agent, its dtype
_SLOT_FILLS = (
    ("traj", -1, np.int64),
    ("policy", -1, np.int64),
    ("index", 0, np.int64),
    ("pending", 0.0, np.float64),
    ("returns", 0.0, np.float64),
)


class _Layout:
    """The slots of a poll's rows (``env_id * width + code``), and what was found in them
    while no slot had changed since (``era``: ``AgentSlots._era`` then; -1: nothing)."""

    __slots__ = ("at", "codes", "era", "found")

    def __init__(self, codes: np.ndarray, at: np.ndarray) -> None:
        self.codes = codes
        self.at = at
        self.era = -1
        self.found: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None = None


class AgentSlots:
    """The agents of every sub-env's running multi-agent episode, in arrays.

    Each agent id gets a code (a column) the first time it is seen; every ``(sub-env,
    code)`` slot holds the agent's trajectory id (-1: none open), its policy (an index into
    ``policy_ids``; -1: not mapped yet in this episode), its agent index, the reward it got
    while not acting (added to its next transition) and its return so far (the rewards of
    each poll are logged and summed in bulk when read; the episode's return, in row order,
    goes to the table's ``ret``). A poll's rows are looked up and updated with a few numpy
    operations (``look_up``); Python runs per agent only where one joins (the mapping
    function, a new trajectory), ends or gets a reward without an observation. An agent
    that ends without a final observation is told to ``closing(env_id, agent_id, row)``
    (a ``ClosingRow``, for the tracker's ends): the rows themselves are the collectors'.
    """

    def __init__(
        self,
        table: EpisodeTable,
        trajectories: TrajectoryIds,
        closing: Callable[[int, Any, ClosingRow], None],
        policy_ids: Sequence[str],
    ) -> None:
        self._table = table
        self._traj = trajectories
        self._closing = closing  #: notes a closing row in the tracker's ends
        self.policy_ids = list(policy_ids)
        self._codes: dict[Any, int] = {}
        self._agents: list[Any] = []  # code -> agent id
        #: rewards not yet in the returns, by poll: (slots, rewards)
        self._due: list[tuple[np.ndarray, np.ndarray]] = []
        self._held = False  # whether some agent holds a reward for its next transition
        #: polls' slots by layout, and the count of changes to any slot (``look_up``)
        self._layouts: dict[tuple[tuple, bytes], _Layout] = {}
        self._era = 0
        self.width = 0  #: agent codes per sub-env: a row's slot is ``env_id * width + code``
        #: the slot arrays, flat (one-dimensional lookups cost a fraction of 2-d ones)
        self._traj_at = np.full(0, -1, dtype=np.int64)
        self._policy_at = np.full(0, -1, dtype=np.int64)
        self._index_at = np.zeros(0, dtype=np.int64)
        self._pending_at = np.zeros(0)
        self._returns_at = np.zeros(0)

    def _grid(self, name: str) -> np.ndarray:
        """Slot array ``name`` as (sub-env, code): a view of the flat one."""
        flat: np.ndarray = getattr(self, f"_{name}_at")
        return flat.reshape(len(self._table), self.width)

    def _grow(self, more: int) -> None:
        """Room for ``more`` agent codes per sub-env (the slots move: layouts forgotten)."""
        self._sum_due()  # (the slots of the logged rewards move)
        n, width = len(self._table), self.width
        for name, fill, dtype in _SLOT_FILLS:
            grid = np.full((n, width + more), fill, dtype=dtype)
            grid[:, :width] = getattr(self, f"_{name}_at").reshape(n, width)
            setattr(self, f"_{name}_at", grid.reshape(-1))
        self.width = width + more
        self._layouts.clear()
        self._era += 1

    def _episode(self, env_id: int) -> Episode:
        return self._table[env_id]

    def codes(self, agent_ids: tuple) -> np.ndarray:
        """The code of each agent id (agents never seen before get one)."""
        try:
            return np.fromiter(map(self._codes.__getitem__, agent_ids), np.int64, len(agent_ids))
        except KeyError:
            for a in agent_ids:
                self._code(a)
            return np.fromiter(map(self._codes.__getitem__, agent_ids), np.int64, len(agent_ids))

    def _code(self, agent_id: Any) -> int:
        code = self._codes.get(agent_id)
        if code is None:
            code = self._codes[agent_id] = len(self._agents)
            self._agents.append(agent_id)
            if code >= self.width:  # room for more agents: double the columns
                self._grow(max(4, self.width))
        return code

    def look_up(
        self, rows: PollRows, done: np.ndarray | None, policies: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Everything a poll's rows change in their agents' slots, for all rows at once:
        agents new to their episode are mapped (``Episode.policy_for``, once per agent per
        episode), rewards count towards the returns (those without an observation are held
        for the agent's next transition, closing agents that ended with one), new
        trajectories open, and the agents of ``done`` rows close.

        Returns the transitions each sub-env completed, and per row: trajectory id, agent
        index, reward (held ones added) and, with ``policies``, policy (an index into
        ``policy_ids``; else None). The arrays are shared with later polls: read them only.

        A poll laid out like an earlier one (the same agents of the same sub-envs, as when
        agents act together) reuses its slots, and, if no slot changed since, what was
        found in them (``_Layout``)."""
        layout = self._layout(rows)
        era = self._era
        self._due.append((layout.at, rows.rewards.copy()))  # (pipelines may edit)
        if layout.found is not None and layout.era == era and not rows.extra_rewards:
            agent_steps, traj, index, pol = layout.found
        else:
            agent_steps, traj, layout = self._find(rows, layout)
            index, pol = self._index_at[layout.at], self._policy_at[layout.at] if policies else None
        if len(self._due) >= _DUE_MAX:
            self._sum_due()
        rewards = rows.rewards
        if self._held:  # rewards held for agents without an observation
            at = layout.at
            pending = self._pending_at[at]
            self._pending_at[at] = 0.0
            rewards = rewards + pending
            self._held = bool(np.count_nonzero(self._pending_at))
        if done is not None:  # these rows end their agents' trajectories
            closing = traj[done]
            for t in closing[closing >= 0].tolist():
                self._traj.close(t)
            self._traj_at[layout.at[done]] = -1
            self._era += 1
        if self._era == era:  # nothing changed: what was found holds until something does
            layout.era, layout.found = era, (agent_steps, traj, index, pol)
        return agent_steps, traj, index, rewards, pol

    def _layout(self, rows: PollRows) -> _Layout:
        """The slots of ``rows`` (their agents' codes, new agents given one), kept for
        polls laid out alike (at most ``_LAYOUTS_MAX``; forgotten when the slots move)."""
        key = (rows.agent_ids, rows.env_ids.tobytes())
        layout = self._layouts.get(key)
        if layout is None:
            codes = self.codes(rows.agent_ids)  # (may make room for more agents)
            if len(self._layouts) >= _LAYOUTS_MAX:
                self._layouts.clear()
            layout = self._layouts[key] = _Layout(codes, rows.env_ids * self.width + codes)
        return layout

    def _find(self, rows: PollRows, layout: _Layout) -> tuple[np.ndarray, np.ndarray, _Layout]:
        """What the slots of ``rows`` hold: agents new to their episode mapped, extra
        rewards given, new trajectories opened (``look_up``). Returns the transitions
        each sub-env completed, the rows' trajectory ids and their layout (a new one if
        extra rewards made room for more agents)."""
        env_ids, codes = rows.env_ids, layout.codes
        traj = self._traj_at[layout.at]
        new = traj < 0  # (an agent without a policy in this episode has no trajectory)
        fresh = np.count_nonzero(new)
        if fresh:
            self._map_new(env_ids, codes, layout.at, new)
        n = len(self._table)
        agent_steps = np.bincount(env_ids[~new] if fresh else env_ids, minlength=n)
        if rows.extra_rewards:  # (may make room for more agents: new layouts)
            self._add_extra_rewards(rows, agent_steps)
            layout = self._layout(rows)
        if fresh:
            self._era += 1
            slots, at = self._traj_at, layout.at
            for k in np.flatnonzero(new).tolist():
                e, code = int(env_ids[k]), int(codes[k])
                traj[k] = slots[at[k]] = self._traj.new(self._agents[code], self._episode(e))
        return agent_steps, traj, layout

    def _map_new(
        self, env_ids: np.ndarray, codes: np.ndarray, at: np.ndarray, new: np.ndarray
    ) -> None:
        """Map the agents of rows ``new`` that have no policy in their episode yet."""
        unmapped = new & (self._policy_at[at] < 0)
        for k in np.flatnonzero(unmapped).tolist():
            self._map(int(env_ids[k]), int(codes[k]))

    def _sum_due(self) -> None:
        """Add the rewards logged since the last call to the returns, in the order they came
        (``np.add.at``: the same sums as adding them one poll at a time)."""
        due = self._due
        if not due:
            return
        at, rewards = (np.concatenate(c) for c in zip(*due))
        due.clear()
        np.add.at(self._returns_at, at, rewards)
        np.add.at(self._table.ret, at // self.width, rewards)  # (a slot's sub-env)

    def _map(self, e: int, code: int) -> int:
        """Map agent ``code`` of sub-env ``e``'s episode to its policy (once per episode)."""
        ep, agent = self._episode(e), self._agents[code]
        pid = ep.policy_for(agent)
        if pid not in self.policy_ids:
            raise ValueError(
                f"policy_mapping_fn mapped agent {agent!r} to policy {pid!r}, which the "
                f"runner does not have (its policies: {self.policy_ids})"
            )
        k = self.policy_ids.index(pid)
        slot = e * self.width + code
        self._policy_at[slot] = k
        self._index_at[slot] = ep.agent_index(agent)
        self._era += 1
        return k

    def _add_extra_rewards(self, rows: PollRows, agent_steps: np.ndarray) -> None:
        """Rewards given without an observation: into the episode's totals, and held for
        the agent's next transition (closing an agent that ended with one)."""
        for e, a, rew, te, tr in rows.extra_rewards:
            if self._table.episodes[e] is None:
                continue
            code = self._code(a)
            slot = e * self.width + code
            if self._policy_at[slot] < 0:
                self._map(e, code)
            self._due.append((np.array([slot]), np.array([rew])))
            if self._traj_at[slot] >= 0:
                self._pending_at[slot] += rew
                self._held = True
                if te or tr:
                    self._close_agent(e, code, (te, tr), agent_steps)

    def _close_agent(
        self, e: int, code: int, flags: tuple[bool, bool], agent_steps: np.ndarray
    ) -> None:
        """End a trajectory whose agent got no final observation: its closing row (the
        reward accumulated since its last action, no observation made up) is noted in
        the ends; it completes a transition of sub-env ``e``."""
        slot = e * self.width + code
        traj_id = int(self._traj_at[slot])
        pid = self.policy_ids[int(self._policy_at[slot])]
        self._traj_at[slot] = -1
        self._traj.close(traj_id)
        self._era += 1
        pending, self._pending_at[slot] = float(self._pending_at[slot]), 0.0
        t = int(self._table.length[e])
        self._closing(e, self._agents[code], ClosingRow(pid, traj_id, pending, *flags, t))
        agent_steps[e] += 1

    def close_open_agents(
        self, env_id: int, flags: tuple[bool, bool], agent_steps: np.ndarray
    ) -> None:
        """The episode in ``env_id`` ended: close every agent still waiting to act."""
        for code in np.flatnonzero(self._grid("traj")[env_id] >= 0).tolist():
            self._close_agent(env_id, code, flags, agent_steps)

    def write_returns(self, env_id: int, episode: Episode) -> None:
        """``episode``'s ``agent_rewards`` and ``total_reward`` made current."""
        self._sum_due()
        pids, agents = self.policy_ids, self._agents
        policy, returns = self._grid("policy")[env_id], self._grid("returns")[env_id]
        episode.agent_rewards = {
            (agents[c], pids[policy[c]]): float(returns[c])
            for c in np.flatnonzero(policy >= 0).tolist()
        }
        episode.total_reward = float(self._table.ret[env_id])

    def write_open_returns(self) -> None:
        """Every running episode's returns made current (before a batch is handed out:
        postprocessing and its callbacks see the episodes)."""
        for e, ep in enumerate(self._table.episodes):
            if ep is not None:
                self.write_returns(e, ep)

    def close_episode(self, env_id: int, episode: Episode) -> None:
        """``env_id``'s ``episode`` ended: its totals written, its agents forgotten (their
        trajectories close)."""
        self.write_returns(env_id, episode)
        traj = self._grid("traj")[env_id]
        for t in traj[traj >= 0].tolist():
            self._traj.close(t)
        traj[:] = -1
        self._grid("policy")[env_id] = -1
        self._era += 1
        self._grid("pending")[env_id] = 0.0
        self._grid("returns")[env_id] = 0.0
        self._table.ret[env_id] = 0.0

    def observation_fn(self, rows: PollRows, fn: Callable[..., Any], **context: Any) -> list:
        """``RunnerConfig.observation_fn`` applied per sub-env; returns the new obs list."""
        obs = list(rows.obs)
        by_env: dict[int, list[int]] = {}
        for i, e in enumerate(rows.env_ids.tolist()):
            by_env.setdefault(e, []).append(i)
        for e, members in by_env.items():
            agent_obs = {rows.agent_ids[i]: obs[i] for i in members}
            new = fn(agent_obs=agent_obs, episode=self._episode(e), **context)
            if set(new) != set(agent_obs):
                raise ValueError(
                    f"observation_fn must return the same agents {sorted(map(str, agent_obs))}, "
                    f"got {sorted(map(str, new))}"
                )
            for i in members:
                obs[i] = new[rows.agent_ids[i]]
        return obs
