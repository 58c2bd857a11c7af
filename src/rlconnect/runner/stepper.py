"""One runner step: poll the env, run connectors and policies per policy, record, act.

Single-agent envs take a columnar path (per-env arrays, no per-row Python); multi-agent
rows go through the same batched connectors, with a small per-agent handle each.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID, SampleBatch
from rlconnect.collectors import AgentCollector
from rlconnect.connectors import ActionData, AgentData
from rlconnect.envs.base import EnvRows
from rlconnect.envs.checks import check_rows
from rlconnect.episodes import Episode
from rlconnect.errors import EnvError
from rlconnect.spaces import stack_samples

if TYPE_CHECKING:
    from rlconnect.runner.runner import EnvRunner

__all__ = ["Stepper"]

CHECKED_POLLS = 3  # check_env inspects this many polls (and the first ones after a restart)


def _take(batch: Any, idx: np.ndarray) -> Any:
    if isinstance(batch, np.ndarray):
        return batch[idx]
    return tree.map_structure(lambda a: a[idx], batch)


EMPTY_INFO: Mapping[str, Any] = MappingProxyType({})
"""Stored for every empty info dict: one shared read-only mapping, not a dict per row."""


class Stepper:
    """The mutable state of the sampling loop and the code of one step."""

    def __init__(self, runner: EnvRunner) -> None:
        self.r = runner
        n = runner.num_envs
        self.poll_index = 0
        self.episodes: list[Episode | None] = [None] * n
        self.agents: list[dict[Any, AgentCollector]] = [{} for _ in range(n)]
        self.ep_len = np.zeros(n, dtype=np.int64)
        self.ep_ret = np.zeros(n, dtype=np.float64)
        self.eps_of_env = np.full(n, -1, dtype=np.int64)
        self.ep_agent_steps = np.zeros(n, dtype=np.int64)
        self.traj_of_env = np.full(n, -1, dtype=np.int64)
        self.multi = runner.env.is_multi_agent
        self.traj_info: dict[int, tuple[Any, Episode]] = {}
        self._closed_trajs: list[int] = []
        self._next_traj = 0
        self._next_eps = runner.config.worker_index << 40
        self._checks_left = CHECKED_POLLS if runner.config.check_env else 0
        self._pids = list(runner.policies)
        self._cb = runner.callbacks
        self._on_step = self._cb.overrides("on_episode_step")
        self._soft: set[int] = set()

    # -- episodes -------------------------------------------------------------------------
    def _start_episode(self, env_id: int) -> Episode:
        ep = Episode(self._next_eps, env_id, self.r.policy_mapping_fn, worker=self.r)
        self._next_eps += 1
        self.episodes[env_id] = ep
        self.eps_of_env[env_id] = ep.episode_id
        self.agents[env_id] = {}
        self.ep_len[env_id] = 0
        self.ep_ret[env_id] = 0.0
        self.ep_agent_steps[env_id] = 0
        if not self.multi:
            ep.policy_for(DEFAULT_AGENT_ID)  # the mapping fn: once per agent per episode
        if self._cb.overrides("on_episode_created"):
            self._cb.on_episode_created(
                runner=self.r, base_env=self.r.env, env_index=env_id, episode=ep
            )
        return ep

    def _end_episode(self, env_id: int, *, faulty: bool = False) -> None:
        ep = self.episodes[env_id]
        if ep is None:
            return
        ep.length = int(self.ep_len[env_id])
        if not self.r.env.is_multi_agent:
            ep.total_reward = float(self.ep_ret[env_id])
            ep.agent_rewards = {(a, ep.policy_for(a)): ep.total_reward for a in ep.get_agents()}
        ep.faulty = faulty
        for col in self.agents[env_id].values():
            self._closed_trajs.append(col.traj_id)
        if not self.multi and self.traj_of_env[env_id] >= 0:
            self._closed_trajs.append(int(self.traj_of_env[env_id]))
            self.traj_of_env[env_id] = -1
        if faulty:
            self.r.collectors.drop_episode(ep.episode_id)
        else:
            self.r.collectors.finish_episode(
                ep.episode_id,
                ep.length,
                int(self.ep_agent_steps[env_id]) if self.multi else ep.length,
            )
        if self._cb.overrides("on_episode_end"):
            self._cb.on_episode_end(
                runner=self.r,
                base_env=self.r.env,
                policies=self.r.policies,
                env_index=env_id,
                episode=ep,
            )
        self.r._metrics.append(ep.to_metrics())
        for pid in self._pids:
            self.r._agent_pipes[pid].reset(env_id)
            self.r._action_pipes[pid].reset(env_id)
        self.episodes[env_id] = None
        self.agents[env_id] = {}

    def forget_closed_trajectories(self) -> None:
        """Drop the bookkeeping of trajectories that ended and were wholly handed out."""
        if not self._closed_trajs:
            return
        left = [c.column("_traj") for c in self.r.collectors.collectors.values() if len(c)]
        still = set(np.concatenate(left).tolist()) if left else set()
        keep = []
        for t in self._closed_trajs:
            if t in still:
                keep.append(t)
            else:
                self.traj_info.pop(t, None)
        self._closed_trajs = keep

    def _handle_errors(self, errors: dict[int, BaseException]) -> None:
        for env_id, exc in sorted(errors.items()):
            if not self.r.config.restart_failed_sub_environments:
                raise EnvError(
                    f"sub-env {env_id} raised {type(exc).__name__}: {exc} (set "
                    "RunnerConfig(restart_failed_sub_environments=True) to restart it instead)"
                ) from exc
            if self.episodes[env_id] is None:  # the reset itself failed: report it too
                self._start_episode(env_id)
            self._end_episode(env_id, faulty=True)
            self.r.env.try_restart(env_id)
            if self.r.config.check_env:  # a rebuilt env is checked again
                self._checks_left = max(self._checks_left, 2)

    # -- one step -------------------------------------------------------------------------
    def step(self) -> None:
        """Poll once and process every row."""
        r, cfg, timers = self.r, self.r.config, self.r.timers
        t0 = time.perf_counter()
        rows = r.env.poll()
        timers.add("mean_env_wait_ms", time.perf_counter() - t0)
        poll = self.poll_index
        self.poll_index += 1
        timers.steps += 1
        if rows.errors:
            self._handle_errors(rows.errors)
        if not len(rows) and not rows.extra_rewards:
            return
        if self._checks_left:
            self._checks_left -= 1
            check_rows(r.env, rows)
        if rows.is_first.any():
            for e in np.unique(rows.env_ids[rows.is_first]).tolist():
                if self.episodes[e] is not None and self.ep_len[e] > 0:
                    self._end_episode(e)
                if self.episodes[e] is None:
                    self._start_episode(e)
        if self.multi:
            for e in np.unique(rows.env_ids).tolist():
                if self.episodes[e] is None:
                    self._start_episode(e)
        stepped = rows.stepped
        self.ep_len[stepped] += 1
        done_envs = dict(rows.done_envs)
        if cfg.horizon is not None and len(stepped):
            over = stepped[self.ep_len[stepped] >= cfg.horizon].tolist()
            for e in over:
                if e not in done_envs:
                    done_envs[e] = (False, True)
            if over:
                rows.truncateds = rows.truncateds | np.isin(rows.env_ids, over)
        if r.env.is_multi_agent and done_envs:
            self._apply_episode_flags(rows, done_envs)
        agent_steps = np.zeros(r.num_envs, dtype=np.int64)
        if r.env.is_multi_agent:
            self._rewards_multi_agent(rows, poll, agent_steps)
            if cfg.observation_fn is not None:
                self._apply_observation_fn(rows)
        else:
            self.ep_ret[rows.env_ids] += rows.rewards  # one row per sub-env
        env_done = np.isin(rows.env_ids, list(done_envs)) if done_envs else None
        for pid, idx in self._group(rows):
            self._process_policy(pid, idx, rows, poll, env_done, agent_steps)
        for e in sorted(done_envs):
            self._close_open_agents(e, done_envs[e], poll, agent_steps)
        if self.multi:
            self.ep_agent_steps += agent_steps
            r.collectors.add_env_steps(
                poll, stepped, self.eps_of_env[stepped], agent_steps[stepped]
            )
        elif len(stepped):  # one agent: every env step completes one transition
            r.collectors.add_env_steps(poll, stepped, self.eps_of_env[stepped], 1)
        firsts = rows.env_ids[rows.is_first]
        if len(firsts) and self._cb.overrides("on_episode_start"):
            for e in np.unique(firsts).tolist():
                self._cb.on_episode_start(
                    runner=r,
                    base_env=r.env,
                    policies=r.policies,
                    env_index=e,
                    episode=self.episodes[e],
                )
        if self._on_step:
            for e in stepped.tolist():
                self.episodes[e].length = int(self.ep_len[e])
                self._cb.on_episode_step(
                    runner=r,
                    base_env=r.env,
                    policies=r.policies,
                    env_index=e,
                    episode=self.episodes[e],
                )
        for e in sorted(done_envs):
            self._end_episode(e)
            soft = cfg.soft_horizon and done_envs[e] == (False, True) and e not in rows.done_envs
            if soft:
                r.env.soft_reset(e)
            else:
                r.env.try_reset(e)

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

    def _group(self, rows: EnvRows) -> list[tuple[str, np.ndarray | None]]:
        """Row indices per policy (``None``: all rows)."""
        if len(self._pids) == 1:
            return [(self._pids[0], None)] if len(rows) else []
        pids = [
            self.episodes[e].policy_for(a) for e, a in zip(rows.env_ids.tolist(), rows.agent_ids)
        ]
        groups: dict[str, list[int]] = {}
        for i, pid in enumerate(pids):
            groups.setdefault(pid, []).append(i)
        return [(pid, np.asarray(ix, dtype=np.int64)) for pid, ix in groups.items()]

    def _process_policy(
        self,
        pid: str,
        idx: np.ndarray | None,
        rows: EnvRows,
        poll: int,
        env_done: np.ndarray | None,
        agent_steps: np.ndarray,
    ) -> None:
        r, cfg, timers = self.r, self.r.config, self.r.timers
        clock = time.perf_counter
        t0 = clock()
        pipe, policy = r._agent_pipes[pid], r.policies[pid]
        sel = slice(None) if idx is None else idx
        env_ids = rows.env_ids[sel]
        agent_ids = (
            rows.agent_ids if idx is None else tuple(rows.agent_ids[i] for i in idx.tolist())
        )
        if rows.stacked:
            obs = rows.obs if idx is None else _take(rows.obs, idx)
        else:
            obs = stack_samples(
                pipe.input_space,
                [rows.obs[i] for i in (range(len(rows)) if idx is None else idx.tolist())],
            )
        is_first = rows.is_first[sel]
        terminateds, truncateds = rows.terminateds[sel], rows.truncateds[sel]
        infos = rows.infos if idx is None else [rows.infos[i] for i in idx.tolist()]
        traj, new_traj, agent_index = self._trajectories(pid, env_ids, agent_ids, is_first)
        rewards = rows.rewards[sel]
        if r.env.is_multi_agent:
            rewards = rewards + self._take_pending(env_ids, agent_ids)
        t_col = self.ep_len[env_ids]
        cols = {
            "obs": obs,
            "rewards": rewards,
            "terminateds": terminateds,
            "truncateds": truncateds,
            "infos": [i if i else EMPTY_INFO for i in infos],
            "t": t_col,
        }
        data = AgentData.trusted(env_ids, agent_ids, cols)
        data = pipe(data)
        record = dict(data.columns)
        record["eps_id"] = self.eps_of_env[env_ids]
        record["env_id"] = env_ids
        record["agent_index"] = agent_index
        if cfg.keep_raw_obs:
            record["raw_obs"] = obs
        done = terminateds | truncateds
        if env_done is not None:
            done = done | env_done[sel]
        collector = r.collectors[pid]
        collector.add_rows(traj, poll, record, last=done)
        if self.multi:
            agent_steps += np.bincount(env_ids[~new_traj], minlength=len(agent_steps))
        if self.multi:
            self._mark_closed(env_ids, agent_ids, done)
        t1 = clock()
        timers.add("mean_raw_obs_processing_ms", t1 - t0)
        act = ~done
        if not act.any():
            return
        if act.all():
            inputs: Any = data
            where, act_env, act_agents = None, env_ids, agent_ids
        else:
            ai = np.flatnonzero(act)
            inputs = {k: _take(v, ai) for k, v in data.columns.items() if k != "infos"}
            where, act_env = act, env_ids[ai]
            act_agents = tuple(agent_ids[i] for i in ai.tolist())
        actions, state_outs, fetches = policy.compute_actions(inputs, explore=cfg.explore)
        t2 = clock()
        timers.add("mean_inference_ms", t2 - t1)
        outputs = {"actions": actions, **fetches}
        for i, s in enumerate(state_outs):
            outputs[SampleBatch.state_out(i)] = s
        out = ActionData.trusted(act_env, act_agents, dict(outputs))
        pipe.on_policy_output(out)
        collector.add_outputs(outputs, where)
        env_actions = r._action_pipes[pid](out)["actions"]
        if cfg.record_env_actions:
            collector.add_outputs({"env_actions": env_actions}, where)
        t3 = clock()
        timers.add("mean_action_processing_ms", t3 - t2)
        r.env.send_actions(act_env, act_agents, env_actions)
        timers.add("mean_env_wait_ms", clock() - t3)

    # -- trajectories ---------------------------------------------------------------------
    def _new_traj(self, env_id: int, agent_id: Any) -> int:
        t = self._next_traj
        self._next_traj += 1
        self.traj_info[t] = (agent_id, self.episodes[env_id])
        return t

    def _trajectories(
        self, pid: str, env_ids: np.ndarray, agent_ids: tuple, is_first: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | int]:
        """Trajectory id, whether it is new, and agent index of every row (or one for all)."""
        if not self.multi:
            return self._trajectories_single(env_ids, is_first)
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

    def _trajectories_single(
        self, env_ids: np.ndarray, is_first: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Single-agent fast path: one trajectory per sub-env episode, kept in an array."""
        if is_first.any():
            for e in env_ids[is_first].tolist():
                self.traj_of_env[e] = self._new_traj(e, DEFAULT_AGENT_ID)
        return self.traj_of_env[env_ids], is_first, 0

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
