"""The multi-agent half of a runner step: agents joining, leaving, acting in turns.

Mixed into ``Stepper``; single-agent envs never reach these methods. Per-agent work is a
small handle per agent per episode (``AgentCollector``), never per-row collector calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlconnect.collectors import AgentCollector
from rlconnect.collectors.policy_collector import EMPTY_INFO
from rlconnect.envs.base import EnvRows

if TYPE_CHECKING:
    from rlconnect.episodes import Episode
    from rlconnect.runner.runner import EnvRunner

__all__ = ["MultiAgentSteps"]


class MultiAgentSteps:
    """Bookkeeping of agents that come, go and take turns (see ``Stepper``)."""

    r: EnvRunner
    episodes: list[Episode | None]
    agents: list[dict[Any, AgentCollector]]
    ep_len: np.ndarray
    _closed_trajs: list[int]

    def _new_traj(self, env_id: int, agent_id: Any) -> int:
        raise NotImplementedError  # provided by Stepper

    @staticmethod
    def _apply_episode_flags(rows: EnvRows, done_envs: dict[int, tuple[bool, bool]]) -> None:
        """Final rows of an episode ended by ``__all__`` carry the episode's flags."""
        ended = np.isin(rows.env_ids, list(done_envs))
        own = rows.terminateds | rows.truncateds
        fill = ended & ~own
        if fill.any():
            flags = np.array([done_envs.get(e, (False, False)) for e in rows.env_ids.tolist()])
            rows.terminateds = rows.terminateds | (fill & flags[:, 0])
            rows.truncateds = rows.truncateds | (fill & flags[:, 1])

    def _trajectories_multi(
        self, pid: str, env_ids: np.ndarray, agent_ids: tuple, is_first: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | int]:
        """Trajectory id, whether it is new, and agent index of every row (or one for all)."""
        n = len(env_ids)
        traj = np.empty(n, dtype=np.int64)
        new = np.zeros(n, dtype=bool)
        index = np.empty(n, dtype=np.int64)
        for k, (e, a) in enumerate(zip(env_ids.tolist(), agent_ids)):
            col = self.agents[e].get(a)
            if col is None or col.closed:
                ep = self.episodes[e]
                col = AgentCollector(
                    self._new_traj(e, a), e, a, pid, ep.episode_id, ep.agent_index(a)
                )
                self.agents[e][a] = col
                new[k] = True
            traj[k] = col.traj_id
            index[k] = col.agent_index
        return traj, new, index

    def _mark_closed(self, env_ids: np.ndarray, agent_ids: tuple, done: np.ndarray) -> None:
        for k in np.flatnonzero(done).tolist():
            col = self.agents[int(env_ids[k])].get(agent_ids[k])
            if col is not None:
                col.closed = True
                self._closed_trajs.append(col.traj_id)

    # -- multi-agent rewards --------------------------------------------------------------
    def _rewards_multi_agent(self, rows: EnvRows, poll: int, agent_steps: np.ndarray) -> None:
        for e, a, rew in zip(rows.env_ids.tolist(), rows.agent_ids, rows.rewards.tolist()):
            self.episodes[e].add_rewards([a], [rew])
        for e, a, rew, te, tr in rows.extra_rewards:
            ep = self.episodes[e]
            if ep is None:
                continue
            ep.add_rewards([a], [rew])
            col = self.agents[e].get(a)
            if col is not None and not col.closed:
                col.pending_reward += rew
                if te or tr:
                    self._close_agent(col, (te, tr), poll, agent_steps)

    def _take_pending(self, env_ids: np.ndarray, agent_ids: tuple) -> np.ndarray:
        out = np.zeros(len(env_ids))
        for k, (e, a) in enumerate(zip(env_ids.tolist(), agent_ids)):
            col = self.agents[e].get(a)
            if col is not None and not col.closed and col.pending_reward:
                out[k] = col.pending_reward
                col.pending_reward = 0.0
        return out

    def _close_agent(
        self,
        col: AgentCollector,
        flags: tuple[bool, bool],
        poll: int,
        agent_steps: np.ndarray,
    ) -> None:
        """End a trajectory whose agent got no final observation.

        Its last transition repeats the agent's last observation as ``new_obs`` and holds
        the reward accumulated since its last action (no observation is made up).
        """
        collector = self.r.collectors[col.policy_id]
        rows = np.flatnonzero(collector.column("_traj") == col.traj_id)
        col.closed = True
        self._closed_trajs.append(col.traj_id)
        if not len(rows):
            return
        cols = collector.copy_rows(rows[-1:])
        cols["rewards"] = np.asarray([col.pending_reward], dtype=cols["rewards"].dtype)
        cols["terminateds"] = np.asarray([flags[0]])
        cols["truncateds"] = np.asarray([flags[1]])
        cols["infos"] = [EMPTY_INFO]
        cols["t"] = np.asarray([self.ep_len[col.env_id]], dtype=np.int64)
        col.pending_reward = 0.0
        collector.add_rows(np.asarray([col.traj_id]), poll, cols, last=True)
        agent_steps[col.env_id] += 1

    def _close_open_agents(
        self, env_id: int, flags: tuple[bool, bool], poll: int, agent_steps: np.ndarray
    ) -> None:
        for col in list(self.agents[env_id].values()):
            if not col.closed:
                self._close_agent(col, flags, poll, agent_steps)

    def _apply_observation_fn(self, rows: EnvRows) -> None:
        fn = self.r.config.observation_fn
        by_env: dict[int, list[int]] = {}
        for i, e in enumerate(rows.env_ids.tolist()):
            by_env.setdefault(e, []).append(i)
        for e, members in by_env.items():
            agent_obs = {rows.agent_ids[i]: rows.obs[i] for i in members}
            new = fn(
                agent_obs=agent_obs,
                worker=self.r,
                base_env=self.r.env,
                policies=self.r.policies,
                episode=self.episodes[e],
            )
            if set(new) != set(agent_obs):
                raise ValueError(
                    f"observation_fn must return the same agents {sorted(map(str, agent_obs))}, "
                    f"got {sorted(map(str, new))}"
                )
            for i in members:
                rows.obs[i] = new[rows.agent_ids[i]]
