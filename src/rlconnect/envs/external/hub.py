"""The episodes an ``ExternalEnv`` shares with the runner, behind one lock: ``EpisodeHub``.

``EpisodeHub`` is a monitor: its lock, its episodes, its lanes (``lanes``), its queue of
work for the sampling thread and its limits (a frozen ``HubLimits``) are private, and every
operation takes the lock itself. Three kinds of caller use it, each in one direction:

- the simulator side (an ``ExternalEnv``'s thread, or a policy server's event loop) starts
  episodes and queues their observations and rewards (``start``, ``observe``, ``act``,
  ``add_returns``), asks for work on the sampling thread (``submit``, ``withdraw``) and
  checks for room (``admit``, ``forget_ended``); every such call is checked here, before
  anything is queued, whoever makes it (``checks``);
- the runner's ``ExternalEnvAdapter.poll`` takes a batch (``take_batch``: one event per
  ready lane, and the queued work) and answers it (``answer``, ``complete``); the work
  gets the runner's ``ServedInference``, never the runner;
- the owner sets the limits and the delivery of answers (``set_limits``,
  ``set_delivery``) and closes it.

Answers come back as replies (``replies``): a waiting thread blocks on one, a
server gives each a ``notify`` callback and sets the hub's delivery, so one sampling step
hands all its actions to the server's thread at once.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from rlconnect.envs.base import ServedInference
from rlconnect.envs.external.checks import (
    EpisodeError,
    QueueFullError,
    TooManyEpisodesError,
    UnknownEpisodeError,
    check_agent_dict,
    check_episode_id,
    check_infos,
    check_logged_actions,
    check_obs,
    check_rewards,
)
from rlconnect.envs.external.lanes import Lanes
from rlconnect.envs.external.limits import HubLimits
from rlconnect.envs.external.replies import Reply, Task, notify_each
from rlconnect.errors import EnvError

__all__ = ["NO_ACTION", "EpisodeHub"]

NO_ACTION = object()
_MAX_IDS = 100_000  # ids of finished (and of timed-out) episodes remembered, oldest dropped


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

    def __init__(
        self,
        ep: _Episode,
        kind: str,
        obs: dict,
        rewards: dict,
        infos: dict,
        logged: Any,
        reply: Reply | None,
        first: bool,
    ) -> None:
        self.ep, self.kind, self.obs, self.rewards, self.infos = ep, kind, obs, rewards, infos
        self.logged, self.reply, self.first = logged, reply, first


class EpisodeHub:
    """The thread-safe state shared by the simulator side and the runner's poll.

    All values are dicts keyed by agent id (single-agent envs use ``DEFAULT_AGENT_ID``),
    checked here whoever sends them: the one check of every call.
    """

    def __init__(
        self,
        obs_space: Callable[[Any], gym.Space],
        max_concurrent: int,
        act_space: Callable[[Any], gym.Space] | None = None,
        limits: HubLimits | None = None,
    ) -> None:
        if not isinstance(max_concurrent, int) or max_concurrent < 1:
            raise ValueError(f"max_concurrent must be a positive int, got {max_concurrent!r}")
        self._obs_space = obs_space
        self._act_space = act_space
        self._lanes = Lanes(max_concurrent)
        self._limits = (limits or HubLimits()).resolved(max_concurrent)
        self._deliver: Callable[[list[Reply]], None] = notify_each
        self._lock = threading.Condition()
        self._episodes: dict[Any, _Episode] = {}
        self._finished: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self._timed_out: collections.deque[Any] = collections.deque(maxlen=_MAX_IDS)
        self._tasks: collections.deque[Task] = collections.deque()
        self._closed = False
        self._last_poll = time.monotonic()
        self._untrained = itertools.count()
        self._next_expiry = 0.0

    # -- what it holds (reads of one value each; no lock needed) ------------------------
    @property
    def max_concurrent(self) -> int:
        """Episodes that may run at once (and lanes)."""
        return len(self._lanes.queues)

    @property
    def limits(self) -> HubLimits:
        """The limits in force, defaults filled in."""
        return self._limits

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called: no new episodes or steps are taken."""
        return self._closed

    @property
    def queued(self) -> int:
        """Events waiting for the runner."""
        return self._lanes.queued

    @property
    def has_events(self) -> bool:
        """Some lane has an event for the next poll."""
        return bool(self._lanes.ready)

    @property
    def running(self) -> int:
        """Episodes running now."""
        return len(self._episodes)

    @property
    def last_poll(self) -> float:
        """``time.monotonic()`` of the runner's latest poll."""
        return self._last_poll

    def timed_out_ids(self) -> list[Any]:
        """Ids of the episodes closed by ``episode_timeout_s`` (the latest 100 000)."""
        with self._lock:
            return list(self._timed_out)

    def counts(self) -> dict[str, int]:
        """How much it holds, for probes: open episodes, remembered ids, queued work."""
        with self._lock:
            return {
                "open_episodes": len(self._episodes),
                "finished_ids": len(self._finished),
                "timed_out_ids": len(self._timed_out),
                "queued": self._lanes.queued + len(self._tasks),
            }

    # -- the owner ----------------------------------------------------------------------
    def set_limits(self, limits: HubLimits) -> None:
        """Put ``limits`` in force (a policy server sets its own on the env it serves)."""
        resolved = limits.resolved(self.max_concurrent)
        with self._lock:
            self._limits = resolved
            self._next_expiry = 0.0
            self._lock.notify_all()

    def set_delivery(self, deliver: Callable[[list[Reply]], None] | None) -> None:
        """Who calls the ``notify`` of completed replies: ``deliver(replies)`` (a server
        hands them to its event loop), or None for the completing thread."""
        self._deliver = notify_each if deliver is None else deliver

    def wake(self) -> None:
        """Wake a waiting poll (the simulator thread stopped)."""
        with self._lock:
            self._lock.notify_all()

    def close(self, reason: BaseException | None = None) -> None:
        """No more episodes or work: every pending reply fails with ``reason`` (default an
        EnvError saying the env was closed)."""
        with self._lock:
            self._closed = True
            pending = [ev.reply for ev in self._lanes.queued_events() if ev.reply is not None]
            pending += [r for _, r in self._tasks]
            # taken by a step that never answered them (the runner failed midway)
            pending += [ep.reply for ep in self._episodes.values() if ep.waiting]
            pending = list({id(r): r for r in pending if r is not None}.values())
            self._tasks.clear()
            for reply in pending:
                reply.error = reason or EnvError("the external env was closed")
            self._lock.notify_all()
        self.complete(pending)

    # -- the simulator side -------------------------------------------------------------
    def _get(self, eid: Any) -> _Episode:
        ep = self._episodes.get(eid)
        if ep is None:
            why = "has ended" if eid in self._finished else "was never started"
            raise UnknownEpisodeError(f"episode {eid!r} {why}; start one with start_episode()")
        ep.touched = time.monotonic()
        return ep

    def start(self, eid: Any, training: bool) -> Any:
        """Start an episode (``eid`` None: a fresh id) and return its id; ``training`` False
        records no rows."""
        with self._lock:
            if self._closed:
                raise EnvError("the external env is closed")
            eid = uuid.uuid4().hex if eid is None else eid
            check_episode_id(eid)
            if eid in self._episodes or eid in self._finished:
                raise EpisodeError(f"episode id {eid!r} is already in use; ids must be unique")
            if len(self._episodes) >= self.max_concurrent:
                raise TooManyEpisodesError(
                    f"max_concurrent={self.max_concurrent} episodes are already running; end "
                    "one first or build the env with a larger max_concurrent"
                )
            # an untrained episode is served through inference with its own env id, no lane
            lane = self._lanes.assign() if training else -2 - next(self._untrained)
            self._episodes[eid] = _Episode(eid, lane, training)
            return eid

    def admit(self, events: int, episodes: int, what: str) -> None:
        """QueueFullError unless ``events`` more events and ``episodes`` new episodes fit
        now; ``what`` names the call in the message."""
        with self._lock:
            limit = self._limits.max_queued_steps
            assert limit is not None  # resolved
            if (
                self._lanes.queued + events <= limit
                and len(self._episodes) + episodes <= self.max_concurrent
            ):
                return
            raise QueueFullError(
                f"the runner has {self._lanes.queued} steps queued (at most {limit}) and "
                f"{len(self._episodes)} episodes running: {what} does not fit yet; retry"
            )

    def forget_ended(self, ids: set) -> None:
        """Remove from ``ids`` the episodes that are no longer running (ended, timed out)."""
        with self._lock:
            ids.intersection_update(self._episodes)

    def add_returns(self, eid: Any, rewards: Any, infos: Any) -> None:
        """Add ``rewards`` (and merge ``infos``, or None) by agent to the episode's step."""
        rewards, infos = check_rewards(rewards, eid), check_infos(infos, eid)
        with self._lock:
            ep = self._get(eid)
            self._add_rewards(ep, rewards)
            for a, info in infos.items():
                ep.infos.setdefault(a, {}).update(info)

    @staticmethod
    def _add_rewards(ep: _Episode, rewards: dict[Any, float]) -> None:
        for a, r in rewards.items():
            ep.rewards[a] = ep.rewards.get(a, 0.0) + r

    def _checked_obs(self, eid: Any, obs: Any) -> dict:
        return {
            a: check_obs(self._obs_space(a), o, f"episode {eid!r}, agent {a!r}")
            for a, o in check_agent_dict(obs, "observations", eid).items()
        }

    def _make_room(self, events: int, what: str) -> None:
        """Return once ``events`` more events fit ``max_queued_steps`` (lock held): at once,
        or after waiting for the runner to take some (``wait_for_room``); QueueFullError
        when they do not fit in time. Every route that queues steps comes through here."""
        limits = self._limits
        limit = limits.max_queued_steps
        assert limit is not None  # resolved
        deadline = time.monotonic() + (limits.get_action_timeout_s if limits.wait_for_room else 0)
        while self._lanes.queued + events > limit and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueFullError(
                    f"the runner has {self._lanes.queued} steps queued (at most {limit}, "
                    f"max_queued_steps): {what} does not fit yet; retry"
                )
            self._lock.wait(min(left, 0.1))

    def observe(self, eid: Any, obs: Any, logged: Any, kind: str = "obs") -> Reply | None:
        """Queue observations by agent, with the actions logged for them (or
        ``NO_ACTION``); returns where the action will come for ``get_action``."""
        with self._lock:
            if kind == "obs":  # an episode's end is bounded by the episodes running
                self._make_room(1, f"this step of episode {eid!r}")
            ep = self._get(eid)
            checked = self._checked_obs(eid, obs)
            if logged is not NO_ACTION:
                logged = check_logged_actions(self._act_space, logged, checked, eid)
            reply = Reply() if logged is NO_ACTION and kind == "obs" else None
            self._record(ep, checked, logged, kind, reply)
            return reply

    def act(
        self, steps: list[tuple[Any, Any, Any]], notify: Callable[[Reply], None] | None = None
    ) -> list[Reply]:
        """``get_action`` for several episodes, given as (id, observations, rewards of the
        step before or None), by agent: everything is checked before anything is queued,
        so one bad part refuses the whole call and changes nothing."""
        with self._lock:
            self._make_room(len(steps), f"{len(steps)} steps")
            checked = []
            for eid, obs, rewards in steps:
                ep = self._get(eid)
                got = {} if rewards is None else check_rewards(rewards, eid)
                checked.append((ep, self._checked_obs(eid, obs), got))
            if len({id(ep) for ep, _, _ in checked}) < len(checked):
                raise EpisodeError("an episode can ask for one action at a time, not two at once")
            replies = []
            for ep, obs, rewards in checked:
                self._add_rewards(ep, rewards)
                reply = Reply(notify)
                self._record(ep, obs, NO_ACTION, "obs", reply)
                replies.append(reply)
            return replies

    def submit(self, fn: Callable[[], Any]) -> Reply:
        """Queue work for the sampling thread: ``fn()`` runs there at its next poll
        (between two steps, so never beside a step in flight); the returned reply's event
        is set when it has run."""
        reply = Reply()
        with self._lock:
            if self._closed:
                raise EnvError("the external env is closed: no runner work is taken any more")
            self._tasks.append((lambda inference: fn(), reply))
            self._lock.notify_all()
        return reply

    def withdraw(self, reply: Reply) -> bool:
        """Take back submitted work no poll has taken yet (True), so it never runs; False
        when a poll took it already."""
        with self._lock:
            for task in self._tasks:
                if task[1] is reply:
                    self._tasks.remove(task)
                    return True
            return False

    def _record(self, ep: _Episode, obs: dict, logged: Any, kind: str, reply: Reply | None) -> None:
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
        if self._lanes.push(lane, ev) or len(self._lanes.ready) >= self._batch_target():
            self._lock.notify_all()

    def _batch_target(self) -> int:
        """Lanes with events that make a full batch: ``max_batch``, or every lane in use."""
        max_batch = self._limits.max_batch
        assert max_batch is not None  # resolved
        return max(1, min(max_batch, self._lanes.in_use))

    def _serve_untrained(self, ep: _Episode, obs: dict, kind: str, reply: Reply | None) -> None:
        ep.rewards, ep.infos = {}, {}
        key = ep.lane  # a negative inference env id, distinct per episode
        if kind == "end":
            self._tasks.append((functools.partial(_end_served, env_id=key), Reply()))
        elif reply is not None:
            self._tasks.append((functools.partial(_serve, obs=obs, env_id=key), reply))
        self._lock.notify_all()

    def _finish(self, ep: _Episode) -> None:
        self._episodes.pop(ep.eid, None)
        self._finished[ep.eid] = None
        while len(self._finished) > _MAX_IDS:
            self._finished.popitem(last=False)
        if ep.lane >= 0:
            self._lanes.release(ep.lane)

    # -- the runner side ----------------------------------------------------------------
    def take_batch(
        self, timeout_s: float, alive: Callable[[], bool]
    ) -> tuple[list[_Event], list[Task]]:
        """Wait for a batch (see ``_wait_for_batch``), then take one queued event of every
        ready lane and all queued runner work. ``alive()`` says whether events can still
        come (the simulator thread runs)."""
        with self._lock:
            self._wait_for_batch(timeout_s, alive)
            self._last_poll = time.monotonic()
            events = self._lanes.take() if self._lanes.ready else []
            tasks = list(self._tasks)
            self._tasks.clear()
            if events and self._limits.wait_for_room:
                self._lock.notify_all()  # simulator threads waiting for room
        return events, tasks

    def _wait_for_batch(self, timeout_s: float, alive: Callable[[], bool]) -> None:
        """Wait (lock held) for a batch: ``max_batch`` ready lanes, or every lane in use,
        or ``batch_wait_s`` after the first event came; at most ``timeout_s``."""
        lanes = self._lanes
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            self._expire(now)
            if self._tasks or self._closed or not alive():
                return
            if lanes.ready:
                left = lanes.ready_since + self._limits.batch_wait_s - now
                if left <= 0 or len(lanes.ready) >= self._batch_target():
                    return
            else:
                left = deadline - now
                if left <= 0:
                    return
            self._lock.wait(min(left, 0.1))

    def answer(self, answered: list[tuple[_Event, Any]]) -> None:
        """The runner's actions for taken events, as ``(event, actions by agent)``: their
        episodes were active now, and the replies waiting for them get their values."""
        now = time.monotonic()
        replies = []
        for ev, value in answered:
            ev.ep.touched = now
            if ev.reply is not None:
                ev.reply.value = value
                replies.append(ev.reply)
        self.complete(replies)

    def complete(self, replies: list[Reply]) -> None:
        """Mark ``replies`` done: wake their threads, hand the others to the delivery."""
        notified = []
        for reply in replies:
            reply.done = True
            if reply.event is not None:
                reply.event.set()
            else:
                notified.append(reply)
        if notified:
            self._deliver(notified)

    def expire(self, now: float) -> None:
        """Close the episodes idle longer than ``episode_timeout_s`` at ``now``."""
        with self._lock:
            self._next_expiry = 0.0
            self._expire(now)

    def _expire(self, now: float) -> None:
        """Close episodes idle longer than ``episode_timeout_s`` as truncated (lock held);
        looks at most ten times per timeout (and once a second), not at every poll."""
        limit = self._limits.episode_timeout_s
        if limit is None or now < self._next_expiry:
            return
        self._next_expiry = now + min(1.0, limit / 10)
        for ep in [e for e in self._episodes.values() if now - e.touched > limit]:
            if ep.waiting:
                continue
            if ep.training and ep.seen:  # queued before the lane is released
                assert ep.last_obs is not None  # a seen episode has observed
                ev = _Event(
                    ep, "timeout", ep.last_obs, ep.rewards, ep.infos, NO_ACTION, None, False
                )
                self._queue(ep.lane, ev)
            self._finish(ep)
            self._timed_out.append(ep.eid)
            if not ep.training:  # drop its inference state, as end_episode does
                reset = functools.partial(_end_served, env_id=ep.lane)
                self._tasks.append((reset, Reply()))


def _serve(inference: ServedInference, obs: dict, env_id: int) -> dict:
    """The actions of an episode that is served, not recorded (eval mode, its own state)."""
    return inference.compute_actions(obs, explore=False, env_id=env_id)


def _end_served(inference: ServedInference, env_id: int) -> None:
    """A served episode ended (or timed out): its connector state goes."""
    inference.reset(env_id)
