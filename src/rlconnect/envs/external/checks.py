"""What a call on an external env's episodes must look like: its errors and its checks.

Every simulator call (an ``ExternalEnv``'s thread, or a request a policy server decodes) is
checked with these by the episode hub, once, before it queues anything: episode ids,
observations, rewards, infos, logged actions, and that each of them is a dict keyed by
agent id. The errors' public home is ``rlconnect.envs.external``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.envs.rewards import scalar_reward
from rlconnect.errors import EnvError

__all__ = [
    "MAX_ID_CHARS",
    "BadActionError",
    "BadObservationError",
    "BadRewardError",
    "EpisodeError",
    "QueueFullError",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
    "check_action",
    "check_agent_dict",
    "check_episode_id",
    "check_infos",
    "check_logged_actions",
    "check_obs",
    "check_rewards",
]

_PUBLIC_HOME = "rlconnect.envs.external"  # where users import them from, shown in tracebacks


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


class BadRewardError(EpisodeError):
    """A reward that is not a finite number (or an array of size one)."""

    __module__ = _PUBLIC_HOME


class BadActionError(EpisodeError):
    """A logged action does not fit the action space."""

    __module__ = _PUBLIC_HOME


class QueueFullError(EnvError):
    """The steps waiting for the runner already fill the queue: retry later (back-pressure)."""

    __module__ = _PUBLIC_HOME


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

    A Box takes real numbers only, finite and inside its bounds *in the dtype the runner
    stores* (1e300 sent as float64 for a float32 Box would become inf there): a cast would
    drop the imaginary part of a complex number or read a string as a number, bools are
    not numbers (unless the Box holds bools), fractions are not integers, and a NaN or an
    out-of-bounds value would stop the runner's checks later (after the request was
    answered). Floats of another width are cast, as any env's observations are. Dict and
    Tuple observations are checked part by part, each part named in the message.
    """
    if isinstance(space, gym.spaces.Box):
        return _box_obs(space, obs, label)
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, Mapping) or set(obs) != set(space.spaces):
            raise BadObservationError(
                f"{label}: observation {obs!r:.80} is not a dict with the keys "
                f"{sorted(map(str, space.spaces))} of {space}"
            )
        return {k: check_obs(sub, obs[k], f"{label}, field {k!r}") for k, sub in space.items()}
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            raise BadObservationError(
                f"{label}: observation {obs!r:.80} is not a tuple of {len(space.spaces)} parts"
            )
        return tuple(
            check_obs(sub, o, f"{label}, part {i}")
            for i, (sub, o) in enumerate(zip(space.spaces, obs))
        )
    try:
        ok = space.contains(obs)
    except Exception:
        ok = False
    if not ok:
        raise BadObservationError(f"{label}: observation {obs!r:.80} is not in {space}")
    return obs


def _box_problem(space: gym.spaces.Box, obs: Any, raw: np.ndarray) -> str | None:
    """What makes ``raw`` (read from ``obs``) no value of ``space``, or None."""
    kind, want = raw.dtype.kind, space.dtype.kind
    if kind not in "biuf":
        what = "complex numbers" if kind == "c" else f"values of dtype kind {kind!r}"
        return (
            f"cannot read {obs!r:.80} as {space}: it holds {what}; send real {space.dtype} values"
        )
    if raw.shape != space.shape:
        return f"observation has shape {raw.shape}, the space {space} wants {space.shape}"
    if kind == "b" and want != "b":
        return f"observation holds bools; the space {space} wants {space.dtype} numbers"
    if kind == "f" and not np.isfinite(raw).all():
        return "observation holds NaN or infinite values"
    if kind == "f" and want in "iu" and (raw != np.round(raw)).any():
        return f"observation holds fractions; the space {space} wants integers"
    if want != "b" and not ((raw >= space.low) & (raw <= space.high)).all():
        return f"observation {obs!r:.80} has values outside the bounds of {space}"
    if want in "iuf" and not _fits(raw, space.dtype):
        return (
            f"observation {obs!r:.80} has values beyond what {space.dtype} holds (the runner "
            f"stores {space.dtype}: they would become inf or wrap); send values within "
            f"{_range_of(space.dtype)}"
        )
    return None


