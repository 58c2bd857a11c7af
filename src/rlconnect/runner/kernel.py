"""The step kernel: everything one poll's rows cause, written once.

``StepKernel.step(rows)`` takes the rows of one ``env.poll()`` (an ``EnvRows``, single- or
multi-agent, from any env adapter) through named phases, in order:

1. ``_screen``: sub-envs that raised or returned bad data are restarted or named
   (``SubEnvFaults``), non-finite values are caught (``check_finite``), the first polls
   are checked against the spaces (``check_env``);
2. ``_open_episodes``: first observations open episodes, lengths and returns advance, the
   horizon truncates (``rlconnect.episodes.EpisodeTracker``; the agent slots of
   multi-agent rows are read and updated once for every policy, ``AgentSlots.look_up``);
   what the kernel adds to the rows is derived once, as ``PollFacts``;
3. per policy, ``_act``: its rows of the poll's columns (an ``AgentData``) through the
   agent pipeline, then for the rows that go on the policy and the action pipeline
   (``act``), and the env actions sent; a ``PolicyStep`` each;
4. ``env.all_actions_sent()`` (an env that steps as one batch starts it here), then
   ``_chunk``: every policy's ``AgentData`` columns as its pipeline left them, with its
   outputs and bookkeeping, while the env steps;
5. ``_finish``: the episode callbacks, the end and reset of finished episodes;
6. ``_record``: the one write into the collectors: the chunks, what ended
   (``EpisodeEnds``, from the tracker) and the env steps taken.

Every poll takes these phases. How rows are kept is the collectors' business (one chunk
per poll, merged in bulk), when new episodes are made the episode tracker's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlconnect._timing import TIMED_MASK, WEIGHT
from rlconnect.batches.take import take_rows
from rlconnect.collectors import BatchMode, CountStepsBy, PolicyCollectorGroup
from rlconnect.collectors.group import EnvStepsTaken, RowChunk
from rlconnect.connectors import AgentData
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.checks import check_rows
from rlconnect.episodes import EpisodeHooks, EpisodeSettings, EpisodeTracker, TrajectoryIds
from rlconnect.episodes.tracker import episode_flags
from rlconnect.policy import Policy
from rlconnect.runner.acting import act, live_rows
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.faults import ActionCheck, SubEnvFaults, bad_rows, check_finite
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.pipelines import PolicyPipelines, check_agent_output
from rlconnect.runner.poll import PolicyStep, PollFacts
from rlconnect.spaces import stack_samples

__all__ = ["CHECKED_POLLS", "StepKernel"]

_clock = time.perf_counter  # (one global read per timing, not two lookups)
_NONE4 = (None, None, None, None)
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
        settings = EpisodeSettings(
            multi_agent=self.multi,
            policy_ids=pids,
            mapping_fn=mapping_fn,
            first_id=config.worker_index << 40,
            connector_resets=pipes.episode_resets,
            closing_inputs=pipes.closing_inputs,
        )
        self.episodes = EpisodeTracker(n, settings, hooks)
        self.faults = SubEnvFaults(
            n, restart=config.restart_failed_sub_environments, limit=config.sub_env_restart_limit
        )
        self._checks_left = CHECKED_POLLS if config.check_env else 0
        self._action_checks = {pid: ActionCheck(env, p, pid) for pid, p in policies.items()}
        self.hooks = hooks

    @property
    def trajectories(self) -> TrajectoryIds:
        """The ids and owners of every agent trajectory (the episodes')."""
        return self.episodes.trajectories

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
            steps = timers.steps
            timers.steps = steps + 1
            timers.weight = weight = WEIGHT[steps & TIMED_MASK]  # (see rlconnect._timing)
            t0 = clock() if weight else 0.0
            rows = env.poll()
            if weight:
                timers.seconds["mean_env_wait_ms"] += (clock() - t0) * weight
            self.step(rows)
        if self.multi:
            self.episodes.agents.write_open_returns()

    def step(self, rows: EnvRows) -> None:
        """Everything one poll's rows cause, phase by phase (see the module docstring)."""
        poll = self.poll_index
        self.poll_index += 1
        rows = self._screen(rows, poll)
        if not len(rows.env_ids) and not rows.extra_rewards:
            self._record(poll, [], None)  # (episodes the screen ended)
            return
        facts = self._open_episodes(rows, poll)
        steps = []
        for pid, idx in self._policy_rows(facts):
            steps.append(self._act(pid, idx, facts))
        weight = self.timers.weight  # (0.0 at most polls: no clock read, see PerfTimers)
        t0 = _clock() if weight else 0.0
        self.env.all_actions_sent()  # an env that steps as one batch starts here
        t1 = _clock() if weight else 0.0  # (the wait's end starts the recording)
        if facts.firsts:  # episodes begun at this poll are made once the actions are out
            self.episodes.actions_sent()
        chunks = []  # (a loop: a list comprehension is one more call)
        for policy_step in steps:
            chunks.append(self._chunk(policy_step, facts))
        t2 = _clock() if weight else 0.0
        taken = self._finish(facts)
        t3 = _clock() if weight else 0.0
        self._record(poll, chunks, taken)
        if weight:
            seconds = self.timers.seconds
            seconds["mean_env_wait_ms"] += (t1 - t0) * weight
            seconds["mean_recording_ms"] += (t2 - t1 + _clock() - t3) * weight

    # -- the phases of a step -------------------------------------------------------------
    def _screen(self, rows: EnvRows, poll: int) -> EnvRows:
        """Restart or name failed sub-envs; check values (and, early on, spaces)."""
        if not (self.faults.restart or rows.errors or self._checks_left):
            if self.config.check_finite and len(rows.env_ids):  # the common case
                check_finite(rows, poll, self.episodes.table.length)
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
            check_finite(rows, poll, self.episodes.table.length)
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
        lengths = self.episodes.table.length
        full = rows.dense and len(rows.env_ids) == len(lengths)
        firsts = self.episodes.begin(rows, full)
        horizon = self.config.horizon
        if horizon is None:
            terminateds, truncateds, done_envs = rows.terminateds, rows.truncateds, rows.done_envs
        else:
            limited = self.episodes.horizon_flags(rows, horizon)
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
                rows, done if some_done else None, policies=not self._one_pid
            )
            fn = self.config.observation_fn
            if fn is not None:
                obs = agents.observation_fn(
                    rows, fn, worker=self.hooks.runner, base_env=self.env, policies=self.policies
                )
        columns = {
            "obs": obs,
            "rewards": rewards,
            "terminateds": terminateds,
            "truncateds": truncateds,
            "infos": rows.infos,
            "t": lengths.copy() if full else lengths[rows.env_ids],
        }
        facts = (
            poll, rows, full, firsts, columns, done, some_done, done_envs, agent_steps, traj,
            agent_index, policies,
        )  # fmt: skip
        return tuple.__new__(PollFacts, facts)  # (``PollFacts(...)``: one more Python call)

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
        timers = self.timers
        weight = timers.weight  # (0.0: an untimed poll)
        t0 = _clock() if weight else 0.0
        step = self._agent_rows(pid, idx, facts)
        if weight:
            timers.seconds["mean_raw_obs_processing_ms"] += (_clock() - t0) * weight
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
            timers=timers,
        )
        if cfg.record_env_actions:
            outputs["env_actions"] = env_actions
        step.outputs = outputs
        t0 = _clock() if weight else 0.0
        self.env.send_actions(env_ids, agent_ids, env_actions)
        if weight:
            timers.seconds["mean_env_wait_ms"] += (_clock() - t0) * weight
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
        if not pipe.empty:
            data = pipe(data)
            check_agent_output(pid, pipe, data["obs"])
        return PolicyStep(
            pid, data, made, traj, 0 if agent_index is None else agent_index, done, obs
        )

    def _chunk(self, step: PolicyStep, facts: PollFacts) -> RowChunk:
        """One policy's rows as they are recorded: the columns the agent pipeline left,
        with the bookkeeping the policy did not see, and its outputs."""
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
            of_env = self.episodes.trajectories.of_env
            traj = of_env.copy() if whole else of_env[env_ids]
        eps = self.episodes.table.eps_id
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
        chunk = (step.pid, traj, record, last, step.outputs, step.acted)
        return tuple.__new__(RowChunk, chunk)  # (``RowChunk(...)``: one more Python call)

    def _record(self, poll: int, chunks: list[RowChunk], taken: EnvStepsTaken | None) -> None:
        """The step's one write into the collectors: the poll's rows (``chunks``), what
        ended since the last poll (closing rows, episodes finished or dropped) and the env
        steps ``taken``."""
        self.collectors.record(poll, chunks, self.episodes.take_ends(), taken)

    def _finish(self, facts: PollFacts) -> EnvStepsTaken:
        """The episode callbacks, and the end and reset of finished episodes (or a new
        start without a reset, soft horizon); returns the env steps the poll took."""
        rows, done_envs, episodes = facts.rows, facts.done_envs, self.episodes
        stepped = rows.stepped  # (ascending, unique)
        eps_id = episodes.table.eps_id
        if len(eps_id) == 1:  # (the log reads one sub-env's numbers at once: no copy)
            step_eps = eps_id
        else:
            step_eps = eps_id.copy() if len(stepped) == len(eps_id) else eps_id[stepped]
        taken: EnvStepsTaken = (stepped, step_eps, 1)
        agent_steps = facts.agent_steps
        if agent_steps is not None:
            if done_envs:  # (closing agents add their transitions: to a copy, see look_up)
                agent_steps = agent_steps.copy()
            for e in sorted(done_envs):
                episodes.agents.close_open_agents(e, done_envs[e], agent_steps)
            episodes.table.count_agent_steps(agent_steps)
            steps = agent_steps if len(stepped) == len(eps_id) else agent_steps[stepped]
            taken = (stepped, step_eps, steps)
        if facts.firsts:
            episodes.fire_start(facts.firsts)
        if self.hooks.on_step:
            episodes.fire_step(stepped)
        if not done_envs:
            return taken
        if self.faults.restart:  # a completed episode ends a sub-env's failure streak
            self.faults.episodes_completed(done_envs)
        ended = sorted(done_envs)
        episodes.end(ended)
        soft_horizon = self.config.soft_horizon
        for e in ended:  # the soft horizon starts anew without resetting the env
            soft = soft_horizon and done_envs[e] == (False, True) and e not in rows.done_envs
            (self.env.soft_reset if soft else self.env.try_reset)(e)
        return taken


def _rows_of(column: Any, idx: np.ndarray, members: list[int]) -> Any:
    """Rows ``idx`` of one poll column: a list of rows (infos, observations of several
    spaces) by position, an array or a nest of arrays by ``take_rows``."""
    if type(column) is list:
        return [column[i] for i in members]
    return take_rows(column, idx)
