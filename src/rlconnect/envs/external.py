"""External simulators that ask for actions, adapted to the BaseEnv the runner drives.

A simulator that cannot be stepped (a game server, a robot, a web service) runs in an
``ExternalEnv`` thread and calls, per episode::

    eid = self.start_episode()
    action = self.get_action(eid, obs)        # on-policy: the runner's policy decides
    self.log_returns(eid, reward)            # summed until the next action
    self.log_action(eid, obs, action)        # off-policy: the logged action is recorded
    self.end_episode(eid, obs)               # the last transition is terminated

``ExternalEnvAdapter`` is the BaseEnv face: each running episode holds one *lane* (a
sub-env id, ``0 .. max_concurrent - 1``); ``poll()`` hands out at most one queued event per
lane, so every lane is a sequence of episodes exactly like a stepped sub-env.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.errors import EnvError

__all__ = [
    "BadObservationError",
    "EpisodeError",
    "ExternalEnv",
    "ExternalEnvAdapter",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
    "apply_logged_actions",
]


class EpisodeError(ValueError):
    """A call that does not fit the episode it names (duplicate, finished, ...)."""


class UnknownEpisodeError(EpisodeError, KeyError):
    """No running episode has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TooManyEpisodesError(EpisodeError):
    """``max_concurrent`` episodes are already running."""


class BadObservationError(EpisodeError):
    """An observation does not fit the observation space."""


_NO_ACTION = object()


def check_obs(space: gym.Space, obs: Any, label: str) -> Any:
    """``obs`` converted to the space's dtype, or BadObservationError naming the mismatch."""
    if isinstance(space, gym.spaces.Box):
        try:
            arr = np.asarray(obs, dtype=space.dtype)
        except (TypeError, ValueError) as exc:
            raise BadObservationError(
                f"{label}: cannot read {obs!r:.80} as {space}: {exc}"
            ) from None
        if arr.shape != space.shape:
            raise BadObservationError(
                f"{label}: observation has shape {arr.shape}, the space {space} wants {space.shape}"
            )
        return arr
    try:
        ok = space.contains(obs)
    except Exception:
        ok = False
    if not ok:
        raise BadObservationError(f"{label}: observation {obs!r:.80} is not in {space}")
    return obs


