"""The open episode of every sub-env: ids, lengths, returns, callbacks and metric records.

Counters live in arrays indexed by sub-env, so the single-agent fast path advances all of
them with one numpy operation per step; ``Episode`` objects (what callbacks and the
policy mapping function see) are created at episode start and completed at the end.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.rows import EnvRows
from rlconnect.episodes import Episode
from rlconnect.errors import EnvError
from rlconnect.runner.callbacks import Callbacks
from rlconnect.runner.trajectories import TrajectoryIds

__all__ = ["MAX_METRICS", "EpisodeHooks", "EpisodeTracker"]

MAX_METRICS = 100_000
"""Episode records kept for ``get_metrics()``; a loop that never asks keeps the latest."""


class EpisodeHooks:
    """The episode callbacks, with the arguments every call passes (``runner``,
    ``base_env``, ``policies``); hooks a subclass does not override are skipped."""

    def __init__(
        self, callbacks: Callbacks, runner: Any, base_env: Any, policies: Mapping[str, Any]
    ) -> None:
        self.callbacks, self.runner, self.base_env, self.policies = (
            callbacks,
            runner,
            base_env,
            policies,
        )
        self.on_created = callbacks.overrides("on_episode_created")
        self.on_start = callbacks.overrides("on_episode_start")
        self.on_step = callbacks.overrides("on_episode_step")
        self.on_end = callbacks.overrides("on_episode_end")

    def created(self, env_id: int, episode: Episode) -> None:
        """``on_episode_created`` (no ``policies``: RLlib's signature)."""
        if self.on_created:
            self.callbacks.on_episode_created(
                runner=self.runner, base_env=self.base_env, env_index=env_id, episode=episode
            )

    def call(self, hook: Callable[..., None], env_id: int, episode: Episode | None) -> None:
        """``hook`` with the arguments of the per-episode callbacks."""
        hook(
            runner=self.runner,
            base_env=self.base_env,
            policies=self.policies,
            env_index=env_id,
            episode=episode,
        )


class EpisodeTracker:
    """Starts, advances and ends the episode of each of ``num_envs`` sub-envs.

    ``on_close(ended, faulty)`` runs once for the ``(env_id, episode)`` pairs that end
    together, after their totals are final and before ``on_episode_end``: the owner closes
    their trajectories there. ``connector_resets()`` gives the ``reset(env_id)`` of every
    connector that keeps per-episode state; each ended episode's sub-env is passed to them
    last, so that state is dropped.

    Single-agent episodes get their trajectory from ``trajectories`` when they begin. With
    one policy and no ``on_episode_created`` nothing reads a new episode's id or object
    before the poll's actions are out, so ``begin`` only sets their lengths and
    ``actions_sent()`` makes the rest: in time an env that steps meanwhile (EnvPool) runs.
    """

    def __init__(
        self,
        num_envs: int,
        *,
        multi_agent: bool,
        single_policy: bool,
        mapping_fn: Callable[..., str],
        first_id: int,
        hooks: EpisodeHooks,
        trajectories: TrajectoryIds,
        on_close: Callable[[list[tuple[int, Episode]], bool], None],
        connector_resets: Callable[[], list[Callable[[int], None]]],
    ) -> None:
        self.multi_agent = multi_agent
        self.trajectories = trajectories
        #: new episodes are made once the poll's actions are out (see the class docstring)
        self._after_send = not multi_agent and single_policy and not hooks.on_created
        self._unmade: tuple[list[int], list[int]] | None = None  # (new, firsts) to make
        self.episodes: list[Episode | None] = [None] * num_envs
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.ret = np.zeros(num_envs, dtype=np.float64)  # single-agent returns
        self.agent_steps = np.zeros(num_envs, dtype=np.int64)
        self.eps_id = np.full(num_envs, -1, dtype=np.int64)
        self.next_id = first_id
        self.metrics: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_METRICS)
        self._mapping_fn = mapping_fn
        self._hooks = hooks
        self._on_close = on_close
        self._connector_resets = connector_resets

    def __getitem__(self, env_id: int) -> Episode:
        ep = self.episodes[env_id]
        if ep is None:  # the step opens an episode before anything reads it
            raise RuntimeError(f"sub-env {env_id} has no open episode")
        return ep

    def is_open(self, env_id: int) -> bool:
        """Whether sub-env ``env_id`` has a running episode."""
        return self.episodes[env_id] is not None

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
        for e in env_ids:
            if self.episodes[e] is not None:
                if not self.length[e]:
                    continue
                self.end([e])
            new.append(e)
        if new:
            self.length[new] = 0
            if create:
                self.create(new)
        return new

    def begin(self, rows: EnvRows, full: bool) -> list[int]:
        """Open the episodes that begin at this poll and advance the lengths (and the
        single-agent returns) of the sub-envs that stepped; returns the sub-envs whose
        episode begins (``full``: row i is sub-env i)."""
        env_ids, stepped = rows.env_ids, rows.stepped
        all_stepped = full and len(stepped) == len(env_ids)  # then no row is a first one
        firsts: list[int] = []
        if not all_stepped and np.count_nonzero(rows.is_first):
            first_ids = env_ids[rows.is_first]  # dense rows: unique and sorted already
            firsts = (first_ids if rows.dense else np.unique(first_ids)).tolist()
            new = self.open(firsts, create=not self._after_send)
            if self._after_send:
                self._unmade = (new, firsts)
            elif not self.multi_agent:
                self._open_trajectories(firsts)
        if self.multi_agent:
            for e in np.unique(env_ids).tolist():
                if self.episodes[e] is None:
                    self.open([e])
        if all_stepped:
            self.length += 1
        else:
            self.length[stepped] += 1
        if self.multi_agent:  # (their returns are the episodes' own, per agent)
            return firsts
        if full:
            self.ret += rows.rewards
        else:
            self.ret[env_ids] += rows.rewards  # one row per sub-env
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
        ids = self.trajectories.open_single(env_ids)
        self.trajectories.own(ids, DEFAULT_AGENT_ID, [self[e] for e in env_ids])

    def ids(self, env_ids: np.ndarray, full: bool) -> np.ndarray:
        """The episode id of each sub-env in ``env_ids`` (``full``: every sub-env in order)."""
        return self.eps_id.copy() if full else self.eps_id[env_ids]

    def create(self, env_ids: list[int]) -> list[Episode]:
        """The ids, counters and ``Episode`` objects of episodes just opened in
        ``env_ids`` (see ``open``)."""
        at = np.array(env_ids)  # one conversion for the three writes
        self.eps_id[at] = np.arange(self.next_id, self.next_id + len(env_ids))
        self.next_id += len(env_ids)
        self.agent_steps[at] = 0
        self.ret[at] = 0.0
        hooks, single = self._hooks, not self.multi_agent
        out = []
        for e in env_ids:
            ep = Episode(self.eps_id[e], e, self._mapping_fn, worker=hooks.runner)
            self.episodes[e] = ep
            if single:
                ep.policy_for(DEFAULT_AGENT_ID)  # the mapping fn: once per agent per episode
            if hooks.on_created:
                hooks.created(e, ep)
            out.append(ep)
        return out

    def horizon_flags(
        self, rows: EnvRows, stepped: np.ndarray, horizon: int
    ) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[bool, bool]]]:
        """The rows' terminated and truncated flags and the sub-envs whose episode ends,
        with the episodes of ``stepped`` sub-envs that reached ``horizon`` steps truncated
        (lengths already advanced by this poll)."""
        done_envs = rows.done_envs
        if not len(stepped):
            return rows.terminateds, rows.truncateds, done_envs
        over = stepped[self.length[stepped] >= horizon]
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
                hooks.call(hooks.callbacks.on_episode_start, e, self.episodes[e])

    def fire_step(self, env_ids: np.ndarray) -> None:
        """``on_episode_step`` for sub-envs that took an env step (lengths made current)."""
        hooks = self._hooks
        if hooks.on_step:
            for e in env_ids.tolist():
                ep = self[e]
                ep.length = int(self.length[e])
                hooks.call(hooks.callbacks.on_episode_step, e, ep)

    def end(self, env_ids: Sequence[int], *, faulty: bool = False) -> None:
        """End the episodes of ``env_ids``, in this order (a sub-env without one is
        skipped): totals, then their trajectories in one ``on_close`` call, then per
        episode ``on_episode_end``, its metric record and its connectors' per-episode state.

        The episodes that end at one poll go through together: one call per poll for the
        bookkeeping they share, not one per episode."""
        episodes = self.episodes
        ended = [(e, ep) for e in env_ids if (ep := episodes[e]) is not None]
        if not ended:
            return
        single = not self.multi_agent
        for e, ep in ended:
            ep.length = int(self.length[e])
            if single:
                ep.total_reward = total = float(self.ret[e])
                ep.agent_rewards = {(a, ep.policy_for(a)): total for a in ep.get_agents()}
            ep.faulty = faulty
        self._on_close(ended, faulty)
        hooks, metrics = self._hooks, self.metrics
        resets = self._connector_resets()
        for e, ep in ended:
            if hooks.on_end:
                hooks.call(hooks.callbacks.on_episode_end, e, ep)
            metrics.append(ep.to_metrics())
            for reset in resets:
                reset(e)
            episodes[e] = None

    def refuse_endless(self, limit: int) -> None:
        """Raise ``EnvError`` naming a sub-env whose episode ran past ``limit`` steps
        (``complete_episodes`` without a horizon would otherwise wait forever)."""
        longest = int(np.argmax(self.length))
        if self.length[longest] > limit:
            raise EnvError(
                f"sub-env {longest} has run {int(self.length[longest]):,} steps without "
                "ending its episode while batch_mode='complete_episodes' waits for whole "
                "episodes; set RunnerConfig.horizon (or use 'truncate_episodes')"
            )

    def take_metrics(self) -> list[dict[str, Any]]:
        """The metric records of episodes ended since the last call."""
        out = list(self.metrics)
        self.metrics.clear()
        return out
