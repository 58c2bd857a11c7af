"""The episode state an ``ExternalEnv`` shares with the runner: episodes, lanes, replies.

``EpisodeHub`` is the thread-safe meeting point: simulator threads call ``start`` /
``add_returns`` / ``observe`` (through the ``ExternalEnv`` episode API) and the runner's
``ExternalEnvAdapter.poll`` takes the queued events, one per lane. The episode errors live
here so both sides can raise them; their public home is ``rlconnect.envs.external``.
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
import numpy as np

from rlconnect.envs.rewards import scalar_reward
from rlconnect.errors import EnvError

__all__ = [
    "BadObservationError",
    "EpisodeError",
    "EpisodeHub",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
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


_NO_ACTION = object()
_MAX_IDS = 100_000  # ids of finished (and of timed-out) episodes remembered, oldest dropped


def check_obs(space: gym.Space, obs: Any, label: str) -> Any:
    """``obs`` converted to the space's dtype, or BadObservationError naming the mismatch.

    A Box takes real numbers and bools only: a cast would drop the imaginary part of a
    complex number (gymnasium's Box has no complex dtype) or read a string as a number.
    """
    if isinstance(space, gym.spaces.Box):
        try:
            kind = np.asarray(obs).dtype.kind
            if kind not in "biuf":
                what = "complex numbers" if kind == "c" else f"values of dtype kind {kind!r}"
                raise TypeError(f"it holds {what}; send real {space.dtype} values")
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
        self.timed_out: collections.deque[Any] = collections.deque(maxlen=_MAX_IDS)
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
            for a, value in rewards.items():
                r = scalar_reward(value)
                if r is None:
                    raise EpisodeError(
                        f"episode {eid!r}: reward {value!r} of agent {a!r} is not a number "
                        "or an array of size one"
                    )
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
        while len(self.finished) > _MAX_IDS:
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
            if not ep.training:  # drop its inference state, as end_episode does
                reset = functools.partial(_reset_inference, env_id=ep.lane)
                self.tasks.append((reset, _Reply()))
            elif ep.seen:
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
