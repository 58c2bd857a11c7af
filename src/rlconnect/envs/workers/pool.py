"""``WorkerEnvs``: N sub-envs stepped by W worker processes, exchanged through shared memory.

Sub-envs are split into W contiguous groups as evenly as possible; worker ``w`` steps its
group one sub-env after another with the in-process adapter, so rows, seeds, autoresets,
errors and restarts are those of the same sub-envs stepped in the runner's process. A poll
writes commands (and actions) into the shared block, wakes the workers with a short
message on their pipes, waits, and reads the rows back from the block: nothing is pickled
for array spaces unless an info is non-empty or a sub-env raised.

With ``poll_size=B`` (``B < N``) a poll returns once at least B sub-envs have results
(whole workers: a worker answers for its group at once), while the other workers keep
stepping; a worker starts again as soon as the runner acted on what it returned.
"""

from __future__ import annotations

import gc
import pickle
import time
from collections.abc import Callable
from multiprocessing import util
from typing import Any

import attrs
import cloudpickle
import gymnasium as gym
import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.sub_envs import EnvContext
from rlconnect.envs.workers.answers import collect_answers
from rlconnect.envs.workers.frames import frame
from rlconnect.envs.workers.handle import CLOSE_WAIT_S, WorkerHandle, mp_context
from rlconnect.envs.workers.layout import (
    CMD_NONE,
    CMD_RESET,
    CMD_SOFT,
    CMD_STEP,
    CMD_STEP_PIPED,
    SharedBlock,
    SharedLayout,
    array_template,
)
from rlconnect.envs.workers.rows import block_rows, concat_rows, decode_replies
from rlconnect.envs.workers.worker import GroupSpec, Hello, decode_error, poll_message
from rlconnect.errors import EnvError, describe_exception
from rlconnect.spaces import describe_space, spaces_equal, unstack_batch

__all__ = ["WorkerEnvs", "split_evenly"]


