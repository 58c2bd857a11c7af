"""The episode state an ``ExternalEnv`` shares with the runner: episodes, lanes, replies.

``EpisodeHub`` is the thread-safe meeting point: simulator threads (or a policy server's
event loop) call ``start`` / ``add_returns`` / ``observe`` and the runner's
``ExternalEnvAdapter.poll`` takes the queued events, one per lane. A new episode gets an
empty lane when there is one, and only otherwise a lane whose ended episode still has
events queued, so backlogs spread over the lanes and drain in parallel. The episode
errors live here so both sides can raise them; their public home is
``rlconnect.envs.external``.

A reply (``Reply``) is how an action comes back: a waiting thread blocks on its event,
while a server gives it a ``notify`` callback and a ``deliver`` hook on the hub, so one
sampling step hands all its actions to the server's thread at once.
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.envs.rewards import scalar_reward
from rlconnect.errors import EnvError

__all__ = [
    "BadActionError",
    "BadObservationError",
    "EpisodeError",
    "EpisodeHub",
    "QueueFullError",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
    "check_action",
    "check_obs",
]

_PUBLIC_HOME = "rlconnect.envs.external"  # shown in tracebacks, as before the split


class EpisodeError(ValueError):
    """A call that does not fit the episode it names (duplicate, finished, ...)."""

    __module__ = _PUBLIC_HOME


class UnknownEpisodeError(EpisodeError, KeyError):
    """No running episode has this id."""

    __module__ = _PUBLIC_HOME

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class TooManyEpisodesError(EpisodeError):
    """``max_concurrent`` episodes are already running."""

    __module__ = _PUBLIC_HOME


class BadObservationError(EpisodeError):
    """An observation does not fit the observation space."""

    __module__ = _PUBLIC_HOME


class BadActionError(EpisodeError):
    """A logged action does not fit the action space."""

    __module__ = _PUBLIC_HOME


class QueueFullError(EnvError):
    """The steps waiting for the runner already fill the queue: retry later (back-pressure)."""

    __module__ = _PUBLIC_HOME


NO_ACTION = object()
_MAX_IDS = 100_000  # ids of finished (and of timed-out) episodes remembered, oldest dropped
MAX_ID_CHARS = 256
"""Longest episode id (characters of a string id), so remembered ids stay bounded."""


def check_episode_id(eid: Any) -> None:
    """EpisodeError unless ``eid`` is a string of at most ``MAX_ID_CHARS`` or a 64-bit int."""
    if isinstance(eid, bool) or not isinstance(eid, str | int):
        raise EpisodeError(f"episode ids are strings or ints, got {type(eid).__name__}")
    if isinstance(eid, str) and len(eid) > MAX_ID_CHARS:
        raise EpisodeError(f"episode ids are limited to {MAX_ID_CHARS} characters")
    if isinstance(eid, int) and not -(1 << 63) <= eid < (1 << 63):
        raise EpisodeError("integer episode ids must fit in 64 bits")


def check_obs(space: gym.Space, obs: Any, label: str) -> Any:
    """``obs`` converted to the space's dtype, or BadObservationError naming the mismatch.

    A Box takes real numbers only, finite and inside its bounds: a cast would drop the
    imaginary part of a complex number or read a string as a number, bools are not numbers
    (unless the Box holds bools), fractions are not integers, and a NaN or an out-of-bounds
    value would stop the runner's checks later (after the request was answered). Floats of
    another width are cast, as any env's observations are.
    """
    if isinstance(space, gym.spaces.Box):
        return _box_obs(space, obs, label)
    try:
        ok = space.contains(obs)
    except Exception:
        ok = False
    if not ok:
        raise BadObservationError(f"{label}: observation {obs!r:.80} is not in {space}")
    return obs


def _box_obs(space: gym.spaces.Box, obs: Any, label: str) -> np.ndarray:
    try:
        raw = np.asarray(obs)
    except (TypeError, ValueError) as exc:
        raise BadObservationError(f"{label}: cannot read {obs!r:.80} as {space}: {exc}") from None
    kind, want = raw.dtype.kind, space.dtype.kind
    problem = None
    if kind not in "biuf":
        what = "complex numbers" if kind == "c" else f"values of dtype kind {kind!r}"
        problem = (
            f"cannot read {obs!r:.80} as {space}: it holds {what}; send real {space.dtype} values"
        )
    elif raw.shape != space.shape:
        problem = f"observation has shape {raw.shape}, the space {space} wants {space.shape}"
    elif kind == "b" and want != "b":
        problem = f"observation holds bools; the space {space} wants {space.dtype} numbers"
    elif kind == "f" and not np.isfinite(raw).all():
        problem = "observation holds NaN or infinite values"
    elif kind == "f" and want in "iu" and (raw != np.round(raw)).any():
        problem = f"observation holds fractions; the space {space} wants integers"
    elif want != "b" and not ((raw >= space.low) & (raw <= space.high)).all():
        problem = f"observation {obs!r:.80} has values outside the bounds of {space}"
    if problem is not None:
        raise BadObservationError(f"{label}: {problem}")
    return raw.astype(space.dtype, copy=False)


def check_action(space: gym.Space, action: Any, label: str) -> Any:
    """A logged ``action`` that the runner can record, or BadActionError: a Box action must
    be finite real numbers of the space's shape (not clipped: a policy's sample may lie
    outside the bounds), any other space's action must be in the space."""
    if isinstance(space, gym.spaces.Box):
        try:
            raw = np.asarray(action)
            ok = raw.dtype.kind in "iuf" and raw.shape == space.shape and np.isfinite(raw).all()
        except (TypeError, ValueError):
            ok = False
        if ok:
            return raw.astype(space.dtype, copy=False)
    else:
        try:
            ok = not isinstance(action, str | bytes) and space.contains(
                np.asarray(action) if isinstance(action, list) else action
            )
        except Exception:
            ok = False
        if ok:
            return action
    raise BadActionError(f"{label}: logged action {action!r:.80} does not fit {space}")


