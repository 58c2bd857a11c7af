"""``EpisodeTracker``: starts, advances and ends the episode of every sub-env.

It keeps the ``EpisodeTable`` (ids, lengths, returns), the ``TrajectoryIds`` and, for
multi-agent envs, the ``AgentSlots``; it calls the episode callbacks (``EpisodeHooks``)
and keeps the metric records. What ends is noted in an ``EpisodeEnds`` record that the
step takes (``take_ends``) and hands to the collectors: bookkeeping never writes rows.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.episodes.agents import AgentSlots
from rlconnect.episodes.ends import ClosingRow, EpisodeEnds
from rlconnect.episodes.episode import Episode
from rlconnect.episodes.hooks import EpisodeHooks
from rlconnect.episodes.table import EpisodeTable, PollRows
from rlconnect.episodes.trajectories import TrajectoryIds
from rlconnect.errors import EnvError

__all__ = ["MAX_METRICS", "ClosingInputs", "EpisodeSettings", "EpisodeTracker", "episode_flags"]

MAX_METRICS = 100_000
"""Episode records kept for ``get_metrics()``; a loop that never asks keeps the latest."""

#: ``(policy_id, env_id, agent_id, reward) -> columns``: what the agent pipeline of an
#: agent that ended without a final observation makes of the reward it got since it last
#: acted, for the row that closes its trajectory (``ClosingRow.inputs``)
ClosingInputs = Callable[[str, int, Any, float], Mapping[str, Any]]


@dataclass(frozen=True)
class EpisodeSettings:
    """What an ``EpisodeTracker`` is built with: whether agents are many, the runner's
    policy ids and mapping function (``policy_mapping_fn(agent_id, episode, worker=)``),
    the first episode id, ``connector_resets()``: the ``reset(env_id)`` of every
    connector that keeps per-episode state (called for each ended episode's sub-env), and
    ``closing_inputs``: what the agent pipelines make of the reward of an agent that ended
    without a final observation (``ClosingInputs``; None: the reward as it is)."""

    multi_agent: bool
    policy_ids: Sequence[str]
    mapping_fn: Callable[..., str]
    first_id: int = 0
    connector_resets: Callable[[], list[Callable[[int], None]]] = list
    closing_inputs: ClosingInputs | None = None


class EpisodeTracker:
    """Starts, advances and ends the episode of each of ``num_envs`` sub-envs.

    Episodes that end together are closed in one pass (``end``): their totals, their
    trajectories (the agents of multi-agent episodes in ``agents``), their rows counted or
    dropped (noted in the ends), then ``on_episode_end``, the metric record and the
    connectors' per-episode state.

    Single-agent episodes get their trajectory when they begin. With one policy and no
    ``on_episode_created`` nothing reads a new episode's id or object before the poll's
    actions are out, so ``begin`` only sets their lengths and ``actions_sent()`` makes the
    rest: in time an env that steps meanwhile (EnvPool) runs.
    """

    def __init__(self, num_envs: int, settings: EpisodeSettings, hooks: EpisodeHooks) -> None:
        self.settings = settings
        self.table = EpisodeTable(num_envs, settings.first_id)
        self.trajectories = TrajectoryIds(num_envs)
        self._hooks = hooks
        #: new episodes are made once the poll's actions are out (see the class docstring)
        multi = settings.multi_agent
        self._after_send = not multi and len(settings.policy_ids) == 1 and not hooks.on_created
        self._unmade: tuple[list[int], list[int]] | None = None  # (new, firsts) to make
        self._ends: EpisodeEnds | None = None  # (made at the first end: most polls end nothing)
        self.metrics: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_METRICS)
        self._reward_keys: dict[tuple[Any, str], tuple[Any, str]] = {}
        #: multi-agent: the agents of every running episode (unused by single-agent ones)
        self.agents = AgentSlots(self.table, self.trajectories, self._closing, settings.policy_ids)

    def __getitem__(self, env_id: int) -> Episode:
        return self.table[env_id]

    @property
    def next_id(self) -> int:
        """The id the next episode gets."""
        return self.table.next_id

    @next_id.setter
    def next_id(self, value: int) -> None:
        self.table.next_id = value

    def ends(self) -> EpisodeEnds:
        """The ends noted since the last ``take_ends`` (to add to)."""
        ends = self._ends
        if ends is None:
            ends = self._ends = EpisodeEnds()
        return ends

    def _closing(self, env_id: int, agent_id: Any, row: ClosingRow) -> None:
        """Note ``row``, which closes the trajectory of agent ``agent_id`` of sub-env
        ``env_id``, in the ends, with what the agent pipeline makes of its reward (now:
        before the episode's end resets the connectors' state)."""
        make = self.settings.closing_inputs
        if make is not None:
            row = row._replace(inputs=make(row.policy_id, env_id, agent_id, row.reward))
        self.ends().closing.append(row)

    def take_ends(self) -> EpisodeEnds | None:
        """What ended since the last call (None: nothing), for the collectors."""
        ends, self._ends = self._ends, None
        return ends

    def is_open(self, env_id: int) -> bool:
        """Whether sub-env ``env_id`` has a running episode."""
        return self.table.episodes[env_id] is not None

    def open(self, env_ids: list[int], *, create: bool = True) -> list[int]:
        """Open episodes in ``env_ids``, which just gave a first observation (ending the one
        there if the env reset by itself mid-episode; one that has not stepped is kept);
        returns the sub-envs whose episode is new.

        Their lengths are set at once (what the poll's ``t`` reads), and their ids, other
        counters and ``Episode`` objects (with the mapping function and
        ``on_episode_created`` they cause) too, or with ``create=False`` only at
        ``create(new)``: a single-agent runner of one policy acts on the poll before
        anything reads them, so it makes them once the actions are out."""
        new = []
        episodes, length = self.table.episodes, self.table.length
        for e in env_ids:
            if episodes[e] is not None:
                if not length[e]:
                    continue
                self.end([e])
            new.append(e)
        if new:
            length[new] = 0
            if create:
                self.create(new)
        return new

    def begin(self, rows: PollRows, full: bool) -> list[int]:
        """Open the episodes that begin at this poll and advance the lengths (and the
        single-agent returns) of the sub-envs that stepped; returns the sub-envs whose
        episode begins (``full``: row i is sub-env i)."""
        env_ids, stepped = rows.env_ids, rows.stepped
        multi = self.settings.multi_agent
        all_stepped = full and len(stepped) == len(env_ids)  # then no row is a first one
        firsts: list[int] = []
        if not (all_stepped or rows.plain) and np.count_nonzero(rows.is_first):
            first_ids = env_ids[rows.is_first]  # dense rows: unique and sorted already
            firsts = (first_ids if rows.dense else np.unique(first_ids)).tolist()
            new = self.open(firsts, create=not self._after_send)
            if self._after_send:
                self._unmade = (new, firsts)
            elif not multi:
                self._open_trajectories(firsts)
        table = self.table
        if multi and None in table.episodes:  # rows of a sub-env with none open
            for e in np.unique(env_ids).tolist():
                if table.episodes[e] is None:
                    self.open([e])
        length = table.length
        one = len(length) == 1  # (numpy's ufuncs cost most on arrays of one element:
        # one sub-env's numbers are added as scalars, at a fraction of the cost)
        if one and len(stepped):
            length[0] += 1
        elif len(stepped) == len(length):  # every sub-env stepped (ascending, unique)
            length += 1
        else:
            length[stepped] += 1
        if multi:  # (their returns are the episodes' own, per agent)
            return firsts
        if one and len(env_ids):
            table.ret[0] += rows.rewards[0]
        elif full:
            table.ret += rows.rewards
        else:
            table.ret[env_ids] += rows.rewards  # one row per sub-env
        return firsts

    def actions_sent(self) -> None:
        """The poll's actions are out: make the episodes ``begin`` left to make now."""
        if self._unmade is not None:
            new, firsts = self._unmade
            self._unmade = None
            self.create(new)
            self._open_trajectories(firsts)

    def _open_trajectories(self, env_ids: list[int]) -> None:
        """Single-agent: a new trajectory for the episode of each of ``env_ids``."""
        self.trajectories.open_single(env_ids, DEFAULT_AGENT_ID, [self[e] for e in env_ids])

    def create(self, env_ids: list[int]) -> list[Episode]:
        """The ids, counters and ``Episode`` objects of episodes just opened in
        ``env_ids`` (see ``open``)."""
        table, hooks = self.table, self._hooks
        table.renew(np.array(env_ids))  # (one conversion for the writes)
        single, mapping_fn = not self.settings.multi_agent, self.settings.mapping_fn
        out = []
        for e in env_ids:
            ep = Episode(table.eps_id[e], e, mapping_fn, worker=hooks.runner)
            table.episodes[e] = ep
            if single:
                ep.policy_for(DEFAULT_AGENT_ID)  # the mapping fn: once per agent per episode
            if hooks.on_created:
                hooks.created(e, ep)
            out.append(ep)
        return out

    def horizon_flags(
        self, rows: PollRows, horizon: int
    ) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[bool, bool]]]:
        """The rows' terminated and truncated flags and the sub-envs whose episode ends,
        with the episodes of the sub-envs that stepped and reached ``horizon`` steps
        truncated (lengths already advanced by this poll)."""
        done_envs, stepped = rows.done_envs, rows.stepped
        if not len(stepped):
            return rows.terminateds, rows.truncateds, done_envs
        over = stepped[self.table.length[stepped] >= horizon]
        if not len(over):
            return rows.terminateds, rows.truncateds, done_envs
        done_envs = dict(done_envs)
        for e in over.tolist():
            done_envs.setdefault(e, (False, True))
        return rows.terminateds, rows.truncateds | np.isin(rows.env_ids, over), done_envs

    def fire_start(self, env_ids: list[int]) -> None:
        """``on_episode_start`` for episodes that just got their first observation."""
        hooks = self._hooks
        if hooks.on_start:
            for e in env_ids:
                hooks.call(hooks.callbacks.on_episode_start, e, self.table.episodes[e])

    def fire_step(self, env_ids: np.ndarray) -> None:
        """``on_episode_step`` for sub-envs that took an env step (lengths made current;
        multi-agent: returns too)."""
        hooks = self._hooks
        if hooks.on_step:
            multi, length = self.settings.multi_agent, self.table.length
            for e in env_ids.tolist():
                ep = self[e]
                if multi:
                    self.agents.write_returns(e, ep)
                ep.length = int(length[e])
                hooks.call(hooks.callbacks.on_episode_step, e, ep)

    def end(self, env_ids: Sequence[int], *, faulty: bool = False) -> None:
        """End the episodes of ``env_ids``, in this order (a sub-env without one is
        skipped): totals, then their trajectories and rows (``_close``), then per
        episode ``on_episode_end``, its metric record and its connectors' per-episode state.

        The episodes that end at one poll go through together: one call per poll for the
        bookkeeping they share, not one per episode."""
        table = self.table
        episodes = table.episodes
        ended = [(e, ep) for e in env_ids if (ep := episodes[e]) is not None]
        if not ended:
            return
        single = not self.settings.multi_agent
        for e, ep in ended:
            ep.length = int(table.length[e])
            if single:
                ep.total_reward = total = float(table.ret[e])
                ep.agent_rewards = {self._reward_key(a, ep): total for a in ep.get_agents()}
            ep.faulty = faulty
        self._close(ended, faulty)
        hooks, metrics = self._hooks, self.metrics
        resets = self.settings.connector_resets()
        for e, ep in ended:
            if hooks.on_end:
                hooks.call(hooks.callbacks.on_episode_end, e, ep)
            metrics.append(ep.to_metrics())
            for reset in resets:
                reset(e)
            episodes[e] = None

    def _close(self, ended: list[tuple[int, Episode]], faulty: bool) -> None:
        """Episodes ended: close their trajectories; their rows count, or are dropped
        (noted in the ends)."""
        multi = self.settings.multi_agent
        if multi:
            for e, ep in ended:
                self.agents.close_episode(e, ep)
        else:
            self.trajectories.close_single([e for e, _ in ended])
        if faulty:
            self.ends().dropped += [ep.episode_id for _, ep in ended]
            return
        table = self.table
        table.sum_agent_steps()
        env_steps = sum(ep.length for _, ep in ended)
        agent_steps = sum(int(table.agent_steps[e]) for e, _ in ended) if multi else None
        self.ends().finish([ep.episode_id for _, ep in ended], env_steps, agent_steps)

    def _reward_key(self, agent_id: Any, episode: Episode) -> tuple[Any, str]:
        """``(agent_id, policy_id)``, one tuple per pair for every episode: the collector
        soon stops tracking it, and then the reward dicts and metric records that use it
        need not be followed by the garbage collector either (single-agent pairs are few)."""
        key = (agent_id, episode.policy_for(agent_id))
        return self._reward_keys.setdefault(key, key)

    def refuse_endless(self, limit: int) -> None:
        """Raise ``EnvError`` naming a sub-env whose episode ran past ``limit`` steps
        (``complete_episodes`` without a horizon would otherwise wait forever)."""
        length = self.table.length
        longest = int(np.argmax(length))
        if length[longest] > limit:
            raise EnvError(
                f"sub-env {longest} has run {int(length[longest]):,} steps without "
                "ending its episode while batch_mode='complete_episodes' waits for whole "
                "episodes; set RunnerConfig.horizon (or use 'truncate_episodes')"
            )

    def hand_over(self, log: Any, run_metrics: Any) -> None:
        """The records of the episodes ended since the last call, to the runner's
        ``get_metrics()`` log and its ``metrics()`` window."""
        records = self.take_metrics()
        if records:
            log.extend(records)
            run_metrics.add_episodes(records)

    def take_metrics(self) -> list[dict[str, Any]]:
        """The metric records of episodes ended since the last call (taken one by one: a
        record the sampling thread of ``sample_async`` adds meanwhile waits for the next
        call instead of being cleared unseen)."""
        records, pop = self.metrics, self.metrics.popleft
        return [pop() for _ in range(len(records))]


def episode_flags(
    rows: PollRows,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    done_envs: Mapping[int, tuple[bool, bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """Final rows of an episode ended by ``__all__`` carry the episode's flags."""
    ended = np.isin(rows.env_ids, list(done_envs))
    fill = ended & ~(terminateds | truncateds)
    if not fill.any():
        return terminateds, truncateds
    flags = np.array([done_envs.get(e, (False, False)) for e in rows.env_ids.tolist()])
    return terminateds | (fill & flags[:, 0]), truncateds | (fill & flags[:, 1])