def split_evenly(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each worker's group: sizes differ by at most one."""
    base, extra = divmod(num_envs, num_workers)
    out, offset = [], 0
    for w in range(num_workers):
        size = base + (1 if w < extra else 0)
        out.append((offset, size))
        offset += size
    return out


class WorkerEnvs(BaseEnv):
    """N sub-envs in ``num_workers`` processes behind the ``BaseEnv`` contract."""

    def __init__(
        self,
        creator: Callable[[EnvContext], Any],
        num_envs: int,
        *,
        num_workers: int,
        seed: int | None = None,
        worker_index: int = 0,
        env_config: dict[str, Any] | None = None,
        poll_size: int | None = None,
        timeout_s: float | None = None,
        build_timeout_s: float | None = None,
        context: str | None = None,
    ) -> None:
        if not 1 <= num_workers <= num_envs:
            raise ValueError(
                f"num_env_workers={num_workers!r}: must be between 1 and num_envs={num_envs}"
            )
        self.num_envs = num_envs
        self.poll_size = num_envs if poll_size is None else poll_size
        self.timeout_s = timeout_s
        self.build_timeout_s = build_timeout_s  # for env creators (None: no bound)
        self._ctx = mp_context(context)
        self._blob = cloudpickle.dumps(creator)
        self._restarts = [0] * num_envs
        self._respawned: set[int] = set()  # restarted with their whole worker already
        cfg = dict(env_config or {})
        groups = split_evenly(num_envs, num_workers)
        self.workers = [
            WorkerHandle(w, GroupSpec(off, size, num_envs, seed, worker_index, cfg, (0,) * size))
            for w, (off, size) in enumerate(groups)
        ]
        self._of_env = np.repeat(np.arange(num_workers), [w.hi - w.lo for w in self.workers])
        self._block: SharedBlock | None = None
        self._all_ids = np.arange(num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False  # shared by every full poll's rows
        self._extra: dict[int, dict[str, list]] = {}
        self._info_warned: set[int] = set()  # sub-envs whose infos could not be pickled
        try:
            self._start(self.workers)
        except BaseException:
            _shutdown(self.workers, self._block)
            raise
        assert self._block is not None
        # multiprocessing's finalizer, not weakref's: at exit it runs before multiprocessing
        # joins the (non-daemonic) workers, and never in a forked child
        self._finalizer: util.Finalize[None] = util.Finalize(
            self, _shutdown, args=(self.workers, self._block), exitpriority=10
        )
        #: single-agent observations come in the shared block (block_rows), not pickled
        self._obs_shared: bool = not self.is_multi_agent and self._a.obs is not None
        self._a.cmd[:] = CMD_RESET  # the first poll resets every sub-env

    # -- processes ------------------------------------------------------------------------
    def _start(self, workers: list[WorkerHandle]) -> None:
        # garbage goes before a fork: a forked worker that collected an EnvPool pool of a
        # runner that is gone (its C++ threads exist only here) would crash
        gc.collect()
        for w in workers:
            w.start(self._ctx, self._blob)
        hellos = [w.hello(self.build_timeout_s) for w in workers]
        if self._block is None:
            self._adopt(hellos[0])
        for w, hello in zip(workers, hellos):
            self._check_same(w, hello)
            assert self._block is not None
            w.attach(self._block.name, self._block.layout)

    def _adopt(self, hello: Hello) -> None:
        """Take the spaces of the first worker and allocate the shared block for them."""
        self.is_multi_agent = hello.multi_agent
        self._hello = hello
        if hello.multi_agent:
            self.possible_agents = tuple(hello.possible_agents)
            obs_t = act_t = None
        else:
            self.possible_agents = (DEFAULT_AGENT_ID,)
            obs_t, act_t = array_template(hello.obs_space), array_template(hello.act_space)
        self._block = SharedBlock(SharedLayout(self.num_envs, obs_t, act_t))
        assert self._block.arrays is not None
        self._a = self._block.arrays

    def _check_same(self, w: WorkerHandle, hello: Hello) -> None:
        first = self._hello
        same = hello.multi_agent == first.multi_agent and (
            hello.multi_agent
            or (
                spaces_equal(hello.obs_space, first.obs_space)
                and spaces_equal(hello.act_space, first.act_space)
            )
        )
        if not same:
            raise EnvError(
                f"the sub-envs of worker {w.index} ({w.what}) have other spaces than sub-env 0 "
                f"({describe_space(hello.obs_space)} vs {describe_space(first.obs_space)}): "
                "every sub-env must have the same spaces"
            )

    def _respawn(self, w: WorkerHandle) -> None:
        """A new process for a dead worker: every sub-env of it counts as restarted."""
        for e in range(w.lo, w.hi):
            self._restarts[e] += 1
        counts = tuple(self._restarts[w.lo : w.hi])
        w.spec = attrs.evolve(w.spec, restarts=counts)
        w.kill()
        try:
            self._start([w])
        except Exception as exc:
            raise EnvError(
                f"{w.what} could not be rebuilt in a new worker process: {describe_exception(exc)}"
            ) from exc
        self._a.cmd[w.lo : w.hi] = CMD_RESET
        self._extra.pop(w.index, None)

    # -- spaces ---------------------------------------------------------------------------
    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The observation space of ``agent_id`` (the one space of a single-agent env);
        KeyError listing the known agents."""
        if not self.is_multi_agent:
            return self._hello.obs_space
        try:
            return self._hello.obs_spaces[agent_id]
        except KeyError:
            known = list(self._hello.obs_spaces)
            raise KeyError(f"agent {agent_id!r} has no observation space; known: {known}") from None

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """The action space of ``agent_id`` (the one space of a single-agent env);
        KeyError listing the known agents."""
        if not self.is_multi_agent:
            return self._hello.act_space
        try:
            return self._hello.act_spaces[agent_id]
        except KeyError:
            known = list(self._hello.act_spaces)
            raise KeyError(f"agent {agent_id!r} has no action space; known: {known}") from None

    # -- commands -------------------------------------------------------------------------
    def _idle_check(self, env_ids: np.ndarray | list[int]) -> None:
        for w in self.workers:  # (a loop: cheaper than any() over a generator)
            if w.busy:
                break
        else:  # always so between synchronous polls
            return
        for w in set(self._of_env[np.asarray(env_ids)].tolist()):
            if self.workers[w].busy:
                raise RuntimeError(
                    f"sub-envs of worker {w} got a command while it is stepping: act only on "
                    "rows a poll returned"
                )

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Write the actions into the shared-memory block (by pipe when they do not match its
        layout, or for multi-agent envs); RuntimeError if a sub-env's worker is polling."""
        if not len(env_ids):
            return
        self._idle_check(env_ids)
        given = self._block_actions(actions)
        if given is None:
            self._pipe_actions(env_ids, agent_ids, actions)
            return
        for v, g in zip(self._a.act_leaves, given):
            v[env_ids] = g
        self._a.cmd[env_ids] = CMD_STEP

    def _block_actions(self, actions: Any) -> list[np.ndarray] | None:
        """The leaves of ``actions`` when the block holds them exactly (arrays of the
        leaves' dtypes and shapes), else None: they go by pipe."""
        leaves = self._a.act_leaves
        if self.is_multi_agent or not leaves or isinstance(actions, list):
            return None
        given = [actions] if type(actions) is np.ndarray else tree.flatten(actions)
        if len(given) != len(leaves):
            return None
        for g, v in zip(given, leaves):
            if not isinstance(g, np.ndarray) or g.dtype != v.dtype or g.shape[1:] != v.shape[1:]:
                return None
        return given

    def _pipe_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Actions the block cannot hold exactly (other dtypes, non-array spaces, agents)."""
        rows = actions if isinstance(actions, list | np.ndarray) else unstack_batch(actions)
        owner = self._of_env[env_ids]
        for w in np.unique(owner).tolist():
            idx = np.flatnonzero(owner == w).tolist()
            lo = self.workers[w].lo
            part = (
                env_ids[idx] - lo,
                tuple(agent_ids[i] for i in idx),
                [rows[i] for i in idx],
            )
            self._extra.setdefault(w, {}).setdefault("actions", []).append(part)
        self._a.cmd[env_ids] = CMD_STEP_PIPED

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll (a command its worker reads)."""
        self._idle_check([env_id])
        self._a.cmd[env_id] = CMD_RESET

    def soft_reset(self, env_id: int) -> None:
        """Start a new episode in ``env_id`` at the next poll without resetting it."""
        self._idle_check([env_id])
        self._a.cmd[env_id] = CMD_SOFT

    def try_restart(self, env_id: int) -> None:
        """Rebuild sub-env ``env_id``: in its worker, or by respawning the whole worker when
        its process died."""
        self._idle_check([env_id])
        w = self.workers[int(self._of_env[env_id])]
        if env_id in self._respawned:  # its whole worker was replaced already
            self._respawned.discard(env_id)
        elif not w.alive:
            self._respawn(w)
            self._respawned.update(e for e in range(w.lo, w.hi) if e != env_id)
        else:
            self._restarts[env_id] += 1
            reply = self._restart_in(w, env_id)
            if reply:
                payload, text = pickle.loads(reply)  # from a worker this runner started
                raise EnvError(text) from decode_error(payload, f"sub-env {env_id}")
        self._a.cmd[env_id] = CMD_RESET

    def _restart_in(self, w: WorkerHandle, env_id: int) -> bytes:
        """Rebuild ``env_id`` inside its live worker; a worker that dies meanwhile is
        replaced whole."""
        try:
            w.send(frame(pickle.dumps(("restart", env_id - w.lo))))
            return w.recv(self.build_timeout_s, "a rebuild of its sub-env")
        except (OSError, EnvError):
            self._restarts[env_id] -= 1
            self._respawn(w)
            self._respawned.update(e for e in range(w.lo, w.hi) if e != env_id)
            return b""

    # -- polling --------------------------------------------------------------------------
    def poll(self) -> EnvRows:
        """Wake the workers that have work, wait for their answers (all, or enough for
        ``poll_size`` sub-envs) and return the rows; a worker that died or timed out
        reports its sub-envs' errors."""
        errors: dict[int, BaseException] = {}
        self._dispatch(errors)
        replies = self._collect(errors)
        return self._rows(replies, errors)

    def _dispatch(self, errors: dict[int, BaseException]) -> None:
        cmd = self._a.cmd
        for w in self.workers:
            if w.busy or not w.alive:
                continue
            extra = self._extra.pop(w.index, None)
            if extra is not None:
                msg = poll_message(extra)
            elif self.is_multi_agent or np.count_nonzero(cmd[w.lo : w.hi]):
                msg = poll_message()
            else:
                continue
            try:
                w.send(msg)
            except OSError:
                exc = w.died()
                errors.update(dict.fromkeys(range(w.lo, w.hi), exc))

    def _collect(self, errors: dict[int, BaseException]) -> dict[int, bytes]:
        """Answers of busy workers: all of them, or (``poll_size``) enough for B sub-envs."""
        pending = [w for w in self.workers if w.busy]
        got, ended = collect_answers(pending, self.poll_size, self.timeout_s, errors)
        for w in ended:
            self._a.cmd[w.lo : w.hi] = CMD_NONE
        return got

    def _rows(self, replies: dict[int, bytes], errors: dict[int, BaseException]) -> EnvRows:
        answered = [self.workers[w] for w in sorted(replies)]
        raw = [replies[w.index] for w in answered]
        infos, piped = decode_replies(answered, raw, errors, self._info_warned)
        if not self._obs_shared:
            return concat_rows(piped, errors)
        full = len(answered) == len(self.workers)
        spans = [(w.lo, w.hi) for w in answered]
        return block_rows(self._a, spans, full, self._all_ids, infos, errors)

    def close(self) -> None:
        """End every worker process (each closes its envs; a straggler is killed) and free
        the shared memory."""
        self._a = None  # type: ignore[assignment]
        self._finalizer()
        self._block = None


def _shutdown(workers: list[WorkerHandle], block: SharedBlock | None) -> None:
    """End every worker process and free the block: on ``close()``, when an env never
    closed is garbage collected, and at interpreter exit. The workers close their envs in
    parallel (one busy with a poll finishes it first); those still running after
    ``CLOSE_WAIT_S`` are killed."""
    for w in workers:
        w.ask_to_close()
    deadline = time.monotonic() + CLOSE_WAIT_S
    for w in workers:
        w.close(deadline)
    if block is not None:
        block.close()
