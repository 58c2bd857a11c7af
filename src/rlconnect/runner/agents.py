"""Multi-agent bookkeeping: agents that come, go, take turns, and get rewards in between.

Single-agent envs never use it. Per agent per episode it keeps a small handle
(``AgentCollector``: trajectory id, agent index, reward pending since the last action);
the rows themselves stay in the per-policy collectors, appended a whole step at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.collectors import AgentCollector, PolicyCollectorGroup
from rlconnect.envs.base import EnvRows
from rlconnect.runner.episode_tracker import EpisodeTracker
from rlconnect.runner.trajectories import TrajectoryIds

__all__ = ["MultiAgentBook", "episode_flags"]


def episode_flags(
    rows: EnvRows,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    done_envs: dict[int, tuple[bool, bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """Final rows of an episode ended by ``__all__`` carry the episode's flags."""
    ended = np.isin(rows.env_ids, list(done_envs))
    fill = ended & ~(terminateds | truncateds)
    if not fill.any():
        return terminateds, truncateds
    flags = np.array([done_envs.get(e, (False, False)) for e in rows.env_ids.tolist()])
    return terminateds | (fill & flags[:, 0]), truncateds | (fill & flags[:, 1])


class MultiAgentBook:
    """The agent handles of every sub-env's running episode."""

    def __init__(
        self,
        num_envs: int,
        episodes: EpisodeTracker,
        trajectories: TrajectoryIds,
        collectors: PolicyCollectorGroup,
    ) -> None:
        self.agents: list[dict[Any, AgentCollector]] = [{} for _ in range(num_envs)]
        self._episodes = episodes
        self._traj = trajectories
        self._collectors = collectors

    def trajectories(
        self, pid: str, env_ids: np.ndarray, agent_ids: tuple
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Trajectory id, whether it is new, and agent index of every row."""
        n = len(env_ids)
        traj = np.empty(n, dtype=np.int64)
        new = np.zeros(n, dtype=bool)
        index = np.empty(n, dtype=np.int64)
        for k, (e, a) in enumerate(zip(env_ids.tolist(), agent_ids)):
            col = self.agents[e].get(a)
            if col is None or col.closed:
                ep = self._episodes[e]
                tid = self._traj.new(a, ep)
                col = AgentCollector(tid, e, a, pid, ep.episode_id, ep.agent_index(a))
                self.agents[e][a] = col
                new[k] = True
            traj[k] = col.traj_id
            index[k] = col.agent_index
        return traj, new, index

    def mark_closed(self, env_ids: np.ndarray, agent_ids: tuple, done: np.ndarray) -> None:
        """The agents of rows ``done`` ended their trajectories with these rows."""
        for k in np.flatnonzero(done).tolist():
            col = self.agents[int(env_ids[k])].get(agent_ids[k])
            if col is not None:
                col.closed = True
                self._traj.close(col.traj_id)

    def add_rewards(self, rows: EnvRows, poll: int, agent_steps: np.ndarray) -> None:
        """Episode totals of every reward, and rewards given without an observation held
        for the agent's next transition (closing agents that ended with one)."""
        for e, a, rew in zip(rows.env_ids.tolist(), rows.agent_ids, rows.rewards.tolist()):
            self._episodes[e].add_rewards([a], [rew])
        for e, a, rew, te, tr in rows.extra_rewards:
            ep = self._episodes.episodes[e]
            if ep is None:
                continue
            ep.add_rewards([a], [rew])
            col = self.agents[e].get(a)
            if col is not None and not col.closed:
                col.pending_reward += rew
                if te or tr:
                    self._close_agent(col, (te, tr), poll, agent_steps)

    def take_pending(self, env_ids: np.ndarray, agent_ids: tuple) -> np.ndarray:
        """Rewards each row's agent earned while not acting (and clear them)."""
        out = np.zeros(len(env_ids))
        for k, (e, a) in enumerate(zip(env_ids.tolist(), agent_ids)):
            col = self.agents[e].get(a)
            if col is not None and not col.closed and col.pending_reward:
                out[k] = col.pending_reward
                col.pending_reward = 0.0
        return out

    def _close_agent(
        self, col: AgentCollector, flags: tuple[bool, bool], poll: int, agent_steps: np.ndarray
    ) -> None:
        """End a trajectory whose agent got no final observation.

        Its last transition repeats the agent's last observation as ``new_obs`` and holds
        the reward accumulated since its last action (no observation is made up).
        """
        collector = self._collectors[col.policy_id]
        rows = np.flatnonzero(collector.trajectory_ids() == col.traj_id)
        col.closed = True
        self._traj.close(col.traj_id)
        if not len(rows):
            return
        cols = collector.copy_rows(rows[-1:])
        cols["rewards"] = np.asarray([col.pending_reward], dtype=cols["rewards"].dtype)
        cols["terminateds"] = np.asarray([flags[0]])
        cols["truncateds"] = np.asarray([flags[1]])
        cols["infos"] = [EMPTY_INFO]
        cols["t"] = np.asarray([self._episodes.length[col.env_id]], dtype=np.int64)
        col.pending_reward = 0.0
        collector.add_rows(np.asarray([col.traj_id]), poll, cols, last=True)
        agent_steps[col.env_id] += 1

    def close_open_agents(
        self, env_id: int, flags: tuple[bool, bool], poll: int, agent_steps: np.ndarray
    ) -> None:
        """The episode in ``env_id`` ended: close every agent still waiting to act."""
        for col in list(self.agents[env_id].values()):
            if not col.closed:
                self._close_agent(col, flags, poll, agent_steps)

    def close_episode(self, env_id: int) -> None:
        """Forget the agents of ``env_id``'s ended episode (their trajectories close)."""
        for col in self.agents[env_id].values():
            self._traj.close(col.traj_id)
        self.agents[env_id] = {}

    def observation_fn(self, rows: EnvRows, fn: Callable[..., Any], **context: Any) -> list:
        """``RunnerConfig.observation_fn`` applied per sub-env; returns the new obs list."""
        obs = list(rows.obs)
        by_env: dict[int, list[int]] = {}
        for i, e in enumerate(rows.env_ids.tolist()):
            by_env.setdefault(e, []).append(i)
        for e, members in by_env.items():
            agent_obs = {rows.agent_ids[i]: obs[i] for i in members}
            new = fn(agent_obs=agent_obs, episode=self._episodes[e], **context)
            if set(new) != set(agent_obs):
                raise ValueError(
                    f"observation_fn must return the same agents {sorted(map(str, agent_obs))}, "
                    f"got {sorted(map(str, new))}"
                )
            for i in members:
                obs[i] = new[rows.agent_ids[i]]
        return obs