class _Reply:
    """Where the runner's action for one ``get_action`` call is delivered."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float, what: str) -> Any:
        if not self.event.wait(timeout):
            raise TimeoutError(f"{what}: no action within {timeout:g} s (is the runner sampling?)")
        if self.error is not None:
            raise self.error
        return self.value


class _Episode:
    __slots__ = ("eid", "infos", "lane", "last_obs", "rewards", "seen", "touched", "training")

    def __init__(self, eid: Any, lane: int, training: bool) -> None:
        self.eid = eid
        self.lane = lane  # negative for episodes that are served but not recorded
        self.training = training
        self.rewards: dict[Any, float] = {}
        self.infos: dict[Any, dict] = {}
        self.seen = False  # an observation has been queued
        self.last_obs: dict[Any, Any] | None = None
        self.touched = time.monotonic()


class _Event:
    """One queued observation (``kind`` "obs", "end" or "timeout") of one episode."""

    __slots__ = ("ep", "first", "infos", "kind", "logged", "obs", "reply", "rewards")

    def __init__(self, ep, kind, obs, rewards, infos, logged, reply, first) -> None:
        self.ep, self.kind, self.obs, self.rewards, self.infos = ep, kind, obs, rewards, infos
        self.logged, self.reply, self.first = logged, reply, first


class EpisodeHub:
    """The thread-safe state shared by the simulator threads and the runner's poll.

    All values are dicts keyed by agent id (single-agent envs use ``DEFAULT_AGENT_ID``).
    """

    def __init__(self, obs_space: Callable[[Any], gym.Space], max_concurrent: int) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a positive int, got {max_concurrent!r}")
        self.obs_space = obs_space
        self.max_concurrent = max_concurrent
        self.get_action_timeout_s = 300.0
        self.episode_timeout_s: float | None = None
        self.cond = threading.Condition()
        self.episodes: dict[Any, _Episode] = {}
        self.finished: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.lanes: list[collections.deque[_Event]] = [
            collections.deque() for _ in range(max_concurrent)
        ]
        self.lane_owner: list[Any] = [None] * max_concurrent
        self.tasks: collections.deque[tuple[Callable[[Any], Any], _Reply]] = collections.deque()
        self.timed_out: list[Any] = []
        self.closed = False
        self._untrained = itertools.count()

    # -- the simulator side -------------------------------------------------------------
    def _get(self, eid: Any) -> _Episode:
        ep = self.episodes.get(eid)
        if ep is None:
            why = "has ended" if eid in self.finished else "was never started"
            raise UnknownEpisodeError(f"episode {eid!r} {why}; start one with start_episode()")
        ep.touched = time.monotonic()
        return ep

    def start(self, eid: Any, training: bool) -> Any:
        with self.cond:
            if self.closed:
                raise EnvError("the external env is closed")
            eid = uuid.uuid4().hex if eid is None else eid
            if eid in self.episodes or eid in self.finished:
                raise EpisodeError(f"episode id {eid!r} is already in use; ids must be unique")
            if len(self.episodes) >= self.max_concurrent:
                raise TooManyEpisodesError(
                    f"max_concurrent={self.max_concurrent} episodes are already running; end one "
                    "first or build the env with a larger max_concurrent"
                )
            if training:
                lane = self.lane_owner.index(None)
                self.lane_owner[lane] = eid
            else:  # served through inference with its own env id, never a lane
                lane = -2 - next(self._untrained)
            self.episodes[eid] = _Episode(eid, lane, training)
            return eid

    def add_returns(self, eid: Any, rewards: dict, infos: dict | None) -> None:
        with self.cond:
            ep = self._get(eid)
            for a, r in rewards.items():
                r = float(r)
                if not np.isfinite(r):
                    raise EpisodeError(f"episode {eid!r}: reward {r} of agent {a!r} is not finite")
                ep.rewards[a] = ep.rewards.get(a, 0.0) + r
            for a, info in (infos or {}).items():
                ep.infos.setdefault(a, {}).update(info)

    def observe(self, eid: Any, obs: dict, logged: Any, kind: str = "obs") -> _Reply | None:
        """Queue an observation; returns where the action will come for ``get_action``."""
        with self.cond:
            ep = self._get(eid)
            checked = {
                a: check_obs(self.obs_space(a), o, f"episode {eid!r}, agent {a!r}")
                for a, o in obs.items()
            }
            if kind == "end":
                self._finish(ep)
            reply = _Reply() if logged is _NO_ACTION and kind == "obs" else None
            if not ep.training:
                return self._serve_untrained(ep, checked, kind, reply)
            if kind == "end" and not ep.seen:
                return None  # nothing was recorded: no rows
            ev = _Event(ep, kind, checked, ep.rewards, ep.infos, logged, reply, not ep.seen)
            ep.rewards, ep.infos, ep.seen, ep.last_obs = {}, {}, True, checked
            self.lanes[ep.lane].append(ev)
            self.cond.notify_all()
            return reply

    def _serve_untrained(self, ep: _Episode, obs: dict, kind: str, reply: _Reply | None):
        ep.rewards, ep.infos = {}, {}
        key = ep.lane  # a negative inference env id, distinct per episode
        if kind == "end":
            self.tasks.append((lambda runner: _reset_inference(runner, key), _Reply()))
        elif reply is not None:
            self.tasks.append(
                (lambda runner: runner.compute_actions(obs, explore=False, env_id=key), reply)
            )
        self.cond.notify_all()
        return reply

    def _finish(self, ep: _Episode) -> None:
        self.episodes.pop(ep.eid, None)
        self.finished[ep.eid] = None
        while len(self.finished) > 100_000:
            self.finished.popitem(last=False)
        if ep.lane >= 0:
            self.lane_owner[ep.lane] = None

    def expire(self, now: float) -> None:
        """Close episodes idle longer than ``episode_timeout_s`` as truncated (lock held)."""
        limit = self.episode_timeout_s
        if limit is None:
            return
        for ep in [e for e in self.episodes.values() if now - e.touched > limit]:
            waiting = (
                any(
                    ev.reply is not None and not ev.reply.event.is_set()
                    for ev in self.lanes[ep.lane]
                )
                if ep.lane >= 0
                else False
            )
            if waiting:
                continue
            self._finish(ep)
            self.timed_out.append(ep.eid)
            if ep.training and ep.seen:
                ev = _Event(
                    ep, "timeout", ep.last_obs, ep.rewards, ep.infos, _NO_ACTION, None, False
                )
                self.lanes[ep.lane].append(ev)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            pending = [ev.reply for lane in self.lanes for ev in lane if ev.reply is not None]
            pending += [r for _, r in self.tasks]
            for reply in pending:
                reply.error = EnvError("the external env was closed")
                reply.event.set()
            self.cond.notify_all()


def _reset_inference(runner: Any, env_id: int) -> None:
    for pid in runner.policies:
        runner.agent_pipeline(pid).reset(env_id)
        runner.action_pipeline(pid).reset(env_id)


def _unstack(actions: Any, n: int) -> list[Any]:
    if isinstance(actions, list):
        return actions
    return [tree.map_structure(lambda a, i=i: a[i], actions) for i in range(n)]


class ExternalEnvAdapter(BaseEnv):
    """The BaseEnv face of an ExternalEnv: one lane (sub-env id) per running episode.

    Counts as one env when the runner sizes batches (``fragment_envs``); a
    ``truncate_episodes`` batch holds ``rollout_fragment_length`` steps over all lanes.
    """

    fragment_envs = 1
    poll_timeout_s = 1.0

    def __init__(self, external: Any, *, multi_agent: bool = False) -> None:
        self.external = external
        self.hub: EpisodeHub = external._hub
        self.num_envs = self.hub.max_concurrent
        self.is_multi_agent = multi_agent
        self.possible_agents = tuple(getattr(external, "possible_agents", ()) or ())
        self._awaiting: dict[int, tuple[_Event, dict]] = {}
        self._runner: Any = None

    def observation_space(self, agent_id: Any) -> gym.Space:
        return self.external.agent_observation_space(agent_id)

    def action_space(self, agent_id: Any) -> gym.Space:
        return self.external.agent_action_space(agent_id)

    def attach_runner(self, runner: Any) -> None:
        """The runner whose policies serve episodes that are not recorded."""
        self._runner = runner

    def _check_thread(self) -> None:
        ext = self.external
        if not ext._launched:
            ext._launched = True
            ext.start()
        if ext._error is not None:
            raise EnvError(f"the ExternalEnv thread raised {ext._error!r}") from ext._error
        if self.hub.closed and not any(self.hub.lanes):
            raise EnvError("the ExternalEnv was closed: no more episodes will come")
        if not ext.is_alive() and not self.hub.episodes and not any(self.hub.lanes):
            raise EnvError("the ExternalEnv thread's run() returned: no more episodes will come")

    def poll(self) -> EnvRows:
        self._check_thread()
        hub = self.hub
        deadline = time.monotonic() + self.poll_timeout_s
        with hub.cond:
            while True:
                hub.expire(time.monotonic())
                events = [lane.popleft() for lane in hub.lanes if lane]
                tasks = list(hub.tasks)
                hub.tasks.clear()
                left = deadline - time.monotonic()
                if events or tasks or left <= 0 or hub.closed or not self.external.is_alive():
                    break
                hub.cond.wait(min(left, 0.1))
        for fn, reply in tasks:
            try:
                reply.value = fn(self._runner)
            except Exception as exc:  # handed to the waiting simulator call
                reply.error = exc
            reply.event.set()
        return self._rows(events)

    def _rows(self, events: list[_Event]) -> EnvRows:
        ids: list[int] = []
        agents: list[Any] = []
        obs: list[Any] = []
        rew: list[float] = []
        term: list[bool] = []
        trunc: list[bool] = []
        infos: list[dict] = []
        first: list[bool] = []
        stepped: list[int] = []
        done: dict[int, tuple[bool, bool]] = {}
        extra: list[tuple[int, Any, float, bool, bool]] = []
        logged: dict[tuple[int, Any], Any] = {}
        for ev in events:
            lane = ev.ep.lane
            flags = {"obs": (False, False), "end": (True, False), "timeout": (False, True)}[ev.kind]
            if not ev.first:
                stepped.append(lane)
            if ev.kind != "obs":
                done[lane] = flags
            for a, o in ev.obs.items():
                ids.append(lane)
                agents.append(a)
                obs.append(o)
                rew.append(0.0 if ev.first else ev.rewards.get(a, 0.0))
                term.append(flags[0])
                trunc.append(flags[1])
                info = dict(ev.infos.get(a, {}))
                if ev.kind == "timeout":
                    info["episode_timeout"] = True
                infos.append(info)
                first.append(ev.first)
                if ev.logged is not _NO_ACTION:
                    logged[(lane, a)] = ev.logged[a]
            for a, r in ev.rewards.items():
                if a not in ev.obs and not ev.first:
                    extra.append((lane, a, r, False, False))
            if ev.kind == "obs":
                self._awaiting[lane] = (ev, {})
        rows = ExternalRows.from_lists(
            ids,
            tuple(agents),
            obs,
            rew,
            term,
            trunc,
            infos,
            first,
            stacked=False,
            stepped=stepped,
            done_envs=done,
            extra_rewards=extra,
        )
        rows.logged_actions = logged
        return rows

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        for lane, agent, act in zip(env_ids.tolist(), agent_ids, _unstack(actions, len(env_ids))):
            pending = self._awaiting.get(lane)
            if pending is None:
                continue
            ev, got = pending
            got[agent] = act
            if len(got) == len(ev.obs):
                del self._awaiting[lane]
                ev.ep.touched = time.monotonic()
                if ev.reply is not None:
                    ev.reply.value = got
                    ev.reply.event.set()

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Nothing to do: the lane's next episode starts when its simulator says so."""
        self._awaiting.pop(env_id, None)

    def close(self) -> None:
        self.hub.close()


