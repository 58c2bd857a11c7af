"""What the runner does when a sub-env, a policy or an action goes wrong.

- A sub-env that raised in ``step``/``reset`` (or returned an observation that cannot be
  one of its space) is restarted when ``RunnerConfig.restart_failed_sub_environments`` is
  set: its episode is dropped and reported with ``episode_faulty=True``. A sub-env that
  fails ``sub_env_restart_limit + 1`` times without completing one episode in between
  (failing at reset, or after some good steps) raises ``EnvError`` instead, so a sub-env
  that fails in every episode never makes ``sample()`` loop forever.
  Without restarts, ``EnvError`` names the sub-env, with the original error as
  ``__cause__``.
- With restarts on, every poll is also screened for non-finite observations and rewards
  (and, while ``check_env`` checks, for anything outside the spaces): such a sub-env is
  treated as failed, so its bad rows never reach connectors, statistics or batches.
- A policy that raises, or returns actions outside the env's action space, gives a
  ``PolicyError`` naming the policy id (and the bad values): an env is never stepped with
  an action it did not declare.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.errors import (
    EnvCheckError,
    EnvError,
    EnvTimeoutError,
    PolicyError,
    describe_exception,
)
from rlconnect.spaces import batch_in_space, batch_len, describe_space, stack_samples

__all__ = [
    "ActionCheck",
    "SubEnvFaults",
    "bad_rows",
    "check_actions",
    "check_finite",
]

_SHOWN = 5
_PYTHON_SUM_MAX = 32  # observation values summed in Python rather than numpy (check_finite)


class SubEnvFaults:
    """Per sub-env failure counts and the decision: restart, or raise."""

    def __init__(self, num_envs: int, *, restart: bool, limit: int) -> None:
        self.restart = restart
        self.limit = limit
        #: failures of each sub-env since its last completed (non-faulty) episode
        self.in_a_row = np.zeros(num_envs, dtype=np.int64)

    def on_error(self, env_id: int, exc: BaseException) -> None:
        """Raise unless sub-env ``env_id`` may be restarted after ``exc``."""
        if not self.restart:
            if isinstance(exc, EnvCheckError | EnvTimeoutError):  # ours: names the env already
                raise exc
            raise EnvError(
                f"sub-env {env_id} raised {describe_exception(exc)} (set "
                "RunnerConfig(restart_failed_sub_environments=True) to restart it instead)"
            ) from exc
        self.in_a_row[env_id] += 1
        if self.in_a_row[env_id] > self.limit:
            raise EnvError(
                f"sub-env {env_id} failed {self.in_a_row[env_id]} times in a row without "
                f"completing an episode (last: {describe_exception(exc)}); gave up after "
                f"{self.limit} restarts (RunnerConfig.sub_env_restart_limit)"
            ) from exc

    def episodes_completed(self, env_ids: Iterable[int]) -> None:
        """Sub-envs ``env_ids`` completed an episode (terminated or truncated, not
        dropped): their failure streaks end. Completed steps do not end a streak, or a
        sub-env failing at the same step of every episode would be restarted forever."""
        for e in env_ids:
            self.in_a_row[e] = 0


def _finite_rows(obs: Any, n: int) -> np.ndarray:
    """Per row: every float leaf of a stacked batch is finite."""
    ok = np.ones(n, dtype=bool)
    for leaf in tree.flatten(obs):
        arr = np.asarray(leaf)
        if arr.dtype.kind in "fc":
            ok &= np.isfinite(arr.reshape(n, -1)).all(axis=1)
    return ok


def _kinds(values: np.ndarray) -> str:
    """``"NaN"``, ``"inf"`` or ``"NaN and inf"``: what is not finite in ``values``."""
    found = (("NaN", np.isnan(values).any()), ("inf", np.isinf(values).any()))
    return " and ".join(k for k, bad in found if bad)


def _first_bad_obs(rows: EnvRows) -> tuple[int, str] | None:
    """The first row whose observation holds a NaN or inf, and which (None: all finite)."""
    obs = rows.obs
    if rows.stacked:
        leaves = [obs] if isinstance(obs, np.ndarray) else tree.flatten(obs)
        for leaf in leaves:
            arr = np.asarray(leaf)
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                i = int(np.flatnonzero(~_finite_rows(arr, len(rows)))[0])
                return i, _kinds(arr[i])
        return None
    for i, one in enumerate(obs):
        for leaf in tree.flatten(one):
            arr = np.asarray(leaf)
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                return i, _kinds(arr)
    return None


def check_finite(rows: EnvRows, poll: int, lengths: np.ndarray) -> None:
    """Raise ``EnvCheckError`` naming sub-env, agent, field and step when an observation
    or reward of ``rows`` is NaN or inf (``RunnerConfig.check_finite``; whole arrays at
    once, so a clean poll costs two dot products). ``lengths``: each sub-env's episode
    length before this poll."""
    obs = rows.obs
    if type(obs) is np.ndarray and obs.dtype.kind == "f":  # the common case: one sum
        rewards = rows.rewards
        if obs.size <= _PYTHON_SUM_MAX:  # a few values: Python's sum is cheaper than numpy's
            total = sum(obs.ravel().tolist()) + sum(rewards.tolist())
        elif obs.dtype.itemsize >= 4:  # sums of squares: BLAS dot products, cheaper still
            flat = obs.reshape(-1)
            total = flat.dot(flat) + rewards.dot(rewards)
        else:  # (float16 squares overflow early)
            total = np.add.reduce(obs, axis=None) + np.add.reduce(rewards)
        if math.isfinite(total):  # (NaN and inf propagate; an overflow is checked exactly below)
            return
    if np.isfinite(rows.rewards).all():
        found = _first_bad_obs(rows)
        if found is None:
            return
        i, what = found
        field = "obs"
        what = f"observation ({what})"
    else:
        i, field = int(np.flatnonzero(~np.isfinite(rows.rewards))[0]), "reward"
        what = f"reward ({rows.rewards[i]})"
    e = int(rows.env_ids[i])
    step = 0 if rows.is_first[i] else int(lengths[e]) + 1
    raise EnvCheckError(
        f"sub-env {e} / agent {rows.agent_ids[i]!r} returned a non-finite {what}, field "
        f"{field!r}, at step {step} of its episode (poll {poll}); "
        "fix the env, set RunnerConfig(restart_failed_sub_environments=True) to drop such "
        "episodes, or check_finite=False to keep the values"
    )


def bad_rows(env: BaseEnv, rows: EnvRows, *, full: bool) -> dict[int, EnvCheckError]:
    """Sub-envs whose rows hold a non-finite observation or reward (and, with ``full``,
    an observation outside its space), each with an error naming env, agent and what."""
    problems: dict[int, list[str]] = {}

    def note(i: int, what: str) -> None:
        e = int(rows.env_ids[i])
        problems.setdefault(e, []).append(f"env {e} / agent {rows.agent_ids[i]!r}: {what}")

    rewards = np.asarray(rows.rewards, dtype=np.float64)
    for i in np.flatnonzero(~np.isfinite(rewards)).tolist():
        note(i, f"reward {rewards[i]}")
    for _agent, space, idx, obs in _row_groups(env, rows):
        if space is None:  # an agent the env declares no space for: nothing to check against
            continue
        if obs is None:  # no stack: judge each row alone
            for i in idx.tolist():
                try:
                    one = stack_samples(space, [rows.obs[i]])
                except Exception as exc:
                    note(i, f"observation of a wrong structure ({describe_exception(exc)})")
                    continue
                if not _finite_rows(one, 1)[0] or (full and not batch_in_space(space, one)[0]):
                    note(i, "observation outside the space or not finite")
            continue
        ok = _finite_rows(obs, len(idx))
        for i in idx[~ok].tolist():
            note(i, "non-finite observation")
        if full:
            inside = batch_in_space(space, obs)
            for i in idx[ok & ~inside].tolist():
                note(i, f"observation outside {describe_space(space)}")
    return {
        e: EnvCheckError(
            "env returned bad data (restart_failed_sub_environments treats it as a failure): "
            + "; ".join(lines[:_SHOWN])
        )
        for e, lines in problems.items()
    }


def _space(get: Any, agent: Any) -> Any:
    try:
        return get(agent)
    except KeyError:
        return None


def _row_groups(env: BaseEnv, rows: EnvRows) -> list[tuple[Any, Any, np.ndarray, Any]]:
    """``(agent, its space, row indices, stacked obs or None)`` per agent of ``rows``."""
    if not len(rows):
        return []
    if rows.stacked:
        agent = rows.agent_ids[0]
        return [(agent, env.observation_space(agent), np.arange(len(rows)), rows.obs)]
    groups: dict[Any, list[int]] = {}
    for i, a in enumerate(rows.agent_ids):
        groups.setdefault(a, []).append(i)
    out = []
    for agent, members in groups.items():
        space = _space(env.observation_space, agent)
        obs = None
        if space is not None:
            try:
                obs = stack_samples(space, [rows.obs[i] for i in members])
            except Exception:
                obs = None
        out.append((agent, space, np.asarray(members, dtype=np.int64), obs))
    return out


def _fast_bad_rows(space: gym.Space, actions: np.ndarray, n: int) -> np.ndarray | bool | None:
    """Discrete and Box of the expected shape: bad rows, or None; False: not applicable."""
    if isinstance(space, gym.spaces.Discrete):
        if actions.shape != (n,) or actions.dtype.kind not in "iu":
            return False
        lo, hi = int(space.start), int(space.start) + int(space.n)
        if not n:
            return None
        if n <= 64:  # tiny batches: Python's min and max on a list are faster than numpy's
            values = actions.tolist()
            low, high = min(values), max(values)
        else:  # (not the builtins: they would walk the array element by element)
            low, high = actions.min(), actions.max()
        if low >= lo and high < hi:
            return None
        return np.asarray((actions < lo) | (actions >= hi))
    if isinstance(space, gym.spaces.Box):
        if actions.shape != (n, *space.shape) or actions.dtype.kind not in "biuf":
            return False
        flat = actions.reshape(n, -1)
        bad = (flat < space.low.reshape(-1)) | (flat > space.high.reshape(-1))
        if actions.dtype.kind == "f":
            bad |= ~np.isfinite(flat)
        return np.asarray(bad.any(axis=1)) if bad.any() else None
    return False


def _bad_action_rows(space: gym.Space, actions: Any, n: int) -> np.ndarray | None:
    """Rows whose action is not in ``space`` (None: all fine); fast for Discrete and Box."""
    if isinstance(actions, np.ndarray):
        fast = _fast_bad_rows(space, actions, n)
        if fast is None or isinstance(fast, np.ndarray):
            return fast
    try:
        inside = batch_in_space(space, actions)
    except Exception:
        return np.ones(n, dtype=bool)
    if len(inside) != n:
        return np.ones(n, dtype=bool)
    return None if inside.all() else ~inside


class ActionCheck:
    """``check_actions`` for one policy, with a fast path for single-agent envs (one
    action space, a plain array of actions): a few microseconds per step."""

    def __init__(self, env: BaseEnv, policy: Any, policy_id: str) -> None:
        self.env, self.policy, self.policy_id = env, policy, policy_id
        self.space = None
        with contextlib.suppress(Exception):  # then every call takes the general path
            self.space = self._one_space(env, policy)
        #: ``n`` of a ``Discrete(n)`` space starting at 0: integer actions take one reduction
        space = self.space
        self._discrete_n = (
            int(space.n)
            if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0
            else None
        )

    @staticmethod
    def _one_space(env: BaseEnv, policy: Any) -> gym.Space | None:
        """The one action space every row's action is checked against, if there is one:
        a single-agent env's; a multi-agent env's when every agent it names has the
        policy's action space (an agent it declares none for is checked against the
        policy's too)."""
        if not env.is_multi_agent:
            return env.action_space(DEFAULT_AGENT_ID)
        agents = getattr(env, "possible_agents", ())
        shared = policy.action_space
        if agents and all(env.action_space(a) == shared for a in agents):
            return shared
        return None

    def __call__(self, actions: Any, env_ids: np.ndarray, agent_ids: Sequence[Any]) -> None:
        """Raise if an action is outside its action space. Integer Discrete actions and a
        batch of one shared space take a vectorised fast path; the general check, which
        names the bad rows, runs only when that path cannot vouch for every row."""
        if (
            self._discrete_n is not None
            and type(actions) is np.ndarray
            and actions.shape == (len(env_ids),)
            and _discrete_ok(actions, self._discrete_n)
        ):
            return
        fast = (
            self.space is not None
            and type(actions) is np.ndarray
            and _fast_bad_rows(self.space, actions, len(env_ids)) is None
        )
        if not fast:  # the general path, which raises naming what is wrong
            check_actions(self.env, self.policy, self.policy_id, actions, env_ids, agent_ids)


