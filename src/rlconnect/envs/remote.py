"""Sub-envs in worker processes that fail one at a time: errors, deadlines, restarts.

``RemoteVectorEnv`` is gymnasium's ``AsyncVectorEnv`` (NEXT_STEP autoreset) with its own
worker loop and its own ``reset``/``step``:

- an exception in a sub-env's ``reset``/``step`` does not end its worker: it is sent back
  (the original exception when it survives pickling, else a ``RemoteEnvError`` holding
  its type name, message and traceback) and reported per sub-env by ``pop_errors()``;
  every other sub-env's result of that call is kept;
- with ``timeout_s``, a worker that does not answer in time is killed and reported with
  an ``EnvTimeoutError`` naming the sub-env; a worker that died is reported too;
- ``restart(i)`` rebuilds sub-env ``i`` in its worker (or in a new worker process when the
  old one is gone), with the seed a restarted in-process sub-env would get.

Observations travel through the pipes (no shared memory), so that a worker can be
replaced on its own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import CloudpickleWrapper, concatenate, create_empty_array, iterate

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.errors import EnvCheckError, EnvError, EnvTimeoutError, describe_exception
from rlconnect.spaces import describe_space

__all__ = ["RemoteEnvError", "RemoteVectorEnv"]

_CLOSE_WAIT_S = 5.0
#: a (re)build of a sub-env may take this long at least (process start, loading assets)
_BUILD_WAIT_S = 60.0


class RemoteEnvError(EnvError):
    """An exception from a worker process that could not be sent back as itself."""


def _error_payload(exc: BaseException) -> tuple[str, str, str, bytes | None]:
    """What the parent needs to report ``exc``: the exception itself only when it survives
    a pickle round trip (an odd constructor or a lock in it must not break reporting)."""
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return type(exc).__name__, describe_exception(exc), traceback.format_exc(), blob


def _worker(
    index: int,
    env_fn: Callable[[], gym.Env],
    pipe: Connection,
    parent_pipe: Connection,
    shared_memory: Any,
    error_queue: Any,
    autoreset_mode: Any,
    semaphore: Any,
) -> None:
    """The loop of one worker process; env errors are answers, never the end of it."""
    parent_pipe.close()
    env = env_fn()
    autoreset = False
    seed_next: int | None = None  # the seed of a rebuilt env's first reset
    try:
        while True:
            command, data = pipe.recv()
            if command == "reset":
                try:
                    kwargs = dict(data)
                    if kwargs.get("seed") is None and seed_next is not None:
                        kwargs["seed"] = seed_next
                    seed_next = None
                    autoreset = False
                    pipe.send(("ok", env.reset(**kwargs)))
                except Exception as exc:
                    pipe.send(("error", _error_payload(exc)))
            elif command == "step":
                try:
                    out: tuple[Any, ...]
                    if autoreset:
                        obs, info = env.reset()
                        out = (obs, 0.0, False, False, info)
                    else:
                        out = env.step(data)
                    autoreset = bool(out[2] or out[3])
                    pipe.send(("ok", out))
                except Exception as exc:
                    autoreset = False
                    pipe.send(("error", _error_payload(exc)))
            elif command == "rlconnect_rebuild":  # (restarts, seed, whether to build anew)
                restarts, seed_next, build = data
                try:
                    if build:
                        with contextlib.suppress(Exception):  # must not mask the rebuild
                            env.close()
                        env = _rebuilt(env_fn, restarts)()
                    autoreset = False
                    pipe.send(("ok", None))
                except Exception as exc:
                    pipe.send(("error", _error_payload(exc)))
            elif command == "close":
                pipe.send((None, True))
                break
            elif command == "_call":
                name, args, kwargs = data
                attr = env.get_wrapper_attr(name)
                pipe.send((attr(*args, **kwargs) if callable(attr) else attr, True))
            elif command == "_setattr":
                env.set_wrapper_attr(*data)
                pipe.send((None, True))
            elif command == "_check_spaces":
                _, obs_space, act_space = data
                same = (obs_space == env.observation_space, act_space == env.action_space)
                pipe.send((same, True))
            else:
                raise RuntimeError(f"unknown command {command!r}")
    except (KeyboardInterrupt, Exception) as exc:  # protocol errors: gymnasium's way, safely
        error_queue.put((index, RuntimeError, describe_exception(exc), traceback.format_exc()))
        with contextlib.suppress(Exception):
            pipe.send((None, False))
    finally:
        with contextlib.suppress(Exception):
            env.close()


class RemoteVectorEnv(gym.vector.AsyncVectorEnv):
    """``AsyncVectorEnv`` whose sub-envs fail, time out and restart one at a time."""

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        timeout_s: float | None = None,
        seed_of: Callable[[int, int], int | None] = lambda index, restarts: None,
    ) -> None:
        super().__init__(
            env_fns,
            shared_memory=False,
            worker=_worker,  # type: ignore[arg-type]  # gymnasium's hint lags its 8 arguments
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
        self.timeout_s = timeout_s
        self._seed_of = seed_of
        self._restarts = [0] * self.num_envs
        self._errors: dict[int, BaseException] = {}
        self._filler = create_empty_array(self.single_observation_space, n=1, fn=np.zeros)
        self._filler = next(iter(iterate(self.single_observation_space, self._filler)))

    # -- errors ---------------------------------------------------------------------------
    def pop_errors(self) -> dict[int, BaseException]:
        """Sub-envs that failed in the last ``reset``/``step``, and why (then forgotten)."""
        out, self._errors = self._errors, {}
        return out

    def _fail(self, i: int, exc: BaseException) -> None:
        self._errors[i] = exc

    def _kill(self, i: int) -> None:
        proc, pipe = self.processes[i], self.parent_pipes[i]
        if pipe is not None:
            with contextlib.suppress(Exception):
                pipe.close()
        self.parent_pipes[i] = None  # type: ignore[call-overload]  # as gymnasium marks it
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
            if proc.is_alive():
                proc.kill()
        proc.join(1.0)

    def _gather(self, ids: list[int], what: str, wait_s: float | None = None) -> dict[int, Any]:
        """Answers of workers ``ids`` to ``what`` within ``wait_s`` (default: the timeout);
        failures go to ``pop_errors()``."""
        out: dict[int, Any] = {}
        pending: dict[Any, int] = {
            self.parent_pipes[i]: i for i in ids if self.parent_pipes[i] is not None
        }
        for i in ids:
            if self.parent_pipes[i] is None:
                self._fail(i, EnvError(f"sub-env {i} has no worker process (it was killed)"))
        wait_s = self.timeout_s if wait_s is None else wait_s
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = wait(list(pending), timeout=left)
            if not ready:
                for i in pending.values():
                    pid = self.processes[i].pid
                    self._kill(i)
                    self._fail(
                        i,
                        EnvTimeoutError(
                            f"sub-env {i} did not answer {what}() within {wait_s} s "
                            f"(sub_env_timeout_s={self.timeout_s}); its worker process "
                            f"(pid {pid}) was killed"
                        ),
                    )
                break
            for conn in ready:
                i = pending.pop(conn)
                try:
                    status, payload = self.parent_pipes[i].recv()
                except (EOFError, OSError):
                    code = self.processes[i].exitcode
                    self._kill(i)
                    self._fail(i, EnvError(f"sub-env {i}'s worker process died (exit code {code})"))
                    continue
                if status == "ok":
                    out[i] = payload
                else:
                    self._fail(i, _rebuild_error(i, *tuple(payload)))
        return out

    # -- the vector env API ---------------------------------------------------------------
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[Any, dict]:
        """Reset every sub-env, or those in ``options["reset_mask"]``; failed ones get a
        placeholder observation and are reported by ``pop_errors()``."""
        self._assert_is_running()
        n = self.num_envs
        seeds = [seed + i for i in range(n)] if isinstance(seed, int) else seed or [None] * n
        options = dict(options or {})
        mask = options.pop("reset_mask", np.ones(n, dtype=bool))
        ids = [i for i in range(n) if mask[i]]
        for i in ids:
            if self.parent_pipes[i] is not None:
                self.parent_pipes[i].send(("reset", {"seed": seeds[i], "options": options or None}))
        got = self._gather(ids, "reset")
        obs: list[Any] = []
        infos: dict[str, Any] = {}
        for i in range(n):
            o, info = got.get(i, (self._filler, {}))
            obs.append(o)
            infos = self._add_info(infos, info, i)
        return self._stack(obs, list(got)), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every sub-env; failed ones get a placeholder row (reported by ``pop_errors()``)."""
        self._assert_is_running()
        n = self.num_envs
        for i, action in enumerate(iterate(self.action_space, actions)):
            if self.parent_pipes[i] is not None:
                self.parent_pipes[i].send(("step", action))
        got = self._gather(list(range(n)), "step")
        obs: list[Any] = []
        infos: dict[str, Any] = {}
        rew = np.zeros(n, dtype=np.float64)
        term = np.zeros(n, dtype=bool)
        trunc = np.zeros(n, dtype=bool)
        for i in range(n):
            if i in got:
                o, rew[i], term[i], trunc[i], info = got[i]
            else:
                o, info = self._filler, {}
            obs.append(o)
            infos = self._add_info(infos, info, i)
        return self._stack(obs, list(got)), rew, term, trunc, infos

    def _stack(self, obs: list[Any], answered: list[int]) -> Any:
        """A fresh batch; a sub-env whose observation does not fit the space (shape,
        structure) is reported with an ``EnvCheckError`` and gets a placeholder."""
        space = self.single_observation_space
        fresh: Any = create_empty_array  # typed loosely: gymnasium's hint allows None
        try:
            return concatenate(space, obs, fresh(space, n=len(obs)))
        except Exception:
            pass
        one = fresh(space, n=1)
        for i in answered:
            try:
                concatenate(space, [obs[i]], one)
            except Exception as exc:
                obs[i] = self._filler
                self._fail(
                    i,
                    EnvCheckError(
                        f"env returned a bad observation: obs does not fit {describe_space(space)}"
                        f" in env {i} / agent {DEFAULT_AGENT_ID!r}: {describe_exception(exc)}"
                    ),
                )
        return concatenate(space, obs, fresh(space, n=len(obs)))

    def restart(self, i: int) -> None:
        """Rebuild sub-env ``i`` (in a new worker process if its worker is gone); its next
        reset is seeded as a restarted in-process sub-env's would be."""
        self._restarts[i] += 1
        k = self._restarts[i]
        spawn = self.parent_pipes[i] is None or not self.processes[i].is_alive()
        if spawn:  # the new worker builds the env itself
            self._kill(i)
            self._spawn(i, _rebuilt(self.env_fns[i], k))
        self.parent_pipes[i].send(("rlconnect_rebuild", (k, self._seed_of(i, k), not spawn)))
        wait_s = None if self.timeout_s is None else max(self.timeout_s, _BUILD_WAIT_S)
        self._gather([i], "rebuild", wait_s)
        failed = self._errors.pop(i, None)
        if failed is not None:
            raise EnvError(
                f"sub-env {i} could not be rebuilt: {describe_exception(failed)}"
            ) from failed

    def _spawn(self, i: int, env_fn: Callable[[], gym.Env]) -> None:
        ctx = multiprocessing.get_context(self.context)
        parent, child = ctx.Pipe()
        proc = ctx.Process(  # type: ignore[attr-defined]
            target=_worker,
            name=f"Worker<{type(self).__name__}>-{i}",
            args=(
                i,
                CloudpickleWrapper(env_fn),
                child,
                parent,
                None,
                self.error_queue,
                self.autoreset_mode,
                None,
            ),
        )
        proc.daemon = self.daemon
        proc.start()
        child.close()
        self.parent_pipes[i] = parent
        self.processes[i] = proc

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Ask every live worker to close; kill those that do not within a deadline."""
        wait_s = 0.0 if terminate else min(timeout or _CLOSE_WAIT_S, _CLOSE_WAIT_S)
        live: dict[Any, int] = {}
        for i, pipe in enumerate(self.parent_pipes):
            if pipe is None:
                continue
            try:
                pipe.send(("close", None))
                live[pipe] = i
            except (OSError, ValueError):
                continue
        deadline = time.monotonic() + wait_s
        while live:
            ready = wait(list(live), timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                break
            for conn in ready:
                j = live.pop(conn)
                with contextlib.suppress(Exception):
                    self.parent_pipes[j].recv()
        for i in range(self.num_envs):
            self._kill(i)


def _rebuilt(env_fn: Any, restarts: int) -> Callable[[], gym.Env]:
    """The builder of a sub-env after ``restarts`` restarts (``fn.rebuilt`` if it has one,
    which gives a fresh derived seed; else the same builder)."""
    fn = getattr(env_fn, "fn", env_fn)  # unwrap gymnasium's CloudpickleWrapper
    rebuilt = getattr(fn, "rebuilt", None)
    return rebuilt(restarts) if rebuilt is not None else fn


def _rebuild_error(i: int, name: str, text: str, tb: str, blob: bytes | None) -> BaseException:
    """The worker's exception as itself when it could be sent, else a RemoteEnvError."""
    if blob is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(blob)  # from our own worker process, checked there
            if isinstance(exc, BaseException):
                note = getattr(exc, "add_note", None)
                if note is not None:
                    note(f"raised in the worker process of sub-env {i}:\n{tb}")
                return exc
    return RemoteEnvError(f"{text} (in the worker process of sub-env {i})\n{tb}")