class ExternalRows(EnvRows):
    """EnvRows plus the actions logged with ``log_action``, by ``(env_id, agent_id)``."""

    __slots__ = ("logged_actions",)


def apply_logged_actions(
    policy: Any,
    logged: dict[tuple[int, Any], Any],
    env_ids: np.ndarray,
    agent_ids: tuple,
    actions: Any,
    fetches: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """Replace the policy's actions by logged ones; ``action_logp`` becomes their log-prob.

    Rows without a logged action keep the policy's output. When the policy cannot score an
    action (no distribution), a logged row's ``action_logp`` is NaN.
    """
    rows = [i for i, k in enumerate(zip(env_ids.tolist(), agent_ids)) if k in logged]
    if not rows:
        return actions, fetches
    leaves = [np.array(x, copy=True) for x in tree.flatten(actions)]
    for i in rows:
        given = tree.flatten(logged[(int(env_ids[i]), agent_ids[i])])
        for leaf, val in zip(leaves, given):
            leaf[i] = np.asarray(val, dtype=leaf.dtype)
    actions = tree.unflatten_as(actions, leaves)
    fetches = dict(fetches)
    if "action_logp" in fetches:
        logp = np.array(fetches["action_logp"], copy=True)
        logp[rows] = _logp(policy, fetches, actions, np.asarray(rows))
        fetches["action_logp"] = logp
    return actions, fetches


def _logp(policy: Any, fetches: dict[str, Any], actions: Any, rows: np.ndarray) -> np.ndarray:
    dist, inputs = getattr(policy, "dist", None), fetches.get("action_dist_inputs")
    if dist is None or inputs is None or not isinstance(actions, np.ndarray):
        return np.full(len(rows), np.nan, dtype=np.float32)
    import torch

    with torch.inference_mode():
        out = dist.logp_torch(
            torch.as_tensor(np.asarray(inputs)[rows], dtype=torch.float32),
            torch.as_tensor(actions[rows]),
        )
    return out.numpy().astype(np.float32)


class ExternalEnv(threading.Thread):
    """A simulator that asks for actions; override ``run()`` (see the module doc).

    The runner starts the thread (a daemon) at its first poll. Episodes started with
    ``training_enabled=False`` are served by the runner's policies in eval mode (between
    sampling steps) but make no rows and no metrics.

    Args:
        action_space, observation_space: the spaces of the (single) agent.
        max_concurrent: episodes that may run at once; ``start_episode`` beyond it raises
            ``TooManyEpisodesError``.
        get_action_timeout_s: how long ``get_action`` waits for the runner.
        episode_timeout_s: an episode without calls for this long is closed as truncated
            (its last transition repeats the last observation; ``infos`` say
            ``episode_timeout``); None keeps episodes open forever.
    """

    _ids = itertools.count()

    def __init__(
        self,
        action_space: gym.Space,
        observation_space: gym.Space,
        max_concurrent: int = 100,
        *,
        get_action_timeout_s: float = 300.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"ExternalEnv-{next(self._ids)}")
        self.action_space = action_space
        self.observation_space = observation_space
        self.max_concurrent = max_concurrent
        self._hub = EpisodeHub(self.agent_observation_space, max_concurrent)
        self._hub.get_action_timeout_s = get_action_timeout_s
        self._hub.episode_timeout_s = episode_timeout_s
        self._launched = False
        self._error: BaseException | None = None
        user_run = self.run
        self.run = lambda: self._guarded(user_run)  # type: ignore[method-assign]

    def _guarded(self, run: Callable[[], Any]) -> None:
        try:
            run()
        except BaseException as exc:  # reported by the runner's next poll
            self._error = exc
            with self._hub.cond:
                self._hub.cond.notify_all()

    def run(self) -> None:
        """Drive the simulator: override this."""
        raise NotImplementedError("override ExternalEnv.run() to drive your simulator")

    # spaces by agent id, for the adapter
    def agent_observation_space(self, agent_id: Any) -> gym.Space:
        return self.observation_space

    def agent_action_space(self, agent_id: Any) -> gym.Space:
        return self.action_space

    @property
    def timed_out_episodes(self) -> list[Any]:
        """Ids of episodes closed because they had no call for ``episode_timeout_s``."""
        with self._hub.cond:
            return list(self._hub.timed_out)

    @property
    def num_running_episodes(self) -> int:
        with self._hub.cond:
            return len(self._hub.episodes)

    def start_episode(self, episode_id: Any = None, training_enabled: bool = True) -> Any:
        """Start an episode; returns its id (a new uuid hex string when None is given)."""
        return self._hub.start(episode_id, bool(training_enabled))

    def get_action(self, episode_id: Any, observation: Any) -> Any:
        """Record ``observation`` and return the policy's action for it (blocks)."""
        reply = self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, _NO_ACTION)
        got = reply.wait(self._hub.get_action_timeout_s, f"episode {episode_id!r}")
        return got[DEFAULT_AGENT_ID]

    def log_action(self, episode_id: Any, observation: Any, action: Any) -> None:
        """Record ``observation`` and the ``action`` taken by someone else (off-policy)."""
        self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, {DEFAULT_AGENT_ID: action})

    def log_returns(self, episode_id: Any, reward: float, info: dict | None = None) -> None:
        """Add ``reward`` to the current step (summed until the next action)."""
        self._hub.add_returns(
            episode_id,
            {DEFAULT_AGENT_ID: reward},
            None if info is None else {DEFAULT_AGENT_ID: info},
        )

    def end_episode(self, episode_id: Any, observation: Any) -> None:
        """End the episode: ``observation`` is the last one, the transition is terminated."""
        self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, _NO_ACTION, kind="end")
