"""The step kernel: everything one poll's rows cause, written once.

``StepKernel.step(rows)`` takes the rows of one ``env.poll()`` (dense or not, single- or
multi-agent, from any env adapter) through

1. screening: sub-envs that raised or returned bad data are restarted or named
   (``SubEnvFaults``), non-finite values are caught (``check_finite``), the first polls
   are checked against the spaces (``check_env``);
2. episodes: first observations open episodes, lengths advance, the horizon truncates
   (``EpisodeTracker``; agents of multi-agent envs in ``MultiAgentBook``);
3. per policy, one batched pass: the agent pipeline, for the rows that act the policy and
   the action pipeline (``act``) and the env actions, then the record (``Recorder``);
4. the env-step log, the episode callbacks, and the end and reset of finished episodes.

Dense single-agent polls take the same steps as arrays over all rows (no per-row Python);
the recorder then buffers them and hands whole blocks to the collectors.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.take import take_rows
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.connectors import AgentData
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.checks import check_rows
from rlconnect.episodes import Episode
from rlconnect.policy import Policy
from rlconnect.runner.acting import act, live_rows
from rlconnect.runner.agents import MultiAgentBook, episode_flags
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.episode_tracker import EpisodeHooks, EpisodeTracker
from rlconnect.runner.faults import ActionCheck, SubEnvFaults, bad_rows, check_finite
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.pipelines import PolicyPipelines
from rlconnect.runner.recorder import Recorder, shared_infos
from rlconnect.runner.trajectories import TrajectoryIds
from rlconnect.spaces import stack_samples

__all__ = ["CHECKED_POLLS", "StepKernel"]

CHECKED_POLLS = 3  # check_env inspects this many polls (and the first ones after a restart)
#: ``complete_episodes`` without a horizon: an episode longer than this (or 100 batches)
#: is taken for one that never ends; checked every ``ENDLESS_CHECK_EVERY`` polls
ENDLESS_EPISODE_STEPS = 1_000_000
ENDLESS_CHECK_EVERY = 1024


class StepKernel:
    """The sampling loop's state and its one step (see the module docstring)."""

    def __init__(
        self,
        env: BaseEnv,
        policies: Mapping[str, Policy],
        pipes: PolicyPipelines,
        config: RunnerConfig,
        collectors: PolicyCollectorGroup,
        timers: PerfTimers,
        hooks: EpisodeHooks,
        mapping_fn: Any,
    ) -> None:
        n = env.num_envs
        self.env, self.policies, self.pipes, self.config = env, policies, pipes, config
        self.collectors, self.timers = collectors, timers
        self.multi = env.is_multi_agent
        self.poll_index = 0
        self.recorder = Recorder(collectors, pack=env.steps_while_recording)
        self.trajectories = TrajectoryIds(n, self.recorder.leftovers)  # owners freed per poll
        self.episodes = EpisodeTracker(
            n,
            multi_agent=self.multi,
            mapping_fn=mapping_fn,
            first_id=config.worker_index << 40,
            hooks=hooks,
            on_close=self._close_episodes,
            connector_resets=pipes.episode_resets,
        )
        self.book = MultiAgentBook(n, self.episodes, self.trajectories, collectors)
        self.faults = SubEnvFaults(
            n, restart=config.restart_failed_sub_environments, limit=config.sub_env_restart_limit
        )
        self._checks_left = CHECKED_POLLS if config.check_env else 0
        self._pids = list(policies)
        self._one_pid = self._pids[0] if len(self._pids) == 1 else ""  # "": several
        self._action_checks = {pid: ActionCheck(env, p, pid) for pid, p in policies.items()}
        #: dense polls may be recorded in blocks: one policy, no per-step hook or soft horizon
        self.blockable = (
            not self.multi and len(self._pids) == 1 and not config.soft_horizon
        ) and not hooks.on_step
        #: one policy, one agent, no ``on_episode_created``: new episodes' ids, objects and
        #: trajectories are made once the poll's actions are out (nothing reads them before)
        self._late_episodes = not self.multi and bool(self._one_pid) and not hooks.on_created
        self._not_done: np.ndarray = np.zeros(0, dtype=bool)
        self._runner = hooks.runner  # what user functions are shown as ``worker=``
        self._on_step = hooks.on_step
        self._check_finite = config.check_finite
        self._secs = timers.seconds  # stage -> seconds, added to without a call per stage

    # -- the loop -------------------------------------------------------------------------
    def run_until(self, mode: str, target: int, count_by: str) -> None:
        """Poll and step until the collectors can build a batch of ``target`` steps."""
        group, recorder, env, timers = self.collectors, self.recorder, self.env, self.timers
        clock = time.perf_counter
        truncating = mode == "truncate_episodes"
        recorder.expect(target - group.env_steps() if truncating else 0, env.num_envs)
        try:
            while True:
                if truncating:
                    have = group.env_steps() if count_by == "env_steps" else group.agent_steps()
                    if have + recorder.buffered_env_steps >= target:
                        break
                elif group.ready(mode, target, count_by):
                    break
                elif self.poll_index % ENDLESS_CHECK_EVERY == 0 and self.config.horizon is None:
                    self.episodes.refuse_endless(max(ENDLESS_EPISODE_STEPS, 100 * target))
                t0 = clock()
                rows = env.poll()
                self._secs["mean_env_wait_ms"] += clock() - t0
                timers.steps += 1
                self.step(rows)
        finally:
            recorder.flush()

    def step(self, rows: EnvRows) -> None:
        """Everything one poll's rows cause: episodes, connectors, recording, actions."""
        poll = self.poll_index
        self.poll_index += 1
        if self.faults.restart or rows.errors or self._checks_left:
            rows = self._screen(rows, poll)
        elif self._check_finite and len(rows.env_ids):  # the common case, without a call
            check_finite(rows, poll, self.episodes.length)
        env_ids = rows.env_ids
        n = len(env_ids)
        if not n and not rows.extra_rewards:
            return
        episodes, multi = self.episodes, self.multi
        full = rows.dense and n == len(episodes.length)  # row i is sub-env i
        stepped = rows.stepped
        all_stepped = full and len(stepped) == n  # then no row is a first observation
        firsts: list[int] = []
        trajs = range(0)
        if not all_stepped and np.count_nonzero(rows.is_first):
            first_ids = env_ids[rows.is_first]  # dense rows: unique and sorted already
            firsts = (first_ids if rows.dense else np.unique(first_ids)).tolist()
            new = episodes.open(firsts, create=not self._late_episodes)
            if not multi and not self._late_episodes:
                trajs = self.trajectories.open_single(firsts)
        if multi:
            for e in np.unique(env_ids).tolist():
                if not episodes.is_open(e):
                    episodes.open([e])
        if all_stepped:
            episodes.length += 1
        else:
            episodes.length[stepped] += 1
        horizon = self.config.horizon
        if horizon is None:
            terminateds, truncateds, done_envs = rows.terminateds, rows.truncateds, rows.done_envs
        else:
            terminateds, truncateds, done_envs = episodes.horizon_flags(rows, stepped, horizon)
        agent_steps = np.zeros(len(episodes.length), dtype=np.int64) if multi else None
        obs = rows.obs
        if agent_steps is not None:
            if done_envs:
                terminateds, truncateds = episode_flags(rows, terminateds, truncateds, done_envs)
            self.book.add_rewards(rows, poll, agent_steps)
            fn = self.config.observation_fn
            if fn is not None:
                obs = self.book.observation_fn(
                    rows, fn, worker=self._runner, base_env=self.env, policies=self.policies
                )
        elif full:
            episodes.ret += rows.rewards
        else:
            episodes.ret[env_ids] += rows.rewards  # one row per sub-env
        block = self.blockable and rows.dense
        if not done_envs:
            done = self._none_done(n) if block else terminateds | truncateds
        else:
            done = terminateds | truncateds
            if not rows.dense or np.count_nonzero(done) != len(done_envs):  # dense: 1 row/env
                done |= np.isin(env_ids, list(done_envs))
        flags = (terminateds, truncateds, done)
        one, eps = self._one_pid, None
        full_one = full and bool(one)  # then per-env arrays copied are columns
        if one:  # every row is the one policy's
            if n:
                acted = self._act(one, None, rows, obs, flags, block, agent_steps, full_one)
                self.env.all_actions_sent()
                if firsts and self._late_episodes:  # the actions are out: made only now
                    episodes.create(new)
                    trajs = self.trajectories.open_single(firsts)
                eps = episodes.eps_id.copy() if full_one else None
                self._record(acted, poll, eps)
        else:
            for pid, idx in self._groups(rows):
                acted = self._act(pid, idx, rows, obs, flags, block, agent_steps, False)
                self._record(acted, poll, None)
            self.env.all_actions_sent()
        step_eps = eps if eps is not None and all_stepped else episodes.eps_id[stepped]
        if agent_steps is not None:
            for e in sorted(done_envs):
                self.book.close_open_agents(e, done_envs[e], poll, agent_steps)
            episodes.agent_steps += agent_steps
            self.recorder.env_steps(poll, stepped, step_eps, agent_steps[stepped])
        else:
            self.recorder.env_steps(poll, stepped, step_eps, 1)
        if firsts:
            if trajs:
                self.trajectories.own(trajs, DEFAULT_AGENT_ID, [episodes[e] for e in firsts])
            episodes.fire_start(firsts)
        if self._on_step:
            episodes.fire_step(stepped)
        if done_envs:
            self._finish(rows, done_envs)

    # -- parts of a step ------------------------------------------------------------------
    def _screen(self, rows: EnvRows, poll: int) -> EnvRows:
        """Restart or name failed sub-envs; check values (and, early on, spaces)."""
        restart = self.faults.restart
        if restart and len(rows):  # bad outputs are failures too: screen them
            bad = bad_rows(self.env, rows, full=bool(self._checks_left))
            if bad:
                rows = rows.without_envs(bad)
        if rows.errors:
            self._restart(rows.errors)
        if self._checks_left and (len(rows) or rows.extra_rewards):
            self._checks_left -= 1
            check_rows(self.env, rows)
        if not restart and self._check_finite and len(rows):
            check_finite(rows, poll, self.episodes.length)
        return rows

    def _restart(self, errors: Mapping[int, BaseException]) -> None:
        self.recorder.flush()  # a faulty episode's rows must be in the collectors to drop
        for env_id, exc in sorted(errors.items()):
            self.faults.on_error(env_id, exc)  # raises unless the sub-env may be restarted
            if not self.episodes.is_open(env_id):  # the reset itself failed: report it too
                self.episodes.open([env_id])
            self.episodes.end([env_id], faulty=True)
            self.env.try_restart(env_id)
            if self.config.check_env:  # a rebuilt env is checked again
                self._checks_left = max(self._checks_left, 2)

    def _none_done(self, n: int) -> np.ndarray:
        """A shared all-False ``done`` column of ``n`` rows (read-only)."""
        if len(self._not_done) != n:
            self._not_done = np.zeros(n, dtype=bool)
            self._not_done.flags.writeable = False
        return self._not_done

    def _groups(self, rows: EnvRows) -> list[tuple[str, np.ndarray]]:
        """Row indices per policy (several policies: each row's agent is mapped)."""
        groups: dict[str, list[int]] = {}
        for i, (e, a) in enumerate(zip(rows.env_ids.tolist(), rows.agent_ids)):
            groups.setdefault(self.episodes[e].policy_for(a), []).append(i)
        return [(pid, np.asarray(ix, dtype=np.int64)) for pid, ix in groups.items()]

    def _act(
        self,
        pid: str,
        idx: np.ndarray | None,
        rows: EnvRows,
        obs: Any,
        flags: tuple[np.ndarray, np.ndarray, np.ndarray],
        block: bool,
        agent_steps: np.ndarray | None,
        full: bool,
    ) -> tuple:
        """The rows of one policy up to the env actions: the agent pipeline, then the
        policy, the action pipeline and the env actions for the rows that are not done
        (``flags``: terminated, truncated, and done for every row of the poll; ``full``:
        row i is sub-env i). Returns what ``_record`` records once the actions are out."""
        t0 = time.perf_counter()
        pipe = self.pipes.agent[pid]
        connectors = len(pipe)
        terminateds, truncateds, done = flags
        env_ids, agent_ids, rewards, infos = rows.env_ids, rows.agent_ids, rows.rewards, rows.infos
        if idx is not None:  # this policy's rows of the poll
            members = idx.tolist()
            env_ids, rewards = env_ids[idx], rewards[idx]
            terminateds, truncateds, done = terminateds[idx], truncateds[idx], done[idx]
            agent_ids = tuple(agent_ids[i] for i in members)
            infos = [infos[i] for i in members]
        if rows.stacked:
            obs = obs if idx is None else take_rows(obs, idx)
        else:
            picked = obs if idx is None else [obs[i] for i in members]
            obs = stack_samples(pipe.input_space, picked)
        traj: np.ndarray | None = None  # single-agent: the trajectories are read when recorded
        agent_index: np.ndarray | int = 0
        if agent_steps is not None:
            traj, new, agent_index = self.book.trajectories(pid, env_ids, agent_ids)
            rewards = rewards + self.book.take_pending(env_ids, agent_ids)
            agent_steps += np.bincount(env_ids[~new], minlength=len(agent_steps))
        cols = {
            "obs": obs,
            "rewards": rewards,
            "terminateds": terminateds,
            "truncateds": truncateds,
            "infos": shared_infos(infos) if connectors else infos,
            "t": self.episodes.length.copy() if full else self.episodes.length[env_ids],
        }
        data = AgentData.trusted(env_ids, agent_ids, cols)
        if connectors:
            data = pipe(data)
        record = dict(data.columns)
        if agent_steps is not None:
            self.book.mark_closed(env_ids, agent_ids, done)
        self._secs["mean_raw_obs_processing_ms"] += time.perf_counter() - t0
        acted = (pid, record, env_ids, traj, agent_index, done, obs, block)
        # act for the rows that are not done (the shared none-done column: every row)
        inputs: Any = data
        where: np.ndarray | None = None
        if done is not self._not_done and np.count_nonzero(done):
            where = ~done
            if not np.count_nonzero(where):
                return (*acted, None, None)
            inputs, env_ids, agent_ids = live_rows(
                data.columns, env_ids, agent_ids, where, multi=self.multi
            )
        cfg = self.config
        outputs, env_actions = act(
            pid,
            self.policies[pid],
            self.pipes,
            inputs,
            env_ids,
            agent_ids,
            explore=cfg.explore,
            check=self._action_checks[pid],
            logged=getattr(rows, "logged_actions", None),
            timers=self.timers,
        )
        if cfg.record_env_actions:
            outputs["env_actions"] = env_actions
        t0 = time.perf_counter()
        self.env.send_actions(env_ids, agent_ids, env_actions)
        self._secs["mean_env_wait_ms"] += time.perf_counter() - t0
        return (*acted, outputs, where)

    def _record(self, acted: tuple, poll: int, eps: np.ndarray | None) -> None:
        """Record what ``_act`` did, once the actions are out (envs stepping elsewhere
        start meanwhile). ``eps``: the episode id of every sub-env when the rows are a full
        poll of one policy (row i is sub-env i), else None."""
        pid, record, env_ids, traj, agent_index, done, obs, block, outputs, where = acted
        if traj is None:
            of_env = self.trajectories.of_env
            traj = of_env.copy() if eps is not None else of_env[env_ids]
        record["eps_id"] = eps if eps is not None else self.episodes.eps_id[env_ids]
        record["env_id"] = env_ids
        record["agent_index"] = agent_index
        if self.config.keep_raw_obs:
            record["raw_obs"] = obs
        self.recorder.rows(pid, traj, poll, record, done, block=block)
        if outputs is not None:
            self.recorder.outputs(pid, outputs, where)

    def _finish(self, rows: EnvRows, done_envs: Mapping[int, tuple[bool, bool]]) -> None:
        """End finished episodes and reset their sub-envs (or start anew, soft horizon)."""
        cfg = self.config
        if self.faults.restart:  # a completed episode ends a sub-env's failure streak
            self.faults.episodes_completed(done_envs)
        ended = sorted(done_envs)
        self.episodes.end(ended)
        for e in ended:  # the soft horizon starts anew without resetting the env
            soft = cfg.soft_horizon and done_envs[e] == (False, True) and e not in rows.done_envs
            (self.env.soft_reset if soft else self.env.try_reset)(e)

    def _close_episodes(self, ended: list[tuple[int, Episode]], faulty: bool) -> None:
        """Episodes ended: close their trajectories; their rows count, or are dropped."""
        if self.multi:
            for e, _ in ended:
                self.book.close_episode(e)
        else:
            self.trajectories.close_single([e for e, _ in ended])
        if faulty:
            self.recorder.flush()
            for _, ep in ended:
                self.collectors.drop_episode(ep.episode_id)
            return
        ids, env_steps, agent_steps = [], 0, 0
        for e, ep in ended:
            ids.append(ep.episode_id)
            env_steps += ep.length
            if self.multi:
                agent_steps += int(self.episodes.agent_steps[e])
        self.collectors.finish_episodes(ids, env_steps, agent_steps if self.multi else None)
