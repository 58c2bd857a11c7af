"""One runner step: poll the env, run connectors and policies per policy, record, act.

Single-agent envs take a columnar path (per-env arrays, no per-row Python); multi-agent
rows go through the same batched connectors, with a small per-agent handle each.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID, SampleBatch
from rlconnect.collectors import AgentCollector
from rlconnect.collectors.policy_collector import EMPTY_INFO
from rlconnect.collectors.store import take_rows
from rlconnect.connectors import ActionData, AgentData
from rlconnect.envs.base import EnvRows
from rlconnect.envs.checks import check_rows
from rlconnect.envs.external import apply_logged_actions
from rlconnect.episodes import Episode
from rlconnect.runner.dense_steps import DenseSteps
from rlconnect.runner.faults import ActionCheck, SubEnvFaults, bad_rows, call_policy
from rlconnect.runner.multi_agent_steps import MultiAgentSteps
from rlconnect.spaces import stack_samples

if TYPE_CHECKING:
    from rlconnect.runner.runner import EnvRunner

__all__ = ["Stepper"]

CHECKED_POLLS = 3  # check_env inspects this many polls (and the first ones after a restart)


class Stepper(MultiAgentSteps, DenseSteps):
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
        self._on_created = self._cb.overrides("on_episode_created")
        self._on_end = self._cb.overrides("on_episode_end")
        self._soft: set[int] = set()
        cfg = runner.config
        self.faults = SubEnvFaults(
            n, restart=cfg.restart_failed_sub_environments, limit=cfg.sub_env_restart_limit
        )
        self._check_actions = {
            pid: ActionCheck(runner.env, p, pid) for pid, p in runner.policies.items()
        }
        self._not_done_rows: np.ndarray | None = None  # see DenseSteps._not_done
        # an ExternalEnv serves its non-recorded episodes with this runner's policies
        attach = getattr(runner.env, "attach_runner", None)
        if attach is not None:
            attach(runner)

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
        if self._on_created:
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
        if self._on_end:
            self._cb.on_episode_end(
                runner=self.r,
                base_env=self.r.env,
                policies=self.r.policies,
                env_index=env_id,
                episode=ep,
            )
        self.r._metrics.append(ep.to_metrics())
        for pid in self._pids:
            for pipe in (self.r._agent_pipes[pid], self.r._action_pipes[pid]):
                if len(pipe):
                    pipe.reset(env_id)
        self.episodes[env_id] = None
        self.agents[env_id] = {}

    def open_episodes(self, env_ids: list[int]) -> None:
        """Start an episode in each of ``env_ids``, which just gave a first observation
        (ending the one there if the env reset by itself mid-episode)."""
        for e in env_ids:
            if self.episodes[e] is not None and self.ep_len[e] > 0:
                self._end_episode(e)
            if self.episodes[e] is None:
                self._start_episode(e)

    def fire_episode_start(self, env_ids: list[int]) -> None:
        """``on_episode_start`` for the episodes that just got their first observation."""
        if not self._cb.overrides("on_episode_start"):
            return
        r = self.r
        for e in env_ids:
            self._cb.on_episode_start(
                runner=r, base_env=r.env, policies=r.policies, env_index=e, episode=self.episodes[e]
            )

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
            self.faults.on_error(env_id, exc)  # raises unless the sub-env may be restarted
            if self.episodes[env_id] is None:  # the reset itself failed: report it too
                self._start_episode(env_id)
            self._end_episode(env_id, faulty=True)
            self.r.env.try_restart(env_id)
            if self.r.config.check_env:  # a rebuilt env is checked again
                self._checks_left = max(self._checks_left, 2)

    # -- stepping -------------------------------------------------------------------------
    def run_until_ready(self, mode: str, target: int, count_by: str) -> None:
        """Step until the collectors can build a batch of ``target`` steps."""
        ready = self.r.collectors.ready
        while not ready(mode, target, count_by):
            if self.r._dense_path and self.dense_ok():
                self.run_dense(mode, target, count_by)
            else:
                self.step()

    def step(self) -> None:
        """Poll once and process every row."""
        timers = self.r.timers
        t0 = time.perf_counter()
        rows = self.r.env.poll()
        timers.add("mean_env_wait_ms", time.perf_counter() - t0)
        poll = self.poll_index
        self.poll_index += 1
        timers.steps += 1
        self.process(rows, poll)

    def process(self, rows: EnvRows, poll: int) -> None:
        """Everything one poll's rows cause: episodes, connectors, recording, actions."""
        r, cfg = self.r, self.r.config
        if self.faults.restart and len(rows):  # bad outputs are failures too: screen them
            bad = bad_rows(r.env, rows, full=bool(self._checks_left))
            if bad:
                rows = rows.without_envs(bad)
        if rows.errors:
            self._handle_errors(rows.errors)
        if not len(rows) and not rows.extra_rewards:
            return
        if self._checks_left:
            self._checks_left -= 1
            check_rows(r.env, rows)
        if rows.is_first.any():
            self.open_episodes(np.unique(rows.env_ids[rows.is_first]).tolist())
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
        agent_steps = np.zeros(len(self.ep_len), dtype=np.int64)
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
        if len(firsts):
            self.fire_episode_start(np.unique(firsts).tolist())
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
        self.faults.episodes_completed(done_envs)

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
            obs = rows.obs if idx is None else take_rows(rows.obs, idx)
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
            inputs = {k: take_rows(v, ai) for k, v in data.columns.items() if k != "infos"}
            where, act_env = act, env_ids[ai]
            act_agents = tuple(agent_ids[i] for i in ai.tolist())
        actions, state_outs, fetches = call_policy(
            policy, pid, inputs, cfg.explore, act_env, act_agents
        )
        logged = getattr(rows, "logged_actions", None)
        if logged:  # ExternalEnv.log_action: the logged action is what gets recorded
            actions, fetches = apply_logged_actions(
                policy, logged, act_env, act_agents, actions, fetches
            )
        t2 = clock()
        timers.add("mean_inference_ms", t2 - t1)
        outputs = {"actions": actions, **fetches}
        for i, s in enumerate(state_outs):
            outputs[SampleBatch.state_out(i)] = s
        out = ActionData.trusted(act_env, act_agents, dict(outputs))
        pipe.on_policy_output(out)
        collector.add_outputs(outputs, where)
        env_actions = r._action_pipes[pid](out)["actions"]
        if not logged:  # never step an env with an action outside its space
            self._check_actions[pid](env_actions, act_env, act_agents)
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
        return self._trajectories_multi(pid, env_ids, agent_ids, is_first)

    def _trajectories_single(
        self, env_ids: np.ndarray, is_first: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Single-agent fast path: one trajectory per sub-env episode, kept in an array."""
        if is_first.any():
            for e in env_ids[is_first].tolist():
                self.traj_of_env[e] = self._new_traj(e, DEFAULT_AGENT_ID)
        return self.traj_of_env[env_ids], is_first, 0