class Reply:
    """Where the runner's answer to one call is delivered: ``value`` or ``error``.

    A thread blocks on ``event``; a server passes ``notify`` instead (called with the reply
    once it is done, through the hub's ``deliver`` hook) and no event is made.
    """

    __slots__ = ("done", "error", "event", "notify", "value")

    def __init__(self, notify: Callable[[Reply], None] | None = None) -> None:
        self.notify = notify
        self.event = threading.Event() if notify is None else None
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout: float, what: str) -> Any:
        assert self.event is not None, "a reply with a notify callback is not waited on"
        if not self.event.wait(timeout):
            raise TimeoutError(f"{what}: no action within {timeout:g} s (is the runner sampling?)")
        if self.error is not None:
            raise self.error
        return self.value


def notify_each(replies: list[Reply]) -> None:
    for reply in replies:
        assert reply.notify is not None
        reply.notify(reply)


class _Episode:
    __slots__ = (
        "eid",
        "infos",
        "lane",
        "last_obs",
        "reply",
        "rewards",
        "seen",
        "touched",
        "training",
    )

    def __init__(self, eid: Any, lane: int, training: bool) -> None:
        self.eid = eid
        self.lane = lane  # negative for episodes that are served but not recorded
        self.training = training
        self.rewards: dict[Any, float] = {}
        self.infos: dict[Any, dict] = {}
        self.seen = False  # an observation has been queued
        self.last_obs: dict[Any, Any] | None = None
        self.reply: Reply | None = None  # the latest get_action's
        self.touched = time.monotonic()

    @property
    def waiting(self) -> bool:
        """A get_action of this episode has no answer yet."""
        return self.reply is not None and not self.reply.done


class _Event:
    """One queued observation (``kind`` "obs", "end" or "timeout") of one episode."""

    __slots__ = ("ep", "first", "infos", "kind", "logged", "obs", "reply", "rewards")

    def __init__(self, ep, kind, obs, rewards, infos, logged, reply, first) -> None:
        self.ep, self.kind, self.obs, self.rewards, self.infos = ep, kind, obs, rewards, infos
        self.logged, self.reply, self.first = logged, reply, first


