"""The step kernel: everything one poll's rows cause, written once.

``StepKernel.step(rows)`` takes the rows of one ``env.poll()`` (single- or multi-agent,
from any env adapter) through named phases, in order:

1. ``_screen``: sub-envs that raised or returned bad data are restarted or named
   (``SubEnvFaults``), non-finite values are caught (``check_finite``), the first polls
   are checked against the spaces (``check_env``);
2. ``_open_episodes``: first observations open episodes, lengths and returns advance, the
   horizon truncates (``EpisodeTracker``; the agent slots of multi-agent rows are read
   and updated once for every policy, ``AgentTracker.look_up``); what the rows say is
   derived once, as ``PollFacts``: the poll's columns and the kernel's own per row;
3. per policy, ``_act``: its rows of the poll's columns (an ``AgentData``) through the
   agent pipeline, then for the rows that go on the policy and the action pipeline
   (``act``), and the env actions sent; a ``PolicyStep`` each;
4. ``env.all_actions_sent()`` (an env that steps as one batch starts it here), then
   ``_record`` of every policy's ``AgentData`` columns as its pipeline left them, with
   its outputs and bookkeeping (``PolicyCollector``), while the env steps;
5. ``_finish``: the env-step log, the episode callbacks, the end and reset of finished
   episodes.

Every poll takes these phases. How rows are kept is the collectors' business (one chunk
per poll, merged in bulk), when new episodes are made the episode tracker's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect.batches.take import take_rows
from rlconnect.collectors import BatchMode, CountStepsBy, PolicyCollectorGroup
from rlconnect.connectors import AgentData
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.checks import check_rows
from rlconnect.policy import Policy
from rlconnect.runner.acting import act, live_rows
from rlconnect.runner.bookkeeping import (
    EpisodeHooks,
    EpisodeTracker,
    TrajectoryIds,
    episode_flags,
)
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.faults import ActionCheck, SubEnvFaults, bad_rows, check_finite
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.pipelines import PolicyPipelines, check_agent_output
from rlconnect.spaces import stack_samples

__all__ = ["CHECKED_POLLS", "StepKernel"]

_clock = time.perf_counter  # (one global read per timing, not two lookups)
_NONE4 = (None, None, None, None)
CHECKED_POLLS = 3  # check_env inspects this many polls (and the first ones after a restart)
#: ``complete_episodes`` without a horizon: an episode longer than this (or 100 batches)
#: is taken for one that never ends; checked every ``ENDLESS_CHECK_EVERY`` polls
ENDLESS_EPISODE_STEPS = 1_000_000
ENDLESS_CHECK_EVERY = 1024


class PollFacts:
    """What one poll's rows say, derived once and read by every phase of its step.

    ``columns`` are the poll's rows as the agent pipelines take them: each policy's
    ``AgentData`` holds its rows of these columns (a policy that takes every row holds
    the dict itself), and what the pipeline leaves in it is what gets recorded."""

    __slots__ = (
        "agent_index",
        "agent_steps",
        "columns",
        "done",
        "done_envs",
        "firsts",
        "full",
        "policies",
        "poll",
        "rows",
        "some_done",
        "traj",
    )

    def __init__(
        self,
        poll: int,
        rows: EnvRows,
        full: bool,
        firsts: list[int],
        columns: dict[str, Any],
        done: np.ndarray,
        some_done: bool,
        done_envs: Mapping[int, tuple[bool, bool]],
        agent_steps: np.ndarray | None,
        traj: np.ndarray | None,
        agent_index: np.ndarray | None,
        policies: np.ndarray | None,
    ) -> None:
        self.poll = poll  #: the poll's number
        self.rows = rows  #: the rows, screened
        self.full = full  #: row i is sub-env i (single-agent rows of every sub-env)
        self.firsts = firsts  #: sub-envs whose episode begins at this poll
        #: per row: ``obs`` (``observation_fn`` applied), ``rewards`` (multi-agent: with
        #: those held for it), ``terminateds``, ``truncateds`` (by the horizon too),
        #: ``infos`` and ``t`` (the episode's length)
        self.columns = columns
        self.done = done  #: per row: done (it does not act)
        self.some_done = some_done  #: whether any row is done
        self.done_envs = done_envs  #: sub-envs whose episode ends, with its flags
        #: multi-agent (else None): transitions each sub-env completed; per row: its
        #: trajectory id, agent index and policy (``AgentTracker.look_up``)
        self.agent_steps = agent_steps
        self.traj = traj
        self.agent_index = agent_index
        self.policies = policies


class PolicyStep:
    """One policy's part of a poll: its rows as the agent pipeline made them (``data``:
    what the policy gets, then, with the bookkeeping added, what is recorded), the
    flag and length columns the kernel made (``made``: recorded as one number each when
    every row shares it and no connector replaced them), then what the policy answered
    (``outputs``; ``acted``: the rows that acted, None: all)."""

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
        made: tuple[Any, Any, Any],
        traj: np.ndarray | None,
        agent_index: np.ndarray | int,
        done: np.ndarray,
        obs: Any,
    ) -> None:
        self.pid = pid
        self.data = data
        self.made = made  #: ``terminateds``, ``truncateds`` and ``t`` as the kernel made them
        self.traj = traj  #: trajectory ids (None: single-agent, read when recorded)
        self.agent_index = agent_index
        self.done = done
        self.obs = obs
        self.outputs: dict[str, Any] | None = None
        self.acted: np.ndarray | None = None


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
        if config.equal_rows:  # each sub-env's rows in a batch (see PolicyCollectorGroup)
            if getattr(env, "fragment_envs", n) != n:
                raise ValueError(
                    "RunnerConfig(equal_rows=True) needs sub-envs that each give rows; an "
                    "external env's lanes are concurrent episodes, not sub-envs: set "
                    "equal_rows=False"
                )
            collectors.rows_per_env = config.rollout_fragment_length
        self.multi = env.is_multi_agent
        self._one_env = n == 1
        self.poll_index = 0
        pids = list(policies)
        self._one_pid = pids[0] if len(pids) == 1 else ""  # "": several
        self.trajectories = TrajectoryIds(n)
        self.episodes = EpisodeTracker(
            n,
            multi_agent=self.multi,
            single_policy=bool(self._one_pid),
            mapping_fn=mapping_fn,
            first_id=config.worker_index << 40,
            hooks=hooks,
            trajectories=self.trajectories,
            collectors=collectors,
            policy_ids=pids,
            connector_resets=pipes.episode_resets,
        )
        self.faults = SubEnvFaults(
            n, restart=config.restart_failed_sub_environments, limit=config.sub_env_restart_limit
        )
        self._checks_left = CHECKED_POLLS if config.check_env else 0
        self._action_checks = {pid: ActionCheck(env, p, pid) for pid, p in policies.items()}
        self.hooks = hooks

    # -- the loop -------------------------------------------------------------------------
    def run_until(self, mode: BatchMode, target: int, count_by: CountStepsBy) -> None:
        """Poll and step until the collectors can build a batch of ``target`` steps."""
        group, env, timers, clock = self.collectors, self.env, self.timers, _clock
        whole = mode is BatchMode.COMPLETE_EPISODES
        by_total = not whole and group.rows_per_env is None  # (else: rows per sub-env)
        endless_check = whole and self.config.horizon is None
        while True:
            if by_total:  # (inline: read at every poll)
                log = group.env_step_log
                have = log.size if count_by is CountStepsBy.ENV_STEPS else log.agent_steps
                if have >= target:
                    break
            elif group.ready(mode, target, count_by):
                break
            elif endless_check and self.poll_index % ENDLESS_CHECK_EVERY == 0:
                self.episodes.refuse_endless(max(ENDLESS_EPISODE_STEPS, 100 * target))
            t0 = clock()
            rows = env.poll()
            timers.seconds["mean_env_wait_ms"] += clock() - t0
            timers.steps += 1
            self.step(rows)
        if self.multi:
            self.episodes.agents.write_open_returns()

    def step(self, rows: EnvRows) -> None:
        """Everything one poll's rows cause, phase by phase (see the module docstring)."""
        poll = self.poll_index
        self.poll_index += 1
        rows = self._screen(rows, poll)
        if not len(rows.env_ids) and not rows.extra_rewards:
            return
        facts = self._open_episodes(rows, poll)
        steps = []
        for pid, idx in self._policy_rows(facts):
            steps.append(self._act(pid, idx, facts))
        t0 = _clock()
        self.env.all_actions_sent()  # an env that steps as one batch starts here
        self.timers.seconds["mean_env_wait_ms"] += _clock() - t0
        if facts.firsts:  # episodes begun at this poll are made once the actions are out
            self.episodes.actions_sent()
        t0 = _clock()
        for policy_step in steps:
            self._record(policy_step, facts)
        self.timers.seconds["mean_recording_ms"] += _clock() - t0
        self._finish(facts)

    # -- the phases of a step -------------------------------------------------------------
    def _screen(self, rows: EnvRows, poll: int) -> EnvRows:
        """Restart or name failed sub-envs; check values (and, early on, spaces)."""
        if not (self.faults.restart or rows.errors or self._checks_left):
            if self.config.check_finite and len(rows.env_ids):  # the common case
                check_finite(rows, poll, self.episodes.length)
            return rows
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
        if not restart and self.config.check_finite and len(rows):
            check_finite(rows, poll, self.episodes.length)
        return rows

    def _restart(self, errors: Mapping[int, BaseException]) -> None:
        for env_id, exc in sorted(errors.items()):
            self.faults.on_error(env_id, exc)  # raises unless the sub-env may be restarted
            if not self.episodes.is_open(env_id):  # the reset itself failed: report it too
                self.episodes.open([env_id])
            self.episodes.end([env_id], faulty=True)
            self.env.try_restart(env_id)
            if self.config.check_env:  # a rebuilt env is checked again
                self._checks_left = max(self._checks_left, 2)

    def _open_episodes(self, rows: EnvRows, poll: int) -> PollFacts:
        """Episodes begin and advance; the rows' flags (horizon included), what ends."""
        full = rows.dense and len(rows.env_ids) == len(self.episodes.length)
        firsts = self.episodes.begin(rows, full)
        horizon = self.config.horizon
        if horizon is None:
            terminateds, truncateds, done_envs = rows.terminateds, rows.truncateds, rows.done_envs
        else:
            limited = self.episodes.horizon_flags(rows, rows.stepped, horizon)
            terminateds, truncateds, done_envs = limited
        if self.multi and done_envs:  # final rows of an episode ended by ``__all__``
            terminateds, truncateds = episode_flags(rows, terminateds, truncateds, done_envs)
        if (rows.dense or rows.plain) and not done_envs:  # no episode ends, no flag is set
            done, some_done = terminateds, False
        else:
            done = terminateds | truncateds
            if done_envs and (not rows.dense or np.count_nonzero(done) != len(done_envs)):
                done |= np.isin(rows.env_ids, list(done_envs))  # (dense: one row per sub-env)
            some_done = bool(done_envs) or bool(np.count_nonzero(done))
        obs, rewards, agent_steps, traj, agent_index, policies = rows.obs, rows.rewards, *_NONE4
        if self.multi:
            agents = self.episodes.agents
            agent_steps, traj, agent_index, rewards, policies = agents.look_up(
                rows, done if some_done else None, poll, policies=not self._one_pid
            )
            fn = self.config.observation_fn
            if fn is not None:
                obs = agents.observation_fn(
                    rows, fn, worker=self.hooks.runner, base_env=self.env, policies=self.policies
                )
        lengths = self.episodes.length
        columns = {
            "obs": obs,
            "rewards": rewards,
            "terminateds": terminateds,
            "truncateds": truncateds,
            "infos": rows.infos,
            "t": lengths.copy() if full else lengths[rows.env_ids],
        }
        return PollFacts(
            poll, rows, full, firsts, columns, done, some_done, done_envs, agent_steps, traj,
            agent_index, policies,
        )  # fmt: skip

    def _policy_rows(self, facts: PollFacts) -> list[tuple[str, np.ndarray | None]]:
        """Each policy's rows of the poll (None: every row; one policy maps no rows)."""
        if self._one_pid:
            return [(self._one_pid, None)] if len(facts.rows.env_ids) else []
        rows = facts.rows
        if not len(rows.env_ids):
            return []
        pol = facts.policies
        if pol is None:  # single-agent rows: each sub-env's episode maps its agent
            groups: dict[str, list[int]] = {}
            for i, (e, a) in enumerate(zip(rows.env_ids.tolist(), rows.agent_ids)):
                groups.setdefault(self.episodes[e].policy_for(a), []).append(i)
            return [(pid, np.asarray(ix, dtype=np.int64)) for pid, ix in groups.items()]
        pids = self.episodes.agents.policy_ids
        if not np.count_nonzero(pol != pol[0]):
            return [(pids[pol[0]], None)]
        found, first = np.unique(pol, return_index=True)  # in order of first row
        return [(pids[k], np.flatnonzero(pol == k)) for k in found[np.argsort(first)].tolist()]

    def _act(self, pid: str, idx: np.ndarray | None, facts: PollFacts) -> PolicyStep:
        """The rows ``idx`` of policy ``pid`` (None: all) through its agent pipeline; then,
        for the rows that are not done, the policy and the action pipeline, and the env
        actions sent."""
        t0 = _clock()
        step = self._agent_rows(pid, idx, facts)
        self.timers.seconds["mean_raw_obs_processing_ms"] += _clock() - t0
        policy = self.policies[pid]
        inputs: Any = step.data
        env_ids, agent_ids = step.data.env_ids, step.data.agent_ids
        if facts.some_done and np.count_nonzero(step.done):  # act for the rows that go on
            step.acted = ~step.done
            if not np.count_nonzero(step.acted):
                return step
            inputs, env_ids, agent_ids = live_rows(
                step.data.columns, env_ids, agent_ids, step.acted, multi=self.multi
            )
        cfg = self.config
        outputs, env_actions = act(
            pid,
            policy,
            self.pipes,
            inputs,
            env_ids,
            agent_ids,
            explore=cfg.explore,
            check=self._action_checks[pid],
            logged=getattr(facts.rows, "logged_actions", None),
            timers=self.timers,
        )
        if cfg.record_env_actions:
            outputs["env_actions"] = env_actions
        step.outputs = outputs
        t0 = _clock()
        self.env.send_actions(env_ids, agent_ids, env_actions)
        self.timers.seconds["mean_env_wait_ms"] += _clock() - t0
        return step

    def _agent_rows(self, pid: str, idx: np.ndarray | None, facts: PollFacts) -> PolicyStep:
        """Policy ``pid``'s rows ``idx`` (None: all) of the poll's columns, through its
        agent pipeline."""
        rows, pipe = facts.rows, self.pipes.agent[pid]
        columns, env_ids, agent_ids = facts.columns, rows.env_ids, rows.agent_ids
        done, traj, agent_index = facts.done, facts.traj, facts.agent_index
        if idx is not None:  # this policy's rows of the poll
            members = idx.tolist()
            columns = {name: _rows_of(column, idx, members) for name, column in columns.items()}
            env_ids, done = env_ids[idx], done[idx]
            agent_ids = tuple(agent_ids[i] for i in members)
            if traj is not None and agent_index is not None:
                traj, agent_index = traj[idx], agent_index[idx]
        obs = columns["obs"]
        if type(obs) is list:  # rows of several spaces (or ``observation_fn``'s): stacked
            obs = columns["obs"] = stack_samples(pipe.input_space, obs)
        made = (columns["terminateds"], columns["truncateds"], columns["t"])
        data = AgentData.trusted(env_ids, agent_ids, columns)
        if len(pipe):
            data = pipe(data)
            check_agent_output(pid, pipe, data["obs"])
        return PolicyStep(
            pid, data, made, traj, 0 if agent_index is None else agent_index, done, obs
        )

    def _record(self, step: PolicyStep, facts: PollFacts) -> None:
        """Record one policy's rows and outputs, once every action is out (an env that
        steps elsewhere starts meanwhile): the columns the agent pipeline left, with the
        bookkeeping the policy did not see."""
        env_ids = step.data.env_ids
        whole = facts.full and len(env_ids) == len(facts.rows.env_ids)
        record = step.data.columns  # (the policy has acted: its inputs are recorded as is)
        record["weights_seq"] = self.policies[step.pid].weights_seq  # one int for the chunk
        terminateds, truncateds, t = step.made  # (a connector may have replaced them)
        if not facts.some_done:  # no flag is set: one False for all rows of the chunk
            if record["terminateds"] is terminateds:
                record["terminateds"] = False
            if record["truncateds"] is truncateds:
                record["truncateds"] = False
        traj = step.traj
        if traj is None:
            of_env = self.trajectories.of_env
            traj = of_env.copy() if whole else of_env[env_ids]
        eps = self.episodes.eps_id
        if self._one_env:  # every row is of sub-env 0's one episode: one number each
            record["eps_id"], record["env_id"] = int(eps[0]), 0
            if record["t"] is t:
                record["t"] = int(t[0])
        else:
            record["eps_id"] = eps.copy() if whole else eps[env_ids]
            record["env_id"] = env_ids
        record["agent_index"] = step.agent_index
        if self.config.keep_raw_obs:
            record["raw_obs"] = step.obs
        last = step.done if facts.some_done else False
        self.collectors.collectors[step.pid].add_rows(
            traj, facts.poll, record, last, outputs=step.outputs, acted=step.acted
        )

    def _finish(self, facts: PollFacts) -> None:
        """The env-step log, the episode callbacks, and the end and reset of finished
        episodes (or a new start without a reset, soft horizon)."""
        rows, done_envs, episodes, poll = facts.rows, facts.done_envs, self.episodes, facts.poll
        stepped = rows.stepped  # (ascending, unique)
        all_stepped = len(stepped) == len(episodes.eps_id)
        step_eps = episodes.eps_id.copy() if all_stepped else episodes.eps_id[stepped]
        agent_steps, agents = facts.agent_steps, episodes.agents
        if agent_steps is not None:
            if done_envs:  # (closing agents add their transitions: to a copy, see look_up)
                agent_steps = agent_steps.copy()
            for e in sorted(done_envs):
                agents.close_open_agents(e, done_envs[e], poll, agent_steps)
            episodes.count_agent_steps(agent_steps)
            steps_taken = agent_steps if all_stepped else agent_steps[stepped]
            self.collectors.env_step_log.add(poll, stepped, step_eps, steps_taken)
        else:
            self.collectors.env_step_log.add(poll, stepped, step_eps, 1)
        if facts.firsts:
            episodes.fire_start(facts.firsts)
        if self.hooks.on_step:
            if agent_steps is not None:  # the episodes' returns, as the callbacks see them
                for e in stepped.tolist():
                    agents.write_returns(e, episodes[e])
            episodes.fire_step(stepped)
        if not done_envs:
            return
        if self.faults.restart:  # a completed episode ends a sub-env's failure streak
            self.faults.episodes_completed(done_envs)
        ended = sorted(done_envs)
        episodes.end(ended)
        soft_horizon = self.config.soft_horizon
        for e in ended:  # the soft horizon starts anew without resetting the env
            soft = soft_horizon and done_envs[e] == (False, True) and e not in rows.done_envs
            (self.env.soft_reset if soft else self.env.try_reset)(e)


def _rows_of(column: Any, idx: np.ndarray, members: list[int]) -> Any:
    """Rows ``idx`` of one poll column: a list of rows (infos, observations of several
    spaces) by position, an array or a nest of arrays by ``take_rows``."""
    if type(column) is list:
        return [column[i] for i in members]
    return take_rows(column, idx)