def _discrete_ok(actions: np.ndarray, n: int) -> bool:
    """Whether integer ``actions`` all lie in ``[0, n)``: read as unsigned integers (a
    negative one wraps to a huge value) they must stay below ``n``, one ``maximum``
    reduction. False for other dtypes or no rows: the general check decides."""
    kind = actions.dtype.kind
    if kind not in "iu" or not len(actions):
        return False
    if len(actions) <= _PYTHON_MINMAX_ROWS:  # a few values: min and max cost less than a ufunc
        values = actions.tolist()
        return min(values) >= 0 and max(values) < n
    if kind == "i":
        actions = actions.view(_UNSIGNED[actions.dtype.itemsize])
    return int(np.maximum.reduce(actions)) < n


_PYTHON_MINMAX_ROWS = 16  # up to this many actions, Python's min and max check them
#: the unsigned integer dtype of each integer size (made once: parsing a dtype costs)
_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}


def check_actions(
    env: BaseEnv,
    policy: Any,
    policy_id: str,
    actions: Any,
    env_ids: np.ndarray,
    agent_ids: Sequence[Any],
) -> None:
    """Raise ``PolicyError`` naming the policy, the values, envs and agents when an action
    lies outside its agent's action space (the env is not stepped then). Agents the env
    declares no space for are checked against the policy's action space."""
    n = len(env_ids)
    try:
        got = batch_len(actions)
    except Exception:
        got = -1
    if got != n:
        raise PolicyError(
            f"policy {policy_id!r} returned {got if got >= 0 else 'no batch of'} actions for "
            f"{n} rows (env ids {sorted(set(env_ids.tolist()))[:_SHOWN]}); the env was not "
            "stepped"
        )
    spaces = {a: _space(env.action_space, a) for a in dict.fromkeys(agent_ids)}
    spaces = {a: policy.action_space if s is None else s for a, s in spaces.items()}
    if len({id(s) for s in spaces.values()}) == 1:
        space = next(iter(spaces.values()))
        bad = _bad_action_rows(space, actions, n)
        if bad is None:
            return
    else:  # agents of one policy with different action spaces: check them one by one
        bad = np.zeros(n, dtype=bool)
        for i, a in enumerate(agent_ids):
            row = tree.map_structure(lambda x, i=i: np.asarray(x)[i : i + 1], actions)
            bad[i] = _bad_action_rows(spaces[a], row, 1) is not None
        if not bad.any():
            return
        space = spaces[agent_ids[int(np.flatnonzero(bad)[0])]]
    shown = []
    for i in np.flatnonzero(bad)[:_SHOWN].tolist():
        try:
            value = tree.map_structure(lambda x, i=i: np.asarray(x)[i].tolist(), actions)
        except Exception:
            value = "<missing>"
        shown.append(f"{value!r} for env {int(env_ids[i])} / agent {agent_ids[i]!r}")
    raise PolicyError(
        f"policy {policy_id!r} returned actions outside the action space "
        f"{describe_space(space)}: "
        + "; ".join(shown)
        + f" ({int(bad.sum())} of {n} rows; the env was not stepped; make the policy output "
        "valid actions, or clip them with ClipActions / normalize_actions)"
    )
