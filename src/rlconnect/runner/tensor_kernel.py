"""The step of the tensor path: batched tensor simulators, one round at a time.

``TensorKernel`` drives a ``TensorEnv`` (``rlconnect.envs.tensor_envs``) through the same
phases as ``StepKernel`` does for numpy polls, on torch tensors on the env's device and
without reading the host in a round:

1. act, per policy: its rows of the last round's pipeline output go to the policy and the
   action pipeline (``act``, as on numpy); the env actions of every agent are stacked;
2. step: one step of every sub-env (``env.step``);
3. open/advance episodes: lengths, returns and the horizon as masked tensor updates
   (``TensorEpisodes``); the finite check is kept on the device, read once per sample;
4. per policy, the agent pipeline on the step's rows (final observations where an
   episode ended): what is recorded as ``new_obs`` and ``rewards``; then the round's row
   of every column is written in place (``TensorStore``);
5. finish: ended episodes are logged and new ones begin (``TensorEpisodes.end``), their
   connectors' per-episode state dropped (``reset_where``), the env restarts them, and
   the agent pipeline runs on their first observations (``mask`` = the ended rows).

A policy's rows have one layout for the whole run (``PolicyRows``): the agents mapped to
it, agent-major, each with all N sub-envs; so every column is a fixed-shape tensor and a
batch is a view of ``[T, R]`` storage. Episode metrics and callbacks come once per
``sample()``, from the one read of ``TensorEpisodes.read_back``, which also carries the
deferred checks (the env's, the finite check, the agent and learner connectors').

Rows that are no transition are recorded like the others and dropped when the batch is
built, from what the read says. A NEXT_STEP env's reset steps (the round after its
sub-env ended: the action was ignored, the observation is the new episode's first) are
made up for: the read tells each sub-env's deficit, the kernel polls the extra rounds
that cover it and reads them once more, and ``NextStepRows`` hands out exactly
``rollout_fragment_length`` rows per sub-env, carrying the rest on the device into the
next sample (so such a sample makes two reads where a sub-env reset). With
``restart_failed_sub_environments``, a faulty sub-env's rows from its bad round on are
dropped, its episode reported faulty (``on_episode_end`` too, as on numpy), and the
sub-env reset by mask once per sample, its reset observations checked with the next
sample's read; such a batch is gathered from the store, its sub-envs' rows unequal.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
import torch

from rlconnect.batches import SampleBatch
from rlconnect.batches.columns import NEXT_INPUTS_OF
from rlconnect.collectors import BatchMode, CountStepsBy
from rlconnect.collectors.tensor_carry import NextStepRows, rows_meta
from rlconnect.collectors.tensor_infos import TensorInfos
from rlconnect.collectors.tensor_store import TensorStore
from rlconnect.connectors import AgentData, ConnectorPipeline
from rlconnect.envs.tensor_envs import Nest, TensorEnv, map_nest, where_rows
from rlconnect.episodes.hooks import EpisodeHooks
from rlconnect.episodes.tensor_episodes import EndedEpisodes, SampleRead, TensorEpisodes
from rlconnect.errors import EnvCheckError
from rlconnect.policy import Policy
from rlconnect.runner.acting import act
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.faults import SubEnvFaults
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.pipelines import PolicyPipelines
from rlconnect.runner.poll import PolicyStep

__all__ = ["PolicyRows", "TensorKernel", "TensorSample", "refuse_tensor_features"]

_clock = time.perf_counter


class PolicyRows:
    """The fixed row layout of one policy: ``agents`` (indices into the env's agents),
    each with every sub-env, agent-major; ``env_ids`` and ``agent_index`` (R,) tensors,
    and ``blank``: the zero columns of first rows (no reward, no end, step 0)."""

    def __init__(self, agents: list[int], agent_ids: tuple, num_envs: int, device: Any) -> None:
        self.agents = agents
        self.num_envs = num_envs
        self.rows = len(agents) * num_envs
        arange = torch.arange(num_envs, dtype=torch.int64, device=device)
        self.env_ids = arange.repeat(len(agents))
        index = torch.tensor(agents, dtype=torch.int64, device=device)
        self.agent_index = index.repeat_interleave(num_envs)
        self.agent_ids = tuple(agent_ids[a] for a in agents for _ in range(num_envs))
        #: the zero columns of an episode's first rows, made once (read only)
        self.blank = _blank_rows(self.rows, device)

    def stack(self, by_agent: Mapping[Any, Nest], names: tuple) -> Nest:
        """This policy's rows of per-agent tensors ``{agent id: (N, ...)}``."""
        parts = [by_agent[names[a]] for a in self.agents]
        if len(parts) == 1:
            return parts[0]
        return map_nest(lambda *leaves: torch.cat(leaves), *parts)

    def rows_of(self, per_env: torch.Tensor) -> torch.Tensor:
        """A per-sub-env tensor (N, ...) repeated for each of this policy's agents."""
        return per_env if len(self.agents) == 1 else per_env.repeat(len(self.agents))

    def split(self, actions: Nest, names: tuple) -> dict[Any, Nest]:
        """Env actions (R, ...) back to ``{agent id: (N, ...)}`` (views)."""
        if len(self.agents) == 1:
            return {names[self.agents[0]]: actions}
        n = self.num_envs
        return {
            names[a]: map_nest(lambda x, i=i: x[i * n : (i + 1) * n], actions)
            for i, a in enumerate(self.agents)
        }


@attrs.frozen
class TensorSample:
    """What ``TensorKernel.sample`` hands the runner: the batches by policy, the env
    steps they hold, and the values of the learner checks ``learn`` returned, read with
    the sample's one read (None when the learner pipelines did not run on these batches:
    the runner then runs them itself)."""

    batches: dict[str, SampleBatch]
    env_steps: int
    learner_flags: list[bool] | None


class TensorKernel:
    """The tensor path's loop state and its rounds (see the module docstring)."""

    def __init__(
        self,
        env: TensorEnv,
        policies: Mapping[str, Policy],
        pipes: PolicyPipelines,
        config: RunnerConfig,
        timers: PerfTimers,
        hooks: EpisodeHooks,
        agent_policy: Mapping[Any, str],
    ) -> None:
        self.env, self.policies, self.pipes, self.config = env, policies, pipes, config
        self.timers, self.hooks = timers, hooks
        n, names = env.num_envs, env.agents
        self.layouts = {
            pid: PolicyRows(
                [i for i, a in enumerate(names) if agent_policy[a] == pid], names, n, env.device
            )
            for pid in policies
        }
        self.layouts = {pid: rows for pid, rows in self.layouts.items() if rows.rows}
        per_poll = n if config.count_steps_by is CountStepsBy.ENV_STEPS else n * len(names)
        self.rounds = math.ceil(config.rollout_fragment_length * n / per_poll)
        self.episodes = TensorEpisodes(
            n,
            names,
            env.device,
            first_id=config.worker_index << 40,
            policy_of=agent_policy.__getitem__,
        )
        self.poll_index = 0
        self._inputs: dict[str, dict[str, Any]] = {}  # per policy: what it acts on next
        #: per policy: its rows' store, written over by every sample (``build`` copies out)
        self._stores = {
            pid: TensorStore(self.rounds, rows.rows, env.device)
            for pid, rows in self.layouts.items()
        }
        self.reads = 0  #: the host reads of ``sample()`` calls (one or two each)
        #: NEXT_STEP: its reset steps, the rows carried into the next sample
        self._next = NextStepRows(n, env.device) if env.next_step_resets else None
        self._faults = SubEnvFaults(n, restart=True, limit=config.sub_env_restart_limit)
        self._infos = (
            {pid: TensorInfos(n, env.device) for pid in self.layouts} if config.record_infos else {}
        )

    @property
    def host_reads(self) -> int:
        """Reads of device data back to the host so far: one per ``sample()``, plus what
        the env adapter itself needs (VMAS: one per round)."""
        return self.reads + self.env.host_reads

    # -- the loop -------------------------------------------------------------------------
    def sample(self, learn: Learn | None = None) -> TensorSample:
        """``rounds`` rounds of every sub-env; the batches by policy and the env steps.

        ``learn(batches)`` (the learner pipelines, their checks deferred) runs on the
        batches before the sample's one read and returns its checks' flags, read with it.
        A NEXT_STEP env's batches are built after its reads (``_sample_next_step``), so
        ``learn`` is not called; if the read drops rows after ``learn`` ran (a faulty
        sub-env), its result is not handed out (``learner_flags`` None)."""
        if not self._inputs:
            self._start()
        stores = self._stores
        self.episodes.begin_sample(self.rounds)
        for infos in self._infos.values():
            infos.begin_sample()
        # rows the agent pipelines leave as the env gave them are checked once recorded
        check_rows = (
            self.config.check_finite
            and self._next is None
            and not any(len(self.pipes.agent[pid]) for pid in self.layouts)
        )
        for k in range(self.rounds):
            self.step(k, stores, check_rows)
        if self._next is not None:
            return self._sample_next_step(self._next, stores)
        batches, flags = None, []
        if learn is not None:
            batches = self._build(stores, None)
            flags = learn(batches)
        read = self._read_back(stores, flags, check_rows)
        valid = self._valid_rows(read)
        if valid is not None or batches is None:  # (re)built without the dropped rows
            batches, learned = self._build(stores, valid), None
        else:
            learned = read.flags[len(read.flags) - len(flags) :]
        self._close_sample([read], read.bad)
        steps = self.rounds * self.env.num_envs if valid is None else int(valid.sum())
        return TensorSample(batches, steps, learned)

    def _sample_next_step(
        self, rows: NextStepRows, stores: Mapping[str, TensorStore]
    ) -> TensorSample:
        """A NEXT_STEP env's sample after its ``rounds`` rounds: the read, the extra rounds
        that make up each sub-env's reset steps and their read, then exactly ``rounds``
        rows per sub-env (``NextStepRows``), the rest carried into the next sample."""
        reads = [self._read_back(stores, [], False)]
        ended, bad = reads[0].ended_rounds, reads[0].bad
        valid = rows.valid(ended, bad)
        extra = rows.extra_rounds(valid, ended[-1], bad, self.rounds)
        if extra:
            total = self.rounds + extra
            self.episodes.reserve(total)
            for store in stores.values():
                store.reserve(total)
            for k in range(self.rounds, total):
                self.step(k, stores, False)
            reads.append(self._read_back(stores, [], False, range(self.rounds, total)))
            ended, bad = np.concatenate([ended, reads[1].ended_rounds]), reads[1].bad
            valid = rows.valid(ended, bad)
        batches = {
            pid: rows.build(pid, store, valid, bad, self._constant(pid))
            for pid, store in stores.items()
        }
        steps = rows.finish(valid, ended[-1], bad, self.rounds)
        self._close_sample(reads, bad)
        return TensorSample(batches, steps, None)

    def _constant(self, pid: str) -> dict[str, Any]:
        """The columns of policy ``pid``'s rows that are the same at every round."""
        rows = self.layouts[pid]
        return {
            "env_id": rows.env_ids,
            "agent_index": rows.agent_index,
            "weights_seq": int(self.policies[pid].weights_seq),
        }

    def _close_sample(self, reads: list[SampleRead], bad: Mapping[int, int]) -> None:
        """After a sample's reads: the episodes completed count for the restart limit
        (all before a fault), faulty sub-envs restarted, ``on_episode_end`` called."""
        for read in reads:
            self._faults.episodes_completed(read.ended.env_id.tolist())
        if bad:
            self._restart_faulty(bad)
        for read in reads:
            self._episode_ends(read.ended)
            self._episode_ends(read.faulty)

    def _build(
        self, stores: Mapping[str, TensorStore], valid: np.ndarray | None
    ) -> dict[str, SampleBatch]:
        """The batch of every policy; ``valid`` (T, N) bool: the rows kept (None: all)."""
        out = {}
        for pid, store in stores.items():
            rows = self.layouts[pid]
            keep, meta = None, {}
            if valid is not None:
                slots = np.tile(valid.T, (len(rows.agents), 1))  # (R, T), slot major
                keep = torch.as_tensor(np.flatnonzero(slots), device=self.env.device)
                meta = rows_meta(slots.sum(1))
            batch = store.build(self._constant(pid), keep)
            batch.meta.update(meta)
            out[pid] = batch
        return out

    def _valid_rows(self, read: SampleRead) -> np.ndarray | None:
        """Which rows ``(T, N)`` are transitions to hand out, from what the read brought:
        not a faulty sub-env's from its bad round on. None: every row is."""
        if not read.bad:
            return None
        valid = np.ones((self.rounds, self.env.num_envs), dtype=bool)
        for e, k in read.bad.items():
            valid[k:, e] = False
        return valid

    def _episode_ends(self, ended: EndedEpisodes) -> None:
        """``on_episode_end`` of each of ``ended`` (faulty ones too, as on numpy)."""
        if self.hooks.on_end:
            runner = self.hooks.runner
            for i in range(len(ended)):
                ep = self.episodes.episode(ended, i, runner)
                self.hooks.call(self.hooks.callbacks.on_episode_end, ep.env_id, ep)

    def _read_back(
        self,
        stores: Mapping[str, TensorStore],
        learner_flags: list[torch.Tensor],
        check_rows: bool,
        rounds: range | None = None,
    ) -> SampleRead:
        """A host read of the sample (its one, or one of a NEXT_STEP env's two; of its
        ``rounds``, None: all): the ended episodes, with every check deferred to it (the
        env's, the finite check, on the recorded rows where ``check_rows``, each agent
        connector's, the learner's flags) raised by name, the learner's left to the
        runner."""
        self.reads += 1
        check = self.env.deferred_check()
        head = [check[0]] if check else []
        # whether a recorded row may hold a NaN or inf: one sum per column
        sums = [s.any_nonfinite(_CHECKED) for s in stores.values()] if check_rows else []
        pipes = [(pid, self.pipes.agent[pid]) for pid in self.layouts]
        pending = [
            (pid, name, flag) for pid, p in pipes for name, flag in p.pending_flags().items()
        ]
        flags = head + sums + [flag for _, _, flag in pending]
        at = slice(len(head), len(head) + len(sums))
        read = self.episodes.read_back(
            flags + learner_flags,
            drop_bad=self.config.restart_failed_sub_environments,
            locate=functools.partial(self._locate, stores, at) if sums else None,
            rounds=rounds,
        )
        values = read.flags
        if check and values[0]:
            raise EnvCheckError(check[1])
        failed = [
            (pid, name)
            for (pid, name, _), v in zip(pending, values[len(flags) - len(pending) : len(flags)])
            if v
        ]
        for pid, name in failed:
            self.pipes.agent[pid].raise_pending([name])
        return read

    def _restart_faulty(self, bad: Mapping[int, int]) -> None:
        """Sub-envs that returned a non-finite value (their rows from it on are dropped):
        counted against ``sub_env_restart_limit``, reset by mask, new episodes begun and
        their connectors' per-episode state dropped; the next actions are for their new
        first observations. Those are checked like a step's (noted for the next read: a
        sub-env that resets to a NaN fails again), and rows that are not finite are kept
        out of the agent pipelines."""
        ids = sorted(bad)
        for e in ids:
            self._faults.on_error(
                e, EnvCheckError(f"sub-env {e} returned a non-finite observation or reward")
            )
        mask = torch.zeros(self.env.num_envs, dtype=torch.bool, device=self.env.device)
        mask[ids] = True
        self.episodes.restart_where(mask, ids)
        if self._next is not None:
            self._next.resets &= ~mask
        for pid in self.layouts:
            for pipe in (self.pipes.agent[pid], self.pipes.action[pid]):
                if len(pipe):
                    pipe.reset_where(mask)
        first = self.env.reset_where(mask, ids)
        fine = mask
        if self.config.check_finite:  # (step 0 of the new episodes, round 0 of the next)
            ok = _finite_rows(first)
            if ok is not None:
                self.episodes.check_finite(ok | ~mask, ok | True, 0, resets=mask)
                fine = mask & ok
        for pid, rows in self.layouts.items():
            row_mask, current = rows.rows_of(mask), self._inputs[pid]
            fresh = self._first_rows(pid, first, mask=rows.rows_of(fine))
            self._inputs[pid] = {
                name: where_rows(row_mask, fresh[name], value)
                for name, value in current.items()
                if name in fresh
            }

    def _start(self) -> None:
        """Reset every sub-env and run the agent pipelines on the first observations."""
        first = self.env.start(self.config.seed)
        self.episodes.start()
        for pid in self.layouts:
            self._inputs[pid] = self._first_rows(pid, first, mask=None)

    def step(self, k: int, stores: Mapping[str, TensorStore], check_rows: bool) -> None:
        """Round ``k``: act, step, advance, record, finish (see the module docstring);
        the finite check here unless ``check_rows`` (then on the recorded rows)."""
        self.poll_index += 1
        names = self.env.agents
        actions: dict[Any, Nest] = {}
        outputs: dict[str, dict[str, Any]] = {}
        for pid, rows in self.layouts.items():
            outputs[pid], env_actions = self._act(pid, rows)
            actions.update(rows.split(env_actions, names))
        t0 = _clock()
        step = self.env.step(actions)
        self.timers.seconds["mean_env_wait_ms"] += _clock() - t0
        self.timers.steps += 1
        rewards = torch.stack([step.rewards[a] for a in names])
        term, trunc = step.terminateds, step.truncateds
        resets = None if self._next is None else self._next.resets
        if resets is not None:  # steps that only reset: no transition (dropped at build)
            rewards, term, trunc = rewards.masked_fill(resets, 0.0), term & ~resets, trunc & ~resets
        if self.config.check_finite and not check_rows:  # (before the returns grow)
            self._check_finite(step.obs, rewards, k, resets)
        term, trunc, ended = self.episodes.advance(
            rewards, term, trunc, self.config.horizon, resets
        )
        skip = resets  # rows left out of the agent pipelines: reset steps, faulty sub-envs'
        if self.config.restart_failed_sub_environments and not check_rows:
            faulty = self.episodes.faulty()
            skip = faulty if skip is None else skip | faulty
        finals = {  # each policy's step rows through its pipeline, with what it answered
            pid: PolicyStep(pid, self._step_rows(pid, rows, step, term, trunc, skip))
            for pid, rows in self.layouts.items()
        }
        t0 = _clock()
        for pid, final in finals.items():
            final.outputs = outputs[pid]
            record = self._record(final)
            if self._infos:
                self._record_infos(pid, step, record)
            stores[pid].write(k, record)
        self.timers.seconds["mean_recording_ms"] += _clock() - t0
        self.episodes.end(k, ended)
        self._finish(ended, ended if resets is None else resets, finals)
        if self._next is not None:
            self._next.resets = ended

    # -- the phases of a round ----------------------------------------------------------
    def _act(self, pid: str, rows: PolicyRows) -> tuple[dict[str, Any], Nest]:
        """Policy ``pid`` on its rows' inputs, then the action pipeline, through ``act``
        as every poll does: (outputs, env actions)."""
        return act(
            pid,
            self.policies[pid],
            self.pipes,
            self._inputs[pid],
            rows.env_ids,
            rows.agent_ids,
            explore=self.config.explore,
            timers=self.timers,
        )

    def _locate(self, stores: Mapping[str, TensorStore], at: slice, values: list[bool]) -> bool:
        """Whether a sum of recorded values (the read's ``values[at]``) was not finite:
        then the bad rows are found and noted (``_check_recorded``), for the second read
        that ``read_back`` then makes of them, in such a sample only."""
        if not any(values[at]):
            return False
        self._check_recorded(stores)
        self.reads += 1
        return True

    def _check_recorded(self, stores: Mapping[str, TensorStore]) -> None:
        """Where a sample whose rows are what the env returned holds a NaN or inf: in the
        recorded ``obs``, ``new_obs`` or ``rewards``, per sub-env, at its episode step."""
        n = self.env.num_envs
        for pid, store in stores.items():
            rounds, is_reward, with_step = store.first_nonfinite()
            k = rounds.clamp(max=self.rounds - 1).unsqueeze(0)
            step = store.column("t").gather(0, k).squeeze(0) + with_step
            bad = rounds < self.rounds
            agents = len(self.layouts[pid].agents)
            order = torch.where(bad, rounds, self.rounds).reshape(agents, n).argmin(0)
            pick = order * n + torch.arange(n, device=self.env.device)
            self.episodes.note_nonfinite(
                step[pick], is_reward[pick], bad.reshape(agents, n).any(0), rounds[pick]
            )

    def _check_finite(
        self,
        obs: Mapping[Any, Nest],
        rewards: torch.Tensor,
        k: int,
        resets: torch.Tensor | None,
    ) -> None:
        """Per sub-env: whether every observation and reward of round ``k`` is finite."""
        obs_ok = _finite_rows(obs)
        reward_ok = torch.isfinite(rewards).all(0)
        self.episodes.check_finite(
            reward_ok if obs_ok is None else obs_ok, reward_ok, k, resets=resets
        )

    def _step_rows(
        self,
        pid: str,
        rows: PolicyRows,
        step: Any,
        term: torch.Tensor,
        trunc: torch.Tensor,
        resets: torch.Tensor | None,
    ) -> AgentData:
        """Policy ``pid``'s rows of the step (final observations where episodes ended)
        through its agent pipeline: ``new_obs``, ``rewards`` and the flags as recorded.
        The sub-envs of ``resets`` are left out of the pipeline's call: a NEXT_STEP env's
        reset rows (their observations are new first ones, taken by ``_finish``) and,
        with restarts, faulty sub-envs' from their bad value on (rows to drop: no
        statistic sees them, as on numpy)."""
        names, length = self.env.agents, self.episodes.length
        columns = {
            "obs": rows.stack(step.obs, names),
            "rewards": rows.stack(step.rewards, names),
            "terminateds": rows.rows_of(term),
            "truncateds": rows.rows_of(trunc),
            "t": rows.rows_of(length),
        }
        mask = None if resets is None else ~rows.rows_of(resets)
        return self._through_pipeline(pid, rows, columns, mask=mask)

    def _through_pipeline(
        self, pid: str, rows: PolicyRows, columns: dict[str, Any], mask: torch.Tensor | None
    ) -> AgentData:
        t0 = _clock()
        data = AgentData.trusted(rows.env_ids, rows.agent_ids, columns, mask)
        pipe = self.pipes.agent[pid]
        if len(pipe):
            data = pipe(data)
        self.timers.seconds["mean_raw_obs_processing_ms"] += _clock() - t0
        return data

    def _record(self, final: PolicyStep) -> dict[str, Any]:
        """Round k's row of every column of one policy: what it acted on, what it did
        (``final.outputs``), where the step ended (``final.data``), and its episode (the
        columns the same at every round are added at ``build``)."""
        data, outputs = final.data, final.outputs or {}
        inputs, rows = self._inputs[final.pid], self.layouts[final.pid]
        record = {name: value for name, value in inputs.items() if name not in _STEP_COLUMNS}
        record["obs"] = inputs["obs"]
        record["new_obs"] = data["obs"]
        for name, next_name in NEXT_INPUTS_OF.items():  # what the policy is fed next
            if name in data:
                record[next_name] = data[name]
        record["rewards"] = data["rewards"]
        record["terminateds"] = data["terminateds"]
        record["truncateds"] = data["truncateds"]
        record["t"] = inputs["t"]
        record.update(outputs)
        record["eps_id"] = rows.rows_of(self.episodes.eps_id)
        return record

    def _record_infos(self, pid: str, step: Any, record: dict[str, Any]) -> None:
        """``record_infos``: the step's infos of policy ``pid``'s agents as ``infos``."""
        names = self.env.agents
        per_agent = [step.infos.get(names[a]) for a in self.layouts[pid].agents]
        infos = self._infos[pid].rows(per_agent)
        if infos is not None:
            record["infos"] = infos

    def _finish(
        self, ended: torch.Tensor, starts: torch.Tensor, finals: Mapping[str, PolicyStep]
    ) -> None:
        """Episodes ended where ``ended``: connectors reset, the env restarts them, and
        each policy's next inputs are the step's rows, or new first rows where ``starts``
        (``ended``; a NEXT_STEP env's first observations come one step later)."""
        for pid in self.layouts:
            for pipe in (self.pipes.agent[pid], self.pipes.action[pid]):
                if len(pipe):
                    pipe.reset_where(ended)
        t0 = _clock()
        first = self.env.restart(ended)
        self.timers.seconds["mean_env_wait_ms"] += _clock() - t0
        for pid, rows in self.layouts.items():
            self._inputs[pid] = self._next_inputs(pid, rows, finals[pid].data, first, starts)

    def _next_inputs(
        self, pid: str, rows: PolicyRows, final: AgentData, first: Mapping[Any, Nest],
        ended: torch.Tensor,
    ) -> dict[str, Any]:  # fmt: skip
        row_ended = rows.rows_of(ended)
        if not len(self.pipes.agent[pid]):  # the env's observations as they are
            return {
                "obs": rows.stack(first, self.env.agents),
                "t": final["t"].masked_fill(row_ended, 0),
            }
        fresh = self._first_rows(pid, first, mask=row_ended)
        return {
            name: where_rows(row_ended, fresh[name], value)
            for name, value in final.columns.items()
            if name in fresh
        }

    def _first_rows(
        self, pid: str, first: Mapping[Any, Nest], mask: torch.Tensor | None
    ) -> dict[str, Any]:
        """Policy ``pid``'s first rows of new episodes (``mask``: the rows that are;
        None: all) through its agent pipeline (the zero columns made once, read only)."""
        rows = self.layouts[pid]
        columns = {"obs": rows.stack(first, self.env.agents), **rows.blank}
        return dict(self._through_pipeline(pid, rows, columns, mask).columns)


_STEP_COLUMNS = frozenset({"obs", "rewards", "terminateds", "truncateds", "t"})
_CHECKED = ("obs", "new_obs", "rewards")  #: the recorded columns the finite check reads

#: the learner pipelines on a sample's batches, their checks deferred: their flags
Learn = Callable[[dict[str, SampleBatch]], list[torch.Tensor]]


def _blank_rows(rows: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The zero columns of an episode's first rows (no reward, no end, step 0)."""
    no = torch.zeros(rows, dtype=torch.bool, device=device)
    return {
        "rewards": torch.zeros(rows, dtype=torch.float32, device=device),
        "terminateds": no,
        "truncateds": no,
        "t": torch.zeros(rows, dtype=torch.int64, device=device),
    }


def _finite_rows(obs: Mapping[Any, Nest]) -> torch.Tensor | None:
    """(N,) bool: whether every float observation of each sub-env (all agents') is
    finite; None when no observation is a float."""
    leaves = [leaf for nest in obs.values() for leaf in _float_leaves(nest)]
    oks = [torch.isfinite(leaf.reshape(leaf.shape[0], -1)).all(1) for leaf in leaves]
    return oks[0] if len(oks) == 1 else torch.stack(oks).all(0) if oks else None


def _float_leaves(nest: Nest) -> list[torch.Tensor]:
    """The floating-point leaves of a nest (integer observations are always finite)."""
    if isinstance(nest, Mapping):
        return [x for v in nest.values() for x in _float_leaves(v)]
    if isinstance(nest, tuple | list):
        return [x for v in nest for x in _float_leaves(v)]
    return [nest] if nest.is_floating_point() else []


def refuse_tensor_features(
    config: RunnerConfig,
    hooks: EpisodeHooks,
    policies: Mapping[str, Policy],
    pipes: PolicyPipelines,
) -> None:
    """ValueError naming what the tensor path does not do, with the fix, at build time."""
    refusals = _refused_settings(config, hooks)
    for pid, policy in policies.items():
        if type(policy).postprocess_trajectory is not Policy.postprocess_trajectory:
            refusals.append(
                f"policy {pid!r} overrides postprocess_trajectory (per trajectory on the "
                "host); compute it in a learner connector instead"
            )
    kinds: dict[str, Mapping[str, ConnectorPipeline[Any]]] = {
        "agent": pipes.agent,
        "action": pipes.action,
        "learner": pipes.learner,
    }
    for kind, by_policy in kinds.items():
        for pid, pipe in by_policy.items():
            members = pipe.tensor_refusals()
            if members:
                refusals.append(
                    f"the {kind} pipeline of policy {pid!r}: its members {members} do not take "
                    "torch tensors (a connector declares takes_tensors = True once it does: "
                    "see docs/writing-connectors.md)"
                )
    if refusals:
        raise ValueError("the tensor path does not take " + "; ".join(refusals))


def _refused_settings(config: RunnerConfig, hooks: EpisodeHooks) -> list[str]:
    refusals = []
    if config.batch_mode is not BatchMode.TRUNCATE_EPISODES:
        refusals.append(
            "batch_mode='complete_episodes' (every sub-env gives exactly "
            "rollout_fragment_length rows: use 'truncate_episodes')"
        )
    for name in ("on_episode_created", "on_episode_start", "on_episode_step"):
        if hooks.callbacks.overrides(name):
            refusals.append(
                f"the {name} callback (a call per episode per round would read the host; "
                "on_episode_end and on_sample_end are called once per sample())"
            )
    if config.soft_horizon:
        refusals.append("soft_horizon (episodes restart by mask)")
    if config.observation_fn is not None:
        refusals.append("observation_fn (a call per agent per round)")
    if config.sample_async:
        refusals.append("sample_async (the simulator already runs on its device)")
    return refusals
