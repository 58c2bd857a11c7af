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
threads. Either way the pool is driven with EnvPool's own ``send`` / ``recv``, and the
actions are sent as soon as every sub-env the last poll returned has one (``StepGate``), so
EnvPool steps while the runner records rows and ends episodes; ``poll()`` only receives
(a synchronous pool once ``RecvPacer`` deems the step nearly done, so the runner seldom
sleeps in ``recv``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.batches.take import take_rows
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.envpool_io import PoolIO, pool_io
from rlconnect.envs.gym_envs import sub_env_seed
from rlconnect.envs.recv_pacer import RecvPacer
from rlconnect.envs.rows import EnvRowsBuilder, errors_only, strictly_ascending
from rlconnect.envs.step_gate import StepGate
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
#: (CartPole on 2 CPUs, one thread against a thread per CPU: 1.04-1.09x at N=64)
LIGHT_FAMILIES = ("envpool.classic_control", "envpool.toy_text")
#: EnvPool's own bookkeeping in ``info`` (and Atari's copy of the RAM): not row infos
_BOOKKEEPING = frozenset({"env_id", "players", "elapsed_step", "ram"})


def is_envpool(env: Any) -> bool:
    """True for ``"envpool:<task id>"`` and for pools built by ``envpool.make_*``."""
    if isinstance(env, str):
        return env.startswith(ENVPOOL_PREFIX)
    return any((c.__module__ or "").startswith("envpool") for c in type(env).__mro__)


def make_envpool(
    env: Any,
    *,
    num_envs: int,
    seed: int | None,
    env_config: dict[str, Any],
    poll_size: int | None,
    horizon: int | None,
    soft_horizon: bool,
    preset: str | None = None,
) -> EnvPoolEnv:
    """The BaseEnv of an EnvPool spec or pool (see the module docstring).

    With ``preset="atari"`` an Atari task is built with ``stack_num=1`` and hands out
    single ``(84, 84)`` gray frames: EnvPool does the frame skip, max-pooling, no-op and
    FIRE resets, gray scale and resize, the preset's connectors clip rewards and stack 4
    frames (copies of the first frame at a reset, as EnvPool's own stack), so the policy
    sees ``Box(0, 255, (4, 84, 84), uint8)`` and nothing is done twice.
    """
    if soft_horizon:
        raise ValueError(
            "RunnerConfig.soft_horizon=True cannot be used with EnvPool: a pool cannot keep an "
            "env running across the horizon; use soft_horizon=False (the horizon then "
            "truncates episodes through the pool's max_episode_steps)"
        )
    if not isinstance(env, str):
        size = int(env.config["num_envs"])
        if size != num_envs:
            raise ValueError(
                f"the EnvPool pool holds {size} envs but RunnerConfig.num_envs={num_envs}: "
                "they must be equal"
            )
        limit = env.config.get("max_episode_steps")
        if horizon is not None and limit != horizon + 1:
            raise ValueError(
                f"RunnerConfig.horizon={horizon} but the EnvPool pool truncates episodes at "
                f"max_episode_steps={limit}: build the pool with max_episode_steps="
                f"{horizon + 1} (the runner cuts episodes at the horizon itself, keeping "
                "EnvPool's terminated flag there), or pass 'envpool:<task id>'"
            )
        return EnvPoolEnv(env, frames=_single_frames(env, preset))
    task = env[len(ENVPOOL_PREFIX) :]
    if not task:
        raise ValueError(
            f"env {env!r}: name an EnvPool task after the prefix, e.g. 'envpool:Pong-v5'"
        )
    kwargs = dict(env_config)
    kwargs["num_envs"] = num_envs
    if "num_threads" not in kwargs and (threads := default_threads(task)) is not None:
        kwargs["num_threads"] = threads
    if poll_size is not None and poll_size < num_envs:
        kwargs["batch_size"] = poll_size
    if horizon is not None:  # the runner cuts at the horizon (see the module docstring)
        kwargs["max_episode_steps"] = horizon + 1
    if preset == "atari":
        kwargs.setdefault("stack_num", 1)

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

    polls_dense = True
    steps_while_recording = True

    def __init__(
        self, pool: Any, *, rebuild: Callable[[int], Any] | None = None, frames: bool = False
    ) -> None:
        self._io: PoolIO = pool_io(pool)
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
        self._actions = np.zeros((self.num_envs, *shape), dtype=self._io.action_dtype)
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
        self._gate = StepGate(self._todo)
        #: when to block in recv after a send, for synchronous pools: an asynchronous poll
        #: returns as soon as the first sub-envs are done, seldom long after the send
        self._pacer = RecvPacer() if not self._async else None
        self._sent = False  # a synchronous pool has every sub-env's step under way
        self._started = False
        self._broken: BaseException | None = None
        self._send_error: BaseException | None = None  # of a send the gate started

    @property
    def pool(self) -> Any:
        """The EnvPool pool (a new one after a rebuild)."""
        return self._io.pool

    @pool.setter
    def pool(self, pool: Any) -> None:
        self._io = pool_io(pool)

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._obs_space

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        return self._act_space

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        self._queue(env_ids, actions)

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """The env's episode ended: its next step is EnvPool's reset step (the placeholder
        action is ignored; queued when the rows came back). An episode the pool did not end
        cannot be reset alone."""
        if not self._gate.take_reset(env_id):
            self._cut[env_id] = self._cutting = True  # (``_cut_steps`` tells if it was)
            self._queue(np.array([env_id]), 0)

    def _queue(self, env_ids: np.ndarray, actions: Any) -> None:
        """Queue actions (0: the placeholder of a reset step); send once the gate opens."""
        self._actions[env_ids] = actions
        self._todo[env_ids] = True
        if self._gate.answered():
            self._send_now()

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
        ended = self._gate.returned(rows)
        if len(ended):
            self._queue(ended, 0)
        return rows

    def _step(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        pool = self.pool
        if not self._started:
            self._started = True
            if self._async:
                pool.async_reset()
                obs, rew, term, trunc, info = pool.recv()
                return obs, rew, term, trunc, info
            obs, info = pool.reset()
            n = self.num_envs
            zeros = np.zeros(n, dtype=bool)
            return obs, np.zeros(n), zeros, zeros, info
        if not self._sent:
            self._send()
        self._sent = False
        if self._pacer is None:
            return self._io.recv()
        return self._pacer.recv(self._io.recv)

    def _send_now(self) -> None:
        """Send what the gate let through; a failure is the next poll's to report."""
        try:
            self._send()
        except Exception as exc:
            self._send_error = exc

    def _send(self) -> None:
        """Send the queued actions and resets (a synchronous pool: every sub-env's)."""
        if self._async:
            ids = np.flatnonzero(self._todo)
            if len(ids):
                self._io.send(self._actions[ids], ids.astype(np.int32))
                self._todo[ids] = False
            return
        if np.count_nonzero(self._todo) != self.num_envs:
            missing = np.flatnonzero(~self._todo).tolist()[:5]
            raise RuntimeError(
                f"a synchronous EnvPool pool steps every sub-env together, but sub-envs "
                f"{missing} got neither an action nor a reset"
            )
        self._todo[:] = False
        self._io.send(self._actions, None)
        if self._pacer is not None:  # (a synchronous pool has one)
            self._pacer.sent()
        self._sent = True

    def _rows(self, obs: Any, rew: Any, term: Any, trunc: Any, info: dict[str, Any]) -> EnvRows:
        raw = info["env_id"]
        if type(raw) is np.ndarray and raw.tobytes() == self._in_order:  # int32, 0..n-1
            ids, order = self._all_ids, None
        else:
            ids = np.asarray(raw, dtype=np.int64)
            order = None if strictly_ascending(ids) else np.argsort(ids, kind="stable")
        first = np.asarray(info["elapsed_step"]) == 0
        rew = np.asarray(rew, dtype=np.float64)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        extra = [k for k in info if k not in _BOOKKEEPING]
        if order is not None:
            ids, first, rew, term, trunc = (
                ids[order],
                first[order],
                rew[order],
                term[order],
                trunc[order],
            )
            obs = take_rows(obs, order)
            info = {k: np.asarray(info[k])[order] for k in extra}
        keep = self._cut_steps(ids, first, term, trunc) if self._cutting else None
        if keep is not None:
            ids, first, rew, term, trunc = (
                ids[keep],
                first[keep],
                rew[keep],
                term[keep],
                trunc[keep],
            )
            obs = take_rows(obs, keep)
            info = {k: np.asarray(info[k])[keep] for k in extra}
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
        """Receive the step the gate started, then close the pool (idle by then)."""
        with contextlib.suppress(Exception):
            if self._sent:
                self._io.recv()
                self._sent = False
            self.pool.close()