def _fits(raw: np.ndarray, dtype: np.dtype) -> bool:
    """Every value of ``raw`` is a finite value of ``dtype`` (an integer dtype's range)."""
    if raw.size == 0 or np.can_cast(raw.dtype, dtype, "safe"):
        return True
    lo, hi = _range_of(dtype)
    return bool((raw >= lo).all() and (raw <= hi).all())


def _range_of(dtype: np.dtype) -> tuple[Any, Any]:
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    return info.min, info.max


def _box_obs(space: gym.spaces.Box, obs: Any, label: str) -> np.ndarray:
    try:
        raw = np.asarray(obs)
    except (TypeError, ValueError) as exc:
        raise BadObservationError(f"{label}: cannot read {obs!r:.80} as {space}: {exc}") from None
    problem = _box_problem(space, obs, raw)
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


def check_agent_dict(value: Any, what: str, episode_id: Any) -> Mapping:
    """``value`` when it is a non-empty dict keyed by agent id (the observations, actions
    or rewards of a multi-agent call), else EpisodeError naming ``what``."""
    if not isinstance(value, Mapping) or not value:
        raise EpisodeError(
            f"episode {episode_id!r}: {what} must be a non-empty dict keyed by agent id, "
            f"got {type(value).__name__}"
        )
    return value


def check_rewards(rewards: Any, eid: Any) -> dict[Any, float]:
    """``rewards`` (a non-empty dict keyed by agent id) as floats, or BadRewardError: each
    must be a finite real number, or an array of size one holding one; bools and strings
    are not numbers (though numpy would read ``True`` or ``"1.5"`` as one)."""
    out = {}
    for a, value in check_agent_dict(rewards, "rewards", eid).items():
        r = _real_number(value)
        if r is None:
            raise BadRewardError(
                f"episode {eid!r}: reward {value!r:.80} of agent {a!r} is not a number "
                "or an array of size one"
            )
        if not np.isfinite(r):
            raise BadRewardError(f"episode {eid!r}: reward {r} of agent {a!r} is not finite")
        out[a] = r
    return out


def _real_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (a Python int of any size within
    float's range too) or an array of size one of real numbers, else None."""
    if isinstance(value, bool | np.bool_ | str | bytes):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return None
    try:
        kind = np.asarray(value).dtype.kind
    except (TypeError, ValueError, OverflowError):
        return None
    return scalar_reward(value) if kind in "iuf" else None


def check_logged_actions(
    act_space: Callable[[Any], gym.Space] | None, actions: Any, obs: Mapping, eid: Any
) -> dict:
    """Logged ``actions`` (a dict keyed by agent id, one per agent in ``obs``), each one
    checked against its agent's action space (``check_action``), or an episode error."""
    actions = check_agent_dict(actions, "actions", eid)
    if set(actions) != set(obs):
        raise EpisodeError(
            f"episode {eid!r}: log_action needs one action per observing agent; "
            f"observations for {sorted(map(str, obs))}, actions for "
            f"{sorted(map(str, actions))}"
        )
    if act_space is None:
        return dict(actions)
    return {
        a: check_action(act_space(a), x, f"episode {eid!r}, agent {a!r}")
        for a, x in actions.items()
    }


def check_infos(infos: Any, eid: Any) -> dict[Any, Mapping]:
    """``infos`` (None, or a dict keyed by agent id of info dicts) as a dict, or
    EpisodeError naming the agent whose info is not a dict."""
    if infos is None:
        return {}
    for a, info in check_agent_dict(infos, "infos", eid).items():
        if not isinstance(info, Mapping):
            raise EpisodeError(
                f"episode {eid!r}: the info of agent {a!r} must be a dict, got "
                f"{type(info).__name__}"
            )
    return dict(infos)