class EpisodeHub:
    """The thread-safe state shared by the simulator threads and the runner's poll.

    All values are dicts keyed by agent id (single-agent envs use ``DEFAULT_AGENT_ID``).
    ``ready`` lists the lanes with queued events (oldest first), ``queued`` counts the
    events; ``max_batch`` and ``batch_wait_s`` are the batching window of ``poll``.
    """

    def __init__(
        self,
        obs_space: Callable[[Any], gym.Space],
        max_concurrent: int,
        act_space: Callable[[Any], gym.Space] | None = None,
    ) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a positive int, got {max_concurrent!r}")
        self.obs_space = obs_space
        self.act_space = act_space
        self.max_concurrent = max_concurrent
        self.get_action_timeout_s = 300.0
        self.episode_timeout_s: float | None = None
        self.max_batch = max_concurrent
        self.batch_wait_s = 0.0
        self.max_queued = max(4096, 16 * max_concurrent)
        self.deliver: Callable[[list[Reply]], None] = notify_each
        self.cond = threading.Condition()
        self.episodes: dict[Any, _Episode] = {}
        self.finished: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.lanes: list[collections.deque[_Event]] = [
            collections.deque() for _ in range(max_concurrent)
        ]
        self.lane_owner: list[Any] = [None] * max_concurrent
        self.free_lanes = list(range(max_concurrent))  # a heap: the lowest lane first
        self.draining: set[int] = set()  # free lanes whose ended episodes have events queued
        self.ready: dict[int, None] = {}
        self.ready_since = 0.0
        self.queued = 0
        self.last_poll = time.monotonic()
        self.tasks: collections.deque[tuple[Callable[[Any], Any], Reply]] = collections.deque()
        self.timed_out: collections.deque[Any] = collections.deque(maxlen=_MAX_IDS)
        self.closed = False
        self._untrained = itertools.count()
        self._next_expiry = 0.0

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
            check_episode_id(eid)
            if eid in self.episodes or eid in self.finished:
                raise EpisodeError(f"episode id {eid!r} is already in use; ids must be unique")
            if len(self.episodes) >= self.max_concurrent:
                raise TooManyEpisodesError(
                    f"max_concurrent={self.max_concurrent} episodes are already running; end "
                    "one first or build the env with a larger max_concurrent"
                )
            if training:
                lane = self._free_lane()
                self.lane_owner[lane] = eid
            else:  # served through inference with its own env id, never a lane
                lane = -2 - next(self._untrained)
            self.episodes[eid] = _Episode(eid, lane, training)
            return eid

    def _free_lane(self) -> int:
        """The lowest empty free lane, else the lowest one still draining an ended episode."""
        if self.free_lanes:
            return heapq.heappop(self.free_lanes)
        lane = min(self.draining)
        self.draining.discard(lane)
        return lane

    def has_room(self, events: int, episodes: int) -> bool:
        """Whether ``events`` more events and ``episodes`` new episodes fit now (lock held)."""
        return (
            self.queued + events <= self.max_queued
            and len(self.episodes) + episodes <= self.max_concurrent
        )

    def add_returns(self, eid: Any, rewards: dict, infos: dict | None) -> None:
        with self.cond:
            ep = self._get(eid)
            self._add_rewards(ep, self._checked_rewards(eid, rewards))
            for a, info in (infos or {}).items():
                ep.infos.setdefault(a, {}).update(info)

    def _checked_rewards(self, eid: Any, rewards: dict) -> dict[Any, float]:
        out = {}
        for a, value in rewards.items():
            r = scalar_reward(value)
            if r is None:
                raise EpisodeError(
                    f"episode {eid!r}: reward {value!r} of agent {a!r} is not a number "
                    "or an array of size one"
                )
            if not np.isfinite(r):
                raise EpisodeError(f"episode {eid!r}: reward {r} of agent {a!r} is not finite")
            out[a] = r
        return out

    @staticmethod
    def _add_rewards(ep: _Episode, rewards: dict[Any, float]) -> None:
        for a, r in rewards.items():
            ep.rewards[a] = ep.rewards.get(a, 0.0) + r

    def _checked_obs(self, eid: Any, obs: dict) -> dict:
        return {
            a: check_obs(self.obs_space(a), o, f"episode {eid!r}, agent {a!r}")
            for a, o in obs.items()
        }

    def observe(self, eid: Any, obs: dict, logged: Any, kind: str = "obs") -> Reply | None:
        """Queue an observation; returns where the action will come for ``get_action``."""
        with self.cond:
            ep = self._get(eid)
            checked = self._checked_obs(eid, obs)
            if logged is not NO_ACTION and self.act_space is not None:
                logged = {
                    a: check_action(self.act_space(a), x, f"episode {eid!r}, agent {a!r}")
                    for a, x in logged.items()
                }
            reply = Reply() if logged is NO_ACTION and kind == "obs" else None
            self._record(ep, checked, logged, kind, reply)
            return reply

    def act(
        self, steps: list[tuple[Any, dict, dict]], notify: Callable[[Reply], None] | None = None
    ) -> list[Reply]:
        """``get_action`` for several episodes, given as (id, observations, rewards of the
        step before): everything is checked before anything is queued, so one bad part
        refuses the whole call and changes nothing."""
        with self.cond:
            checked = []
            for eid, obs, rewards in steps:
                ep = self._get(eid)
                checked.append(
                    (ep, self._checked_obs(eid, obs), self._checked_rewards(eid, rewards))
                )
            if len({id(ep) for ep, _, _ in checked}) < len(checked):
                raise EpisodeError("an episode can ask for one action at a time, not two at once")
            replies = []
            for ep, obs, rewards in checked:
                self._add_rewards(ep, rewards)
                reply = Reply(notify)
                self._record(ep, obs, NO_ACTION, "obs", reply)
                replies.append(reply)
            return replies

    def _record(self, ep: _Episode, obs: dict, logged: Any, kind: str, reply: Reply | None):
        """Queue checked observations of ``ep`` (lock held)."""
        if kind == "end":
            self._finish(ep)
        if not ep.training:
            self._serve_untrained(ep, obs, kind, reply)
            return
        if kind == "end" and not ep.seen:
            return  # nothing was recorded: no rows
        ev = _Event(ep, kind, obs, ep.rewards, ep.infos, logged, reply, not ep.seen)
        ep.rewards, ep.infos, ep.seen, ep.last_obs = {}, {}, True, obs
        if reply is not None:
            ep.reply = reply
        self._queue(ep.lane, ev)

    def _queue(self, lane: int, ev: _Event) -> None:
        self.lanes[lane].append(ev)
        self.queued += 1
        if not self.ready:
            self.ready_since = time.monotonic()
            self.cond.notify_all()
        self.ready[lane] = None
        if len(self.ready) >= self.batch_target():
            self.cond.notify_all()

    def batch_target(self) -> int:
        """Lanes with events that make a full batch: ``max_batch``, or every lane in use."""
        return max(1, min(self.max_batch, self.max_concurrent - len(self.free_lanes)))

    def _serve_untrained(self, ep: _Episode, obs: dict, kind: str, reply: Reply | None) -> None:
        ep.rewards, ep.infos = {}, {}
        key = ep.lane  # a negative inference env id, distinct per episode
        if kind == "end":
            self.tasks.append((lambda runner: _reset_inference(runner, key), Reply()))
        elif reply is not None:
            self.tasks.append(
                (lambda runner: runner.compute_actions(obs, explore=False, env_id=key), reply)
            )
        self.cond.notify_all()

    def _finish(self, ep: _Episode) -> None:
        self.episodes.pop(ep.eid, None)
        self.finished[ep.eid] = None
        while len(self.finished) > _MAX_IDS:
            self.finished.popitem(last=False)
        if ep.lane >= 0:
            self._release(ep.lane)

    def _release(self, lane: int) -> None:
        """A lane's episode ended: the lane is free (draining while events are queued)."""
        self.lane_owner[lane] = None
        if self.lanes[lane]:
            self.draining.add(lane)
        else:
            heapq.heappush(self.free_lanes, lane)

    # -- the runner side ----------------------------------------------------------------
    def take_events(self) -> list[_Event]:
        """One queued event of every ready lane (lock held); drained lanes are freed."""
        events = []
        still: dict[int, None] = {}
        for lane in self.ready:
            queue = self.lanes[lane]
            events.append(queue.popleft())
            if queue:
                still[lane] = None
            elif lane in self.draining:
                self.draining.discard(lane)
                heapq.heappush(self.free_lanes, lane)
        self.queued -= len(events)
        self.ready = still
        self.ready_since = time.monotonic() - self.batch_wait_s  # a backlog goes at once
        return events

    def complete(self, replies: list[Reply]) -> None:
        """Mark ``replies`` done: wake their threads, hand the others to ``deliver``."""
        notified = []
        for reply in replies:
            reply.done = True
            if reply.event is not None:
                reply.event.set()
            else:
                notified.append(reply)
        if notified:
            self.deliver(notified)

    def expire(self, now: float) -> None:
        """Close episodes idle longer than ``episode_timeout_s`` as truncated (lock held);
        looks at most ten times per timeout (and once a second), not at every poll."""
        limit = self.episode_timeout_s
        if limit is None or now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, limit / 10)
        for ep in [e for e in self.episodes.values() if now - e.touched > limit]:
            if ep.waiting:
                continue
            if ep.training and ep.seen:  # queued before the lane is released
                ev = _Event(
                    ep, "timeout", ep.last_obs, ep.rewards, ep.infos, NO_ACTION, None, False
                )
                self._queue(ep.lane, ev)
            self._finish(ep)
            self.timed_out.append(ep.eid)
            if not ep.training:  # drop its inference state, as end_episode does
                reset = functools.partial(_reset_inference, env_id=ep.lane)
                self.tasks.append((reset, Reply()))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            pending = [ev.reply for lane in self.lanes for ev in lane if ev.reply is not None]
            pending += [r for _, r in self.tasks]
            for reply in pending:
                reply.error = EnvError("the external env was closed")
            self.cond.notify_all()
        self.complete(pending)


def _reset_inference(runner: Any, env_id: int) -> None:
    for pid in runner.policies:
        runner.agent_pipeline(pid).reset(env_id)
        runner.action_pipeline(pid).reset(env_id)
