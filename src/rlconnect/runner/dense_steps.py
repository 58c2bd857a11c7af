"""The single-agent fast path: dense polls processed as arrays and recorded in blocks.

A poll is *dense* when every sub-env gave one single-agent row, in env order, and none
raised (``EnvRows.dense``). With one policy, no per-step callback and no soft horizon, such
a poll needs no per-row Python: episode counters advance with array operations, the agent
and action pipelines and the policy run once on all rows, and the rows wait in a
:class:`DenseBlock` that reaches the collectors as one chunk (every ``BLOCK_POLLS`` polls,
and when the run stops) instead of one chunk per poll. Everything else (the first, checked
polls, sub-env errors, bad outputs, resets the env did by itself) goes through the general
step, after the block is flushed, so the collectors always look exactly as the general
step would have left them; the tests compare both paths batch for batch.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import SampleBatch
from rlconnect.collectors.policy_collector import EMPTY_INFO
from rlconnect.collectors.store import fill_rows, take_rows
from rlconnect.connectors import ActionData, AgentData
from rlconnect.envs.base import EnvRows
from rlconnect.runner.faults import ActionCheck, SubEnvFaults, bad_rows, call_policy

if TYPE_CHECKING:
    from rlconnect.episodes import Episode
    from rlconnect.runner.runner import EnvRunner

__all__ = ["BLOCK_POLLS", "DenseBlock", "DenseSteps"]

BLOCK_POLLS = 256  # polls buffered before the block goes to the collectors


class DenseBlock:
    """The rows of consecutive dense polls of one policy, handed over as one chunk."""

    __slots__ = ("events", "infos_empty", "last", "outputs", "polls", "records", "traj")

    def __init__(self) -> None:
        self.infos_empty = True  # every info so far was empty: one shared mapping for all
        self.records: list[dict[str, Any]] = []
        self.outputs: list[dict[str, Any] | None] = []
        self.traj: list[np.ndarray] = []
        self.last: list[np.ndarray] = []
        self.polls: list[int] = []
        self.events: list[tuple[int, np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return len(self.records)

    def flush(self, stepper: DenseSteps, pid: str) -> None:
        """Append the buffered rows and env steps to the collectors, then forget them."""
        if not self.records:
            return
        collector = stepper.r.collectors[pid]
        n = len(self.traj[0])
        keys = [tuple(rec) for rec in self.records]
        if keys.count(keys[0]) != len(keys):  # connectors changed columns mid-run: chunk by poll
            for rec, traj, poll, last, out in zip(
                self.records, self.traj, self.polls, self.last, self.outputs
            ):
                rec["infos"] = [i if i else EMPTY_INFO for i in rec["infos"]]
                collector.add_rows(traj, poll, rec, last=last)
                if out is not None:
                    collector.add_outputs(out)
        else:
            record: dict[str, Any] = {}
            for name in keys[0]:
                if name == "infos" and self.infos_empty:
                    record[name] = np.full(n * len(self), EMPTY_INFO, dtype=object)
                elif name == "infos":  # a list first: fromiter over a generator is slower
                    infos = chain.from_iterable(rec["infos"] for rec in self.records)
                    shared = [i if i else EMPTY_INFO for i in infos]
                    record[name] = np.fromiter(shared, dtype=object, count=n * len(self))
                else:
                    record[name] = _merge([rec[name] for rec in self.records], n)
            polls = np.repeat(np.asarray(self.polls, dtype=np.int64), n)
            collector.add_rows(
                np.concatenate(self.traj), polls, record, last=np.concatenate(self.last)
            )
            outputs = _merge_outputs(self.outputs, n)
            if outputs:
                collector.add_outputs(outputs)
        steps = [len(env_ids) for _, env_ids, _ in self.events]
        if sum(steps):  # one event per env step, in poll order
            stepper.r.collectors.add_env_steps(
                np.repeat(np.asarray([p for p, _, _ in self.events], dtype=np.int64), steps),
                np.concatenate([env_ids for _, env_ids, _ in self.events]),
                np.concatenate([eps for _, _, eps in self.events]),
                1,
            )
        self.__init__()  # type: ignore[misc]


def _merge(parts: list[Any], n: int) -> Any:
    """One column from its per-poll parts of ``n`` rows each (arrays, nests of arrays,
    lists, or scalars shared by a poll's rows)."""
    first = parts[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)
    if isinstance(first, list):
        return list(chain.from_iterable(parts))
    if isinstance(first, dict | tuple):
        return tree.map_structure(lambda *leaves: np.concatenate(leaves), *parts)
    if all(p == first for p in parts):
        return first  # the store repeats a scalar for every row
    return np.repeat(np.asarray(parts), n)


def _merge_outputs(outputs: list[dict[str, Any] | None], n: int) -> dict[str, Any]:
    """Policy outputs of every poll; polls where no row acted read as zeros."""
    names: dict[str, Any] = {}
    for out in outputs:
        if out is not None:
            for k, v in out.items():
                names.setdefault(k, v)
    merged = {}
    for name, template in names.items():
        parts = [
            out[name] if out is not None and name in out else fill_rows(template, None, n)
            for out in outputs
        ]
        merged[name] = _merge(parts, n)
    return merged


class DenseSteps:
    """The fast path's loop, mixed into the runner's :class:`Stepper` (which provides the
    state and the general step declared here)."""

    r: EnvRunner
    multi: bool
    poll_index: int
    episodes: list[Episode | None]
    ep_len: np.ndarray
    ep_ret: np.ndarray
    eps_of_env: np.ndarray
    traj_of_env: np.ndarray
    faults: SubEnvFaults
    _pids: list[str]
    _on_step: bool
    _checks_left: int
    _check_actions: dict[str, ActionCheck]
    _not_done_rows: np.ndarray | None

    def process(self, rows: EnvRows, poll: int) -> None:
        raise NotImplementedError  # the general step: Stepper.process

    def open_episodes(self, env_ids: list[int]) -> None:
        raise NotImplementedError  # provided by Stepper

    def _end_episode(self, env_id: int, *, faulty: bool = False) -> None:
        raise NotImplementedError  # provided by Stepper

    def _new_traj(self, env_id: int, agent_id: Any) -> int:
        raise NotImplementedError  # provided by Stepper

    def fire_episode_start(self, env_ids: list[int]) -> None:
        raise NotImplementedError  # provided by Stepper

    def dense_ok(self) -> bool:
        """Whether dense polls may take the fast path with this runner's configuration."""
        cfg = self.r.config
        return (
            self.r.env.polls_dense
            and not self.multi
            and len(self._pids) == 1
            and not cfg.soft_horizon
            and not self._on_step
            and not self._checks_left
        )

    def run_dense(self, mode: str, target: int, count_by: str) -> None:
        """Step until a batch is ready (or a poll needs the general step), then flush."""
        r = self.r
        group, timers = r.collectors, r.timers
        pid = self._pids[0]
        block = DenseBlock()
        clock = time.perf_counter
        truncating = mode == "truncate_episodes"
        have = group.env_steps() if count_by == "env_steps" else group.agent_steps()
        env = r.env
        restart = self.faults.restart
        secs = [0.0, 0.0, 0.0, 0.0]
        try:
            while True:
                if truncating:
                    if have >= target:
                        break
                elif group.ready(mode, target, count_by):
                    break
                t0 = clock()
                rows = env.poll()
                secs[0] += clock() - t0
                poll = self.poll_index
                self.poll_index += 1
                timers.steps += 1
                if not rows.dense or (restart and bad_rows(env, rows, full=False)):
                    block.flush(self, pid)
                    self.process(rows, poll)  # names, restarts or drops what went wrong
                    return
                self._dense_step(pid, rows, poll, block, secs)
                have += len(rows.stepped)
                if len(block) >= BLOCK_POLLS:  # bounded memory: small arrays merged often
                    block.flush(self, pid)
        finally:
            block.flush(self, pid)
            for stage, s in zip(_STAGES, secs):
                timers.add(stage, s)

    def _dense_step(
        self, pid: str, rows: EnvRows, poll: int, block: DenseBlock, secs: list[float]
    ) -> None:
        r, cfg = self.r, self.r.config
        clock = time.perf_counter
        t0 = clock()
        env_ids, agent_ids, stepped = rows.env_ids, rows.agent_ids, rows.stepped
        n = len(env_ids)
        ep_len = self.ep_len
        firsts: list[int] = []
        if len(stepped) == n:  # no sub-env reset: the common poll
            ep_len += 1
            eps = self.eps_of_env.copy()
            step_eps = eps
        else:  # a dense poll's rows are either steps or first observations
            firsts = np.flatnonzero(rows.is_first).tolist()
            self.open_episodes(firsts)
            for e in firsts:
                self.traj_of_env[e] = self._new_traj(e, agent_ids[e])
            ep_len[stepped] += 1
            eps = self.eps_of_env.copy()
            step_eps = eps[stepped]
        terminateds, truncateds = rows.terminateds, rows.truncateds
        done_envs = rows.done_envs
        if cfg.horizon is not None and len(stepped):
            over = stepped[ep_len[stepped] >= cfg.horizon]
            if len(over):
                done_envs = dict(done_envs)
                for e in over.tolist():
                    done_envs.setdefault(e, (False, True))
                truncateds = truncateds.copy()
                truncateds[over] = True
        self.ep_ret += rows.rewards
        pipe = r._agent_pipes[pid]
        connectors = len(pipe)
        infos: Sequence[Mapping[str, Any]] = rows.infos
        if connectors:  # connectors see what the general step shows them
            infos = [i if i else EMPTY_INFO for i in infos]
        if block.infos_empty and any(infos):
            block.infos_empty = False
        cols = {
            "obs": rows.obs,
            "rewards": rows.rewards,
            "terminateds": terminateds,
            "truncateds": truncateds,
            "infos": infos,
            "t": ep_len.copy(),
        }
        data = AgentData.trusted(env_ids, agent_ids, cols)
        if connectors:
            data = pipe(data)
        record = dict(data.columns)
        record["eps_id"] = eps
        record["env_id"] = env_ids
        record["agent_index"] = 0
        if cfg.keep_raw_obs:
            record["raw_obs"] = rows.obs
        done = terminateds | truncateds if done_envs else self._not_done(n)
        block.records.append(record)
        block.traj.append(self.traj_of_env.copy())
        block.polls.append(poll)
        block.last.append(done)
        block.outputs.append(None)
        block.events.append((poll, stepped, step_eps))
        secs[1] += clock() - t0
        if not done_envs:
            self._dense_act(pid, data, env_ids, agent_ids, None, n, block, secs)
        elif len(done_envs) < n:
            act = ~done
            ai = np.flatnonzero(act)
            inputs = {k: take_rows(v, ai) for k, v in data.columns.items() if k != "infos"}
            self._dense_act(pid, inputs, env_ids[ai], agent_ids[: len(ai)], act, n, block, secs)
        if firsts:
            self.fire_episode_start(firsts)
        for e in sorted(done_envs):
            self._end_episode(e)
            r.env.try_reset(e)
        if done_envs and self.faults.restart:
            self.faults.episodes_completed(done_envs)

    def _not_done(self, n: int) -> np.ndarray:
        """A shared all-False ``done`` column of ``n`` rows (read-only)."""
        cached = self._not_done_rows
        if cached is None or len(cached) != n:
            cached = np.zeros(n, dtype=bool)
            cached.flags.writeable = False
            self._not_done_rows = cached
        return cached

    def _dense_act(
        self,
        pid: str,
        inputs: Any,
        act_env: np.ndarray,
        act_agents: tuple,
        where: np.ndarray | None,
        n: int,
        block: DenseBlock,
        secs: list[float],
    ) -> None:
        """Policy, action pipeline and send for the acting rows (``where``; None: all)."""
        r, cfg = self.r, self.r.config
        clock = time.perf_counter
        t1 = clock()
        actions, state_outs, fetches = call_policy(
            r.policies[pid], pid, inputs, cfg.explore, act_env, act_agents
        )
        t2 = clock()
        outputs = {"actions": actions, **fetches}
        for i, s in enumerate(state_outs):
            outputs[SampleBatch.state_out(i)] = s
        out = ActionData.trusted(act_env, act_agents, dict(outputs))
        agent_pipe = r._agent_pipes[pid]
        if len(agent_pipe):
            agent_pipe.on_policy_output(out)
        env_actions = r._action_pipes[pid](out)["actions"]
        self._check_actions[pid](env_actions, act_env, act_agents)  # never a bad env step
        if cfg.record_env_actions:
            outputs["env_actions"] = env_actions
        if where is not None:
            outputs = {k: fill_rows(v, where, n) for k, v in outputs.items()}
        block.outputs[-1] = outputs
        t3 = clock()
        r.env.send_actions(act_env, act_agents, env_actions)
        secs[2] += t2 - t1
        secs[3] += t3 - t2
        secs[0] += clock() - t3


_STAGES = (
    "mean_env_wait_ms",
    "mean_raw_obs_processing_ms",
    "mean_inference_ms",
    "mean_action_processing_ms",
)
