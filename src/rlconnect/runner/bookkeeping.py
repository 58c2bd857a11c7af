"""Episode bookkeeping: the open episode of every sub-env, its trajectories, its agents.

- ``EpisodeTracker``: the episode of each sub-env, its counters in arrays indexed by
  sub-env (so single-agent polls advance all of them with one numpy operation), the
  ``Episode`` objects callbacks and the policy mapping function see, and their ends;
- ``TrajectoryIds``: the id of every agent trajectory (the key its rows carry in the
  collectors), who it belongs to, and when it may be forgotten;
- ``AgentTracker``: multi-agent episodes only: agents that come, go, take turns, and get
  rewards in between, kept in arrays of ``(sub-env, agent)`` slots so a poll's rows are
  looked up in bulk;
- ``EpisodeHooks``: the episode callbacks with the arguments every call passes.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.envs.rows import EnvRows
from rlconnect.episodes import Episode
from rlconnect.errors import EnvError
from rlconnect.runner.callbacks import Callbacks

__all__ = [
    "MAX_METRICS",
    "AgentTracker",
    "EpisodeHooks",
    "EpisodeTracker",
    "TrajectoryIds",
    "episode_flags",
]

MAX_METRICS = 100_000
"""Episode records kept for ``get_metrics()``; a loop that never asks keeps the latest."""
_DUE_MAX = 256  # polls of multi-agent rewards logged before they are summed
_LAYOUTS_MAX = 64  # poll layouts an ``AgentTracker`` keeps (all forgotten when full)


class TrajectoryIds:
    """Issues trajectory ids; ``owner(t)`` gives ``(agent_id, episode)`` of a live one.

    Single-agent envs have one trajectory per sub-env episode, kept in ``of_env`` (an
    array, so the fast path reads every sub-env's id at once; -1: none open).
    """

    def __init__(self, num_envs: int) -> None:
        self.of_env = np.full(num_envs, -1, dtype=np.int64)
        #: each live trajectory's episode and agent (two dicts, not a tuple per trajectory:
        #: fewer objects for the garbage collector to follow while the rows wait)
        self._episodes: dict[int, Episode] = {}
        self._agents: dict[int, Any] = {}
        self._closed: list[int] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def new(self, agent_id: Any, episode: Episode) -> int:
        """A fresh id for ``agent_id``'s trajectory in ``episode``."""
        t = self._next
        self._next += 1
        self._episodes[t] = episode
        self._agents[t] = agent_id
        return t

    def open_single(self, env_ids: list[int]) -> range:
        """Single-agent: a new trajectory in each of ``env_ids`` (their episodes began);
        ``own`` says whose they are."""
        ids = range(self._next, self._next + len(env_ids))
        self._next += len(env_ids)
        self.of_env[env_ids] = np.arange(ids.start, ids.stop)
        return ids

    def own(self, traj_ids: range, agent_id: Any, episodes: list[Episode]) -> None:
        """Trajectories ``traj_ids`` (from ``open_single``) are ``agent_id``'s in ``episodes``."""
        self._episodes.update(zip(traj_ids, episodes, strict=True))
        self._agents.update(dict.fromkeys(traj_ids, agent_id))

    def close(self, traj_id: int) -> None:
        """The trajectory ended: forget it once its rows have all been handed out."""
        self._closed.append(traj_id)

    def close_single(self, env_ids: list[int]) -> None:
        """Single-agent: the trajectories of sub-envs ``env_ids`` ended."""
        of_env, closed = self.of_env, self._closed
        for e in env_ids:
            t = int(of_env[e])
            if t >= 0:
                closed.append(t)
                of_env[e] = -1

    def owner(self, traj_id: int) -> tuple[Any, Episode | None]:
        """``(agent_id, episode)`` of a trajectory (``(None, None)`` when forgotten)."""
        return self._agents.get(traj_id), self._episodes.get(traj_id)

    def forget_handed_out(self, collectors: PolicyCollectorGroup) -> None:
        """Drop the owners of closed trajectories that have no row left in ``collectors``."""
        if not self._closed:
            return
        left = [c.trajectory_ids() for c in collectors.collectors.values() if len(c)]
        still = set(np.concatenate(left).tolist()) if left else set()
        keep = []
        episodes, agents = self._episodes, self._agents
        for t in self._closed:
            if t in still:
                keep.append(t)
            else:
                episodes.pop(t, None)
                agents.pop(t, None)
        self._closed = keep


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

    Episodes that end together are closed in one pass (``end``): their totals, their
    trajectories (``trajectories``; the agents of multi-agent episodes in ``agents``, an
    ``AgentTracker`` this tracker owns), their rows in ``collectors`` counted or dropped,
    then ``on_episode_end``. ``connector_resets()`` gives the ``reset(env_id)`` of every
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
        collectors: PolicyCollectorGroup,
        policy_ids: Sequence[str],
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
        #: multi-agent: transitions in each episode so far, with those of the last polls
        #: logged in ``_steps_due`` until read (``count_agent_steps``)
        self.agent_steps = np.zeros(num_envs, dtype=np.int64)
        self._steps_due: list[np.ndarray] = []
        self.eps_id = np.full(num_envs, -1, dtype=np.int64)
        self.next_id = first_id
        self.metrics: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_METRICS)
        self._reward_keys: dict[tuple[Any, str], tuple[Any, str]] = {}
        self._mapping_fn = mapping_fn
        self._hooks = hooks
        self._collectors = collectors
        self._connector_resets = connector_resets
        #: multi-agent: the agents of every running episode (unused by single-agent ones)
        self.agents = AgentTracker(self.episodes, self.length, trajectories, collectors, policy_ids)

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
        if not (all_stepped or rows.plain) and np.count_nonzero(rows.is_first):
            first_ids = env_ids[rows.is_first]  # dense rows: unique and sorted already
            firsts = (first_ids if rows.dense else np.unique(first_ids)).tolist()
            new = self.open(firsts, create=not self._after_send)
            if self._after_send:
                self._unmade = (new, firsts)
            elif not self.multi_agent:
                self._open_trajectories(firsts)
        if self.multi_agent and None in self.episodes:  # rows of a sub-env with none open
            for e in np.unique(env_ids).tolist():
                if self.episodes[e] is None:
                    self.open([e])
        one = len(self.length) == 1  # (numpy's ufuncs cost most on arrays of one element:
        # one sub-env's numbers are added as scalars, at a fraction of the cost)
        if one and len(stepped):
            self.length[0] += 1
        elif len(stepped) == len(self.length):  # every sub-env stepped (ascending, unique)
            self.length += 1
        else:
            self.length[stepped] += 1
        if self.multi_agent:  # (their returns are the episodes' own, per agent)
            return firsts
        if one and len(env_ids):
            self.ret[0] += rows.rewards[0]
        elif full:
            self.ret += rows.rewards
        else:
            self.ret[env_ids] += rows.rewards  # one row per sub-env
        return firsts

    def count_agent_steps(self, agent_steps: np.ndarray) -> None:
        """Multi-agent: the transitions each sub-env completed at a poll (``look_up``'s
        array, kept by reference: summed with those of other polls when read)."""
        due = self._steps_due
        due.append(agent_steps)
        if len(due) >= _DUE_MAX:
            self._sum_agent_steps()

    def _sum_agent_steps(self) -> None:
        if self._steps_due:
            self.agent_steps += np.add.reduce(self._steps_due)
            self._steps_due.clear()

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

    def create(self, env_ids: list[int]) -> list[Episode]:
        """The ids, counters and ``Episode`` objects of episodes just opened in
        ``env_ids`` (see ``open``)."""
        at = np.array(env_ids)  # one conversion for the three writes
        self._sum_agent_steps()
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
        skipped): totals, then their trajectories and rows (``_close``), then per
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
                ep.agent_rewards = {self._reward_key(a, ep): total for a in ep.get_agents()}
            ep.faulty = faulty
        self._close(ended, faulty)
        hooks, metrics = self._hooks, self.metrics
        resets = self._connector_resets()
        for e, ep in ended:
            if hooks.on_end:
                hooks.call(hooks.callbacks.on_episode_end, e, ep)
            metrics.append(ep.to_metrics())
            for reset in resets:
                reset(e)
            episodes[e] = None

    def _close(self, ended: list[tuple[int, Episode]], faulty: bool) -> None:
        """Episodes ended: close their trajectories; their rows count, or are dropped."""
        multi, collectors = self.multi_agent, self._collectors
        if multi:
            for e, ep in ended:
                self.agents.close_episode(e, ep)
        else:
            self.trajectories.close_single([e for e, _ in ended])
        if faulty:
            for _, ep in ended:
                collectors.drop_episode(ep.episode_id)
            return
        ids, env_steps, agent_steps = [], 0, 0
        self._sum_agent_steps()
        for e, ep in ended:
            ids.append(ep.episode_id)
            env_steps += ep.length
            agent_steps += int(self.agent_steps[e])
        collectors.finish_episodes(ids, env_steps, agent_steps if multi else None)

    def _reward_key(self, agent_id: Any, episode: Episode) -> tuple[Any, str]:
        """``(agent_id, policy_id)``, one tuple per pair for every episode: the collector
        soon stops tracking it, and then the reward dicts and metric records that use it
        need not be followed by the garbage collector either (single-agent pairs are few)."""
        key = (agent_id, episode.policy_for(agent_id))
        return self._reward_keys.setdefault(key, key)

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
    rows: EnvRows,
    terminateds: np.ndarray,
    truncateds: np.ndarray,
    done_envs: dict[int, tuple[bool, bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """Final rows of an episode ended by ``__all__`` carry the episode's flags."""
    ended = np.isin(rows.env_ids, list(done_envs))
    fill = ended & ~(terminateds | truncateds)
    if not fill.any():
        return terminateds, truncateds
    flags = np.array([done_envs.get(e, (False, False)) for e in rows.env_ids.tolist()])
    return terminateds | (fill & flags[:, 0]), truncateds | (fill & flags[:, 1])


class _Layout:
    """The slots of a poll's rows (``env_id * width + code``), and what was found in them
    while no slot had changed since (``era``: ``AgentTracker._era`` then; -1: nothing)."""

    __slots__ = ("at", "codes", "era", "found")

    def __init__(self, codes: np.ndarray, at: np.ndarray) -> None:
        self.codes = codes
        self.at = at
        self.era = -1
        self.found: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None = None


class AgentTracker:
    """The agents of every sub-env's running multi-agent episode, in arrays.

    Each agent id gets a code (a column) the first time it is seen; every ``(sub-env,
    code)`` slot holds the agent's trajectory id (-1: none open), its policy (an index into
    ``policy_ids``; -1: not mapped yet in this episode), its agent index, the reward it got
    while not acting (added to its next transition) and its return so far (the rewards of
    each poll are logged and summed in bulk when read). A poll's rows are looked up and
    updated with a few numpy operations (``look_up``); Python runs per agent only where
    one joins (the mapping function, a new trajectory), ends or gets a reward without an
    observation. The rows themselves stay in the per-policy collectors.
    """

    def __init__(
        self,
        episodes: list[Episode | None],
        lengths: np.ndarray,
        trajectories: TrajectoryIds,
        collectors: PolicyCollectorGroup,
        policy_ids: Sequence[str],
    ) -> None:
        num_envs = len(episodes)
        self._episodes = episodes  #: each sub-env's running episode (``EpisodeTracker``'s)
        self._lengths = lengths  #: each sub-env's episode length (``EpisodeTracker``'s)
        self._traj = trajectories
        self._collectors = collectors
        self.policy_ids = list(policy_ids)
        self._pid_index = {p: k for k, p in enumerate(self.policy_ids)}
        self._codes: dict[Any, int] = {}
        self._agents: list[Any] = []  # code -> agent id
        self.traj = np.full((num_envs, 0), -1, dtype=np.int64)
        self.policy = np.full((num_envs, 0), -1, dtype=np.int64)
        self.index = np.zeros((num_envs, 0), dtype=np.int64)
        self.pending = np.zeros((num_envs, 0))
        self.returns = np.zeros((num_envs, 0))
        self.total = np.zeros(num_envs)  # each episode's return, summed in row order
        #: rewards not yet in ``returns`` and ``total``, by poll: (slots, rewards)
        self._due: list[tuple[np.ndarray, np.ndarray]] = []
        self._held = False  # whether some agent holds a reward for its next transition
        self.num_envs = num_envs
        #: polls' slots by layout, and the count of changes to any slot (``look_up``)
        self._layouts: dict[tuple[tuple, bytes], _Layout] = {}
        self._era = 0
        self._views()

    def _views(self) -> None:
        """Flat views of the slot arrays: a row's slot is ``env_id * width + code``, and
        one-dimensional lookups cost a fraction of two-dimensional ones."""
        self.width = self.traj.shape[1]
        self._first_slot = np.arange(self.num_envs) * self.width  # of each sub-env's row
        self._traj_at = self.traj.reshape(-1)
        self._policy_at = self.policy.reshape(-1)
        self._index_at = self.index.reshape(-1)
        self._pending_at = self.pending.reshape(-1)
        self._returns_at = self.returns.reshape(-1)
        self._layouts.clear()  # (their slots moved)
        self._era += 1

    def _episode(self, env_id: int) -> Episode:
        ep = self._episodes[env_id]
        if ep is None:  # the step opens an episode before anything reads it
            raise RuntimeError(f"sub-env {env_id} has no open episode")
        return ep

    def codes(self, agent_ids: tuple) -> np.ndarray:
        """The code of each agent id (agents never seen before get one)."""
        try:
            return np.fromiter(map(self._codes.__getitem__, agent_ids), np.int64, len(agent_ids))
        except KeyError:
            for a in agent_ids:
                self._code(a)
            return np.fromiter(map(self._codes.__getitem__, agent_ids), np.int64, len(agent_ids))

    def _code(self, agent_id: Any) -> int:
        code = self._codes.get(agent_id)
        if code is None:
            code = self._codes[agent_id] = len(self._agents)
            self._agents.append(agent_id)
            if code >= self.traj.shape[1]:  # room for more agents: double the columns
                self._sum_due()  # (the slots of the logged rewards move)
                grow = max(4, self.traj.shape[1])
                for name, fill in (("traj", -1), ("policy", -1), ("index", 0)):
                    old = getattr(self, name)
                    setattr(self, name, np.pad(old, ((0, 0), (0, grow)), constant_values=fill))
                self.pending = np.pad(self.pending, ((0, 0), (0, grow)))
                self.returns = np.pad(self.returns, ((0, 0), (0, grow)))
                self._views()
        return code

    def look_up(
        self, rows: EnvRows, done: np.ndarray | None, poll: int, policies: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Everything a poll's rows change in their agents' slots, for all rows at once:
        agents new to their episode are mapped (``Episode.policy_for``, once per agent per
        episode), rewards count towards the returns (those without an observation are held
        for the agent's next transition, closing agents that ended with one), new
        trajectories open, and the agents of ``done`` rows close.

        Returns the transitions each sub-env completed, and per row: trajectory id, agent
        index, reward (held ones added) and, with ``policies``, policy (an index into
        ``policy_ids``; else None). The arrays are shared with later polls: read them only.

        A poll laid out like an earlier one (the same agents of the same sub-envs, as when
        agents act together) reuses its slots, and, if no slot changed since, what was
        found in them (``_Layout``)."""
        layout = self._layout(rows)
        era = self._era
        self._due.append((layout.at, rows.rewards.copy()))  # (pipelines may edit)
        if layout.found is not None and layout.era == era and not rows.extra_rewards:
            agent_steps, traj, index, pol = layout.found
        else:
            agent_steps, traj, layout = self._find(rows, layout, poll)
            index, pol = self._index_at[layout.at], self._policy_at[layout.at] if policies else None
        if len(self._due) >= _DUE_MAX:
            self._sum_due()
        rewards = rows.rewards
        if self._held:  # rewards held for agents without an observation
            at = layout.at
            pending = self._pending_at[at]
            self._pending_at[at] = 0.0
            rewards = rewards + pending
            self._held = bool(np.count_nonzero(self._pending_at))
        if done is not None:  # these rows end their agents' trajectories
            closing = traj[done]
            for t in closing[closing >= 0].tolist():
                self._traj.close(t)
            self._traj_at[layout.at[done]] = -1
            self._era += 1
        if self._era == era:  # nothing changed: what was found holds until something does
            layout.era, layout.found = era, (agent_steps, traj, index, pol)
        return agent_steps, traj, index, rewards, pol

    def _layout(self, rows: EnvRows) -> _Layout:
        """The slots of ``rows`` (their agents' codes, new agents given one), kept for
        polls laid out alike (at most ``_LAYOUTS_MAX``; forgotten when the slots move)."""
        key = (rows.agent_ids, rows.env_ids.tobytes())
        layout = self._layouts.get(key)
        if layout is None:
            codes = self.codes(rows.agent_ids)  # (may make room for more agents: new views)
            if len(self._layouts) >= _LAYOUTS_MAX:
                self._layouts.clear()
            layout = self._layouts[key] = _Layout(codes, self._first_slot[rows.env_ids] + codes)
        return layout

    def _find(
        self, rows: EnvRows, layout: _Layout, poll: int
    ) -> tuple[np.ndarray, np.ndarray, _Layout]:
        """What the slots of ``rows`` hold: agents new to their episode mapped, extra
        rewards given, new trajectories opened (``look_up``). Returns the transitions
        each sub-env completed, the rows' trajectory ids and their layout (a new one if
        extra rewards made room for more agents)."""
        env_ids, codes = rows.env_ids, layout.codes
        traj = self._traj_at[layout.at]
        new = traj < 0  # (an agent without a policy in this episode has no trajectory)
        fresh = np.count_nonzero(new)
        if fresh:
            self._map_new(env_ids, codes, layout.at, new)
        agent_steps = np.bincount(env_ids[~new] if fresh else env_ids, minlength=self.num_envs)
        if rows.extra_rewards:  # (may make room for more agents: new views, new layouts)
            self._add_extra_rewards(rows, poll, agent_steps)
            layout = self._layout(rows)
        if fresh:
            self._era += 1
            slots, at = self._traj_at, layout.at
            for k in np.flatnonzero(new).tolist():
                e, code = int(env_ids[k]), int(codes[k])
                traj[k] = slots[at[k]] = self._traj.new(self._agents[code], self._episode(e))
        return agent_steps, traj, layout

    def _map_new(
        self, env_ids: np.ndarray, codes: np.ndarray, at: np.ndarray, new: np.ndarray
    ) -> None:
        """Map the agents of rows ``new`` that have no policy in their episode yet."""
        unmapped = new & (self._policy_at[at] < 0)
        for k in np.flatnonzero(unmapped).tolist():
            self._map(int(env_ids[k]), int(codes[k]))

    def _sum_due(self) -> None:
        """Add the rewards logged since the last call to the returns, in the order they came
        (``np.add.at``: the same sums as adding them one poll at a time)."""
        due = self._due
        if not due:
            return
        at, rewards = (np.concatenate(c) for c in zip(*due))
        due.clear()
        np.add.at(self._returns_at, at, rewards)
        np.add.at(self.total, at // self.width, rewards)  # (a slot's sub-env)

    def _map(self, e: int, code: int) -> int:
        """Map agent ``code`` of sub-env ``e``'s episode to its policy (once per episode)."""
        ep, agent = self._episode(e), self._agents[code]
        pid = ep.policy_for(agent)
        k = self._pid_index.get(pid)
        if k is None:
            raise ValueError(
                f"policy_mapping_fn mapped agent {agent!r} to policy {pid!r}, which the "
                f"runner does not have (its policies: {self.policy_ids})"
            )
        self.policy[e, code] = k
        self.index[e, code] = ep.agent_index(agent)
        self._era += 1
        return k

    def _add_extra_rewards(self, rows: EnvRows, poll: int, agent_steps: np.ndarray) -> None:
        """Rewards given without an observation: into the episode's totals, and held for
        the agent's next transition (closing an agent that ended with one)."""
        for e, a, rew, te, tr in rows.extra_rewards:
            if self._episodes[e] is None:
                continue
            code = self._code(a)
            if self.policy[e, code] < 0:
                self._map(e, code)
            self._due.append((np.array([e * self.width + code]), np.array([rew])))
            if self.traj[e, code] >= 0:
                self.pending[e, code] += rew
                self._held = True
                if te or tr:
                    self._close_agent(e, code, (te, tr), poll, agent_steps)

    def _close_agent(
        self, e: int, code: int, flags: tuple[bool, bool], poll: int, agent_steps: np.ndarray
    ) -> None:
        """End a trajectory whose agent got no final observation.

        Its last transition repeats the agent's last observation as ``new_obs`` and holds
        the reward accumulated since its last action (no observation is made up).
        """
        traj_id = int(self.traj[e, code])
        collector = self._collectors[self.policy_ids[self.policy[e, code]]]
        rows = np.flatnonzero(collector.trajectory_ids() == traj_id)
        self.traj[e, code] = -1
        self._traj.close(traj_id)
        self._era += 1
        pending, self.pending[e, code] = float(self.pending[e, code]), 0.0
        if not len(rows):
            return
        cols = collector.copy_rows(rows[-1:])
        cols["rewards"] = np.asarray([pending], dtype=cols["rewards"].dtype)
        cols["terminateds"] = np.asarray([flags[0]])
        cols["truncateds"] = np.asarray([flags[1]])
        cols["infos"] = [EMPTY_INFO]
        cols["t"] = np.asarray([self._lengths[e]], dtype=np.int64)
        collector.add_rows(np.asarray([traj_id]), poll, cols, last=True)
        agent_steps[e] += 1

    def close_open_agents(
        self, env_id: int, flags: tuple[bool, bool], poll: int, agent_steps: np.ndarray
    ) -> None:
        """The episode in ``env_id`` ended: close every agent still waiting to act."""
        for code in np.flatnonzero(self.traj[env_id] >= 0).tolist():
            self._close_agent(env_id, code, flags, poll, agent_steps)

    def write_returns(self, env_id: int, episode: Episode) -> None:
        """``episode``'s ``agent_rewards`` and ``total_reward`` made current."""
        self._sum_due()
        pids, agents = self.policy_ids, self._agents
        policy, returns = self.policy[env_id], self.returns[env_id]
        episode.agent_rewards = {
            (agents[c], pids[policy[c]]): float(returns[c])
            for c in np.flatnonzero(policy >= 0).tolist()
        }
        episode.total_reward = float(self.total[env_id])

    def write_open_returns(self) -> None:
        """Every running episode's returns made current (before a batch is handed out:
        postprocessing and its callbacks see the episodes)."""
        for e, ep in enumerate(self._episodes):
            if ep is not None:
                self.write_returns(e, ep)

    def close_episode(self, env_id: int, episode: Episode) -> None:
        """``env_id``'s ``episode`` ended: its totals written, its agents forgotten (their
        trajectories close)."""
        self.write_returns(env_id, episode)
        for t in self.traj[env_id][self.traj[env_id] >= 0].tolist():
            self._traj.close(t)
        self.traj[env_id] = -1
        self.policy[env_id] = -1
        self._era += 1
        self.pending[env_id] = 0.0
        self.returns[env_id] = 0.0
        self.total[env_id] = 0.0

    def observation_fn(self, rows: EnvRows, fn: Callable[..., Any], **context: Any) -> list:
        """``RunnerConfig.observation_fn`` applied per sub-env; returns the new obs list."""
        obs = list(rows.obs)
        by_env: dict[int, list[int]] = {}
        for i, e in enumerate(rows.env_ids.tolist()):
            by_env.setdefault(e, []).append(i)
        for e, members in by_env.items():
            agent_obs = {rows.agent_ids[i]: obs[i] for i in members}
            new = fn(agent_obs=agent_obs, episode=self._episode(e), **context)
            if set(new) != set(agent_obs):
                raise ValueError(
                    f"observation_fn must return the same agents {sorted(map(str, agent_obs))}, "
                    f"got {sorted(map(str, new))}"
                )
            for i in members:
                obs[i] = new[rows.agent_ids[i]]
        return obs
