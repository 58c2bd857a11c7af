"""EnvPool pools as a BaseEnv: ``"envpool:<task id>"`` or a pool the user built.

EnvPool steps its envs in C++ threads and autoresets them *next step*: the step after an
episode ended only resets the env (``info["elapsed_step"] == 0``, reward 0, the action
ignored). ``EnvPoolEnv`` sends a placeholder action for such an env when the runner asked
for its reset and reports that step as the first row of the new episode, never as an env
step, so every trajectory is exact and ends on its true final observation.

The runner's ``horizon`` H cuts episodes itself, as it does for every env, and the pool is
built with ``max_episode_steps=H + 1``: EnvPool marks a step at its own limit truncated
only, even when the episode ended there by the env's rules, so a limit of H would lose that
``terminated``. An episode the horizon cut but the pool did not end takes one more step
(the placeholder action), which ends it at the pool's limit and is no row; the step after
that resets it.

Synchronous pools (``batch_size == num_envs``) step every sub-env each poll. With
``env_poll_size=B`` the pool is built with ``batch_size=B``: a poll returns the first B
sub-envs that finished (rows sorted by env id) while the others keep stepping in EnvPool's
threads. Either way the pool is driven through EnvPool's public API only (``reset``,
``async_reset``, ``send``, ``recv``, ``config``, the spaces). The actions go out when the
runner says every row has its action (``all_actions_sent``), so EnvPool steps while the
runner records rows and ends episodes; ``poll()`` then only receives, blocking in ``recv``
until the step is done.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.batches.take import take_rows
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.rows import EnvRowsBuilder, errors_only, strictly_ascending
from rlconnect.envs.settings import EnvSettings
from rlconnect.envs.sub_envs import sub_env_seed
from rlconnect.errors import EnvError, describe_exception

__all__ = [
    "ENVPOOL_PREFIX",
    "LIGHT_FAMILIES",
    "EnvPoolEnv",
    "default_threads",
    "is_envpool",
    "make_envpool",
]

ENVPOOL_PREFIX = "envpool:"
#: EnvPool's task families whose sub-envs step in about a microsecond: less than the
#: runner's own work per row, so one EnvPool thread keeps up with the runner, and a thread
#: per CPU (EnvPool's default) only takes the CPU the runner needs and adds wake-ups
LIGHT_FAMILIES = ("envpool.classic_control", "envpool.toy_text")
#: EnvPool's own bookkeeping in ``info`` (and Atari's copy of the RAM): not row infos
_BOOKKEEPING = frozenset({"env_id", "players", "elapsed_step", "ram"})


def is_envpool(env: Any) -> bool:
    """True for ``"envpool:<task id>"`` and for pools built by ``envpool.make_*``."""
    if isinstance(env, str):
        return env.startswith(ENVPOOL_PREFIX)
    return any((c.__module__ or "").startswith("envpool") for c in type(env).__mro__)


def make_envpool(env: Any, settings: EnvSettings) -> EnvPoolEnv:
    """The BaseEnv of an EnvPool spec or pool (see the module docstring), with the
    runner's ``num_envs``, ``seed``, ``env_config``, ``env_poll_size``, ``horizon`` and
    ``preset`` (``soft_horizon`` is refused).

    With ``preset="atari"`` an Atari task is built with ``stack_num=1`` and hands out
    single ``(84, 84)`` gray frames: EnvPool does the frame skip, max-pooling, no-op and
    FIRE resets, gray scale and resize, the preset's connectors clip rewards and stack 4
    frames (copies of the first frame at a reset, as EnvPool's own stack), so the policy
    sees ``Box(0, 255, (4, 84, 84), uint8)`` and nothing is done twice.
    """
    seed, preset = settings.seed, settings.preset
    if settings.soft_horizon:
        raise ValueError(
            "RunnerConfig.soft_horizon=True cannot be used with EnvPool: a pool cannot keep an "
            "env running across the horizon; use soft_horizon=False (the runner then "
            "cuts episodes at the horizon)"
        )
    if not isinstance(env, str):
        _check_user_pool(env, settings.num_envs, settings.horizon)
        return EnvPoolEnv(env, frames=_single_frames(env, preset))
    task = env[len(ENVPOOL_PREFIX) :]
    if not task:
        raise ValueError(
            f"env {env!r}: name an EnvPool task after the prefix, e.g. 'envpool:Pong-v5'"
        )
    kwargs = _task_kwargs(task, settings)

    def build(restarts: int) -> Any:
        import envpool

        extra = {} if seed is None else {"seed": sub_env_seed(seed, 0, restarts)}
        return envpool.make_gymnasium(task, **kwargs, **extra)

    try:
        import envpool  # noqa: F401
    except ImportError:
        raise ImportError(f"env {env!r} needs EnvPool: pip install 'rlconnect[envpool]'") from None
    try:
        pool = build(0)
    except Exception as exc:  # EnvPool asserts on unknown tasks and bad arguments
        raise ValueError(
            f"env {env!r}: EnvPool cannot make task {task!r} with {kwargs}: "
            f"{describe_exception(exc)}"
        ) from exc
    return EnvPoolEnv(pool, rebuild=build, frames=_single_frames(pool, preset))


def _check_user_pool(pool: Any, num_envs: int, horizon: int | None) -> None:
    """A pool the user built must hold ``num_envs`` envs and truncate at the horizon."""
    size = int(pool.config["num_envs"])
    if size != num_envs:
        raise ValueError(
            f"the EnvPool pool holds {size} envs but RunnerConfig.num_envs={num_envs}: "
            "they must be equal"
        )
    limit = pool.config.get("max_episode_steps")
    if horizon is None or limit == horizon + 1:
        return
    if limit != horizon:
        raise ValueError(
            f"RunnerConfig.horizon={horizon} but the EnvPool pool truncates episodes at "
            f"max_episode_steps={limit}: build the pool with max_episode_steps="
            f"{horizon + 1} (the runner cuts episodes at the horizon itself, keeping "
            "EnvPool's terminated flag there), or pass 'envpool:<task id>'"
        )
    warnings.warn(
        f"the EnvPool pool truncates episodes at max_episode_steps={limit}, the horizon: "
        "an episode that ends by the env's rules at that very step is marked truncated "
        "only, since EnvPool reports its own limit that way; build the pool with "
        f"max_episode_steps={horizon + 1} to keep terminated there",
        UserWarning,
        stacklevel=3,
    )


def _task_kwargs(task: str, s: EnvSettings) -> dict[str, Any]:
    """``envpool.make_gymnasium``'s arguments for ``"envpool:<task>"`` (without the seed)."""
    kwargs = dict(s.env_config)
    kwargs["num_envs"] = s.num_envs
    if "num_threads" not in kwargs and (threads := default_threads(task)) is not None:
        kwargs["num_threads"] = threads
    if s.env_poll_size is not None and s.env_poll_size < s.num_envs:
        kwargs["batch_size"] = s.env_poll_size
    if s.horizon is not None:  # the runner cuts at the horizon (see the module docstring)
        kwargs["max_episode_steps"] = s.horizon + 1
    if s.preset == "atari":
        kwargs.setdefault("stack_num", 1)
    return kwargs


def default_threads(task: str) -> int | None:
    """EnvPool's ``num_threads`` for ``"envpool:<task>"`` when ``env_config`` names none:
    1 for the tasks of ``LIGHT_FAMILIES``, None (EnvPool's own default) for the others."""
    try:
        from envpool.registration import registry

        family = registry.specs[task][0]
    except Exception:  # an unknown task (EnvPool names it), another EnvPool version
        return None
    return 1 if family in LIGHT_FAMILIES else None


def _single_frames(pool: Any, preset: str | None) -> bool:
    """Whether the preset gets the pool's frames as ``(H, W)`` (stack of one dropped)."""
    if preset != "atari":
        return False
    shape = tuple(pool.observation_space.shape)
    if len(shape) == 3 and shape[0] == 1:
        return True
    raise ValueError(
        f"preset='atari' stacks frames itself, but this EnvPool pool's observations are "
        f"{shape}: build it with stack_num=1 and gray_scale=True (the defaults of "
        "'envpool:<Atari task>' with this preset), or leave the preset out to use EnvPool's "
        "own stacks"
    )


class EnvPoolEnv(BaseEnv):
    """An EnvPool pool (gymnasium API) behind the runner's ``BaseEnv`` contract."""

    def __init__(
        self, pool: Any, *, rebuild: Callable[[int], Any] | None = None, frames: bool = False
    ) -> None:
        self.pool = pool
        self._frames = frames  # hand out (H, W) frames of a (1, H, W) pool
        self._rebuild = rebuild
        self._restarts = 0
        self.num_envs = int(pool.config["num_envs"])
        batch = int(pool.config.get("batch_size") or self.num_envs)
        self.poll_size = batch
        self._async = batch < self.num_envs
        space = pool.observation_space
        if frames:
            space = gym.spaces.Box(space.low[0], space.high[0], dtype=space.dtype)
        self._obs_space: gym.Space = space
        self._act_space: gym.Space = pool.action_space
        self.possible_agents = (DEFAULT_AGENT_ID,)
        shape = self._act_space.shape or ()
        self._actions = np.zeros((self.num_envs, *shape), dtype=self._act_space.dtype)
        self._todo = np.zeros(self.num_envs, dtype=bool)  # an action or a reset is queued
        #: episodes the runner's horizon ended and the pool did not: their next step ends
        #: them at the pool's limit and is no row (``_cut_steps``)
        self._cut = np.zeros(self.num_envs, dtype=bool)
        self._cutting = False  # any of ``_cut`` set
        self._uncut: np.ndarray | None = None  # their steps left out of the last poll
        #: a full poll in env order (what a synchronous pool returns) is recognised by the
        #: bytes of its ``env_id`` and gets these ids, shared and read-only
        self._all_ids = np.arange(self.num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False
        self._in_order = np.arange(self.num_envs, dtype=np.int32).tobytes()
        #: sub-envs whose episode ended in the last poll: EnvPool resets them at their next
        #: step by itself, so their reset is queued with the poll and ``try_reset`` is a no-op
        self._autoreset: set[int] = set()
        self._sent = False  # a synchronous pool has every sub-env's step under way
        self._started = False
        self._broken: BaseException | None = None
        self._send_error: BaseException | None = None  # of the send in all_actions_sent

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The pool's single observation space (every agent id shares it)."""
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The pool's single action space (every agent id shares it)."""
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Queue ``actions`` of ``env_ids``; the pool steps them at the next poll."""
        self._queue(env_ids, actions)

    def all_actions_sent(self) -> None:
        """Start the pool's step now, while the runner records the poll: a synchronous pool
        once every sub-env has its action or reset, an asynchronous one for the sub-envs it
        has them for. A failure is the next poll's to report."""
        if not self._started or (not self._async and not self._all_queued()):
            return  # e.g. a sub-env the runner resets itself later: the next poll sends
        try:
            self._send()
        except Exception as exc:
            self._send_error = exc

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """The env's episode ended: its next step is EnvPool's reset step (the placeholder
        action is ignored; queued when the rows came back). An episode the pool did not end
        cannot be reset alone."""
        if env_id in self._autoreset:
            self._autoreset.discard(env_id)
            return
        self._cut[env_id] = self._cutting = True  # (``_cut_steps`` tells if it was)
        self._queue(np.array([env_id]), 0)

    def _queue(self, env_ids: Any, actions: Any) -> None:
        """Queue actions (0: the placeholder of a reset step) for the next send."""
        self._actions[env_ids] = actions
        self._todo[env_ids] = True

    def _all_queued(self) -> bool:
        """Whether every sub-env has an action or a reset queued (``count_nonzero`` is one
        C call; ``ndarray.all`` goes through a Python wrapper)."""
        return int(np.count_nonzero(self._todo)) == self.num_envs

    def try_restart(self, env_id: int) -> None:
        """A failed pool is rebuilt whole (once, at the first sub-env's restart)."""
        if self._broken is None:
            return  # rebuilt already for another sub-env of this failure
        cause, self._broken = self._broken, None
        if self._rebuild is None:
            raise EnvError(
                f"the EnvPool pool failed ({describe_exception(cause)}) and was built by the "
                "user, so it cannot be rebuilt: pass 'envpool:<task id>' as the env"
            ) from cause
        with contextlib.suppress(Exception):
            self.pool.close()
        self._restarts += 1
        try:
            self.pool = self._rebuild(self._restarts)
        except Exception as exc:
            raise EnvError(
                f"the EnvPool pool could not be rebuilt: {describe_exception(exc)}"
            ) from exc
        self._started = self._sent = self._cutting = False
        self._todo[:] = self._cut[:] = False

    def poll(self) -> EnvRows:
        """Step (or first reset) the pool and return its rows; when the pool as a whole
        fails, every sub-env's row carries the error."""
        try:
            if self._send_error is not None:
                cause, self._send_error = self._send_error, None
                raise cause
            out = self._step()
        except Exception as exc:  # the pool as a whole failed: every sub-env is reported
            self._broken = exc
            self._todo[:] = False
            self._sent = False
            rows = errors_only(dict.fromkeys(range(self.num_envs), exc))
        else:
            rows = self._rows(*out)
        if self._uncut is not None:  # the steps that ended cut episodes: next, their reset
            self._actions[self._uncut] = 0
            self._todo[self._uncut] = True
            self._uncut = None
        # EnvPool resets the sub-envs whose episode ended at their next step by itself
        ended = rows.done_envs
        self._autoreset = set(ended)
        if ended:  # (an index array: numpy converts a list anew for each assignment)
            self._queue(np.fromiter(ended, np.intp, len(ended)), 0)
        return rows

    def _step(self) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        pool = self.pool
        if not self._started:
            self._started = True
            if self._async:
                pool.async_reset()
                return pool.recv()
            obs, info = pool.reset()
            zeros = np.zeros(self.num_envs, dtype=bool)
            return obs, np.zeros(self.num_envs), zeros, zeros, info
        if not self._sent:
            self._send()
        self._sent = False
        return pool.recv()

    def _send(self) -> None:
        """Send the queued actions and resets (a synchronous pool: every sub-env's)."""
        if self._async:
            ids = np.flatnonzero(self._todo)
            if len(ids):
                self.pool.send(self._actions[ids], ids.astype(np.int32))
                self._todo[ids] = False
            return
        if not self._all_queued():
            missing = np.flatnonzero(~self._todo).tolist()[:5]
            raise RuntimeError(
                f"a synchronous EnvPool pool steps every sub-env together, but sub-envs "
                f"{missing} got neither an action nor a reset"
            )
        self._todo[:] = False
        self.pool.send(self._actions, None)  # EnvPool copies them (into its own dtype)
        self._sent = True

    def _rows(self, obs: Any, rew: Any, term: Any, trunc: Any, info: dict[str, Any]) -> EnvRows:
        raw = info["env_id"]
        if type(raw) is np.ndarray and raw.tobytes() == self._in_order:  # int32, 0..n-1
            ids, order = self._all_ids, None
        else:
            ids = np.asarray(raw, dtype=np.int64)
            order = None if strictly_ascending(ids) else np.argsort(ids, kind="stable")
        first = np.logical_not(info["elapsed_step"])  # no step elapsed: a reset step
        rew = np.asarray(rew, dtype=np.float64)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        extra = [k for k in info if k not in _BOOKKEEPING]
        if order is not None:
            ids, first, rew, term, trunc = (c[order] for c in (ids, first, rew, term, trunc))
            obs, info = take_rows(obs, order), _info_rows(info, extra, order)
        keep = self._cut_steps(ids, first, term, trunc) if self._cutting else None
        if keep is not None:
            ids, first, rew, term, trunc = (c[keep] for c in (ids, first, rew, term, trunc))
            obs, info = take_rows(obs, keep), _info_rows(info, extra, keep)
        if self._frames:
            obs = obs[:, 0]
        n = len(ids)
        # no info of its own (e.g. classic control): one shared empty mapping per row
        infos = [{k: info[k][i] for k in extra} for i in range(n)] if extra else [EMPTY_INFO] * n
        # reset steps become first rows (reward 0, no flags): the episode starts there
        return EnvRowsBuilder.columns(ids, obs, rew, term, trunc, infos, first, in_order=True)

    def _cut_steps(
        self, ids: np.ndarray, first: np.ndarray, term: np.ndarray, trunc: np.ndarray
    ) -> np.ndarray | None:
        """The rows to keep (None: all) when some are the steps that end episodes the
        horizon cut (``_uncut`` notes their sub-envs, whose reset comes next). A first row
        of a sub-env asked to reset means the pool had ended that episode itself: it stays.
        A cut episode the step did not end yet is stepped again."""
        marked = self._cut[ids]
        if not np.count_nonzero(marked):
            return None
        hidden = marked & ~first
        self._cut[ids[marked]] = False
        self._cut[ids[hidden]] = ~(term[hidden] | trunc[hidden])
        self._cutting = bool(np.count_nonzero(self._cut))
        if not np.count_nonzero(hidden):
            return None
        self._uncut = ids[hidden]
        return np.flatnonzero(~hidden)

    def close(self) -> None:
        """Receive the step under way, then close the pool (idle by then)."""
        with contextlib.suppress(Exception):
            if self._sent:
                self.pool.recv()
                self._sent = False
            self.pool.close()


def _info_rows(info: dict[str, Any], keys: list[str], index: np.ndarray) -> dict[str, Any]:
    """The rows ``index`` of the pool's ``info`` arrays under ``keys``."""
    return {k: np.asarray(info[k])[index] for k in keys}
