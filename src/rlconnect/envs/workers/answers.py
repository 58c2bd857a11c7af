"""Waiting for the answers of busy env workers: every one of them (a synchronous poll), or
the first ones with enough sub-envs (``env_poll_size``), within their deadlines.

A synchronous poll reads the answers in worker order, blocking on each pipe in turn.
The runner then sleeps once per poll when the worker read first is also the last to
finish, since an answer that is already there is read without sleeping; waiting on
every pipe at once would wake it at each answer. An asynchronous poll wakes at the first
answers, whichever workers they come from. Either way the runner blocks in the operating
system while it waits: slow envs cost it no CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rlconnect.envs.workers.handle import WorkerHandle, ready_workers
from rlconnect.errors import EnvError, EnvTimeoutError

__all__ = ["LIVENESS_S", "collect_answers"]

#: how often a poll waiting for workers without a timeout checks that they still run
LIVENESS_S = 1.0

Answer = tuple[WorkerHandle, "bytes | EnvError"]


def collect_answers(
    pending: list[WorkerHandle],
    poll_size: int,
    timeout_s: float | None,
    errors: dict[int, BaseException],
) -> tuple[dict[int, bytes], list[WorkerHandle]]:
    """The answers of ``pending`` (busy) workers by worker index, all of them or enough
    for ``poll_size`` sub-envs, and every worker that ended its poll (answered, died, or
    killed past ``timeout_s``). The sub-envs of workers that died or were killed get
    their error in ``errors``."""
    waiting = {w.index: w for w in pending}
    busy = sum(w.hi - w.lo for w in pending)
    need = min(busy, poll_size)
    got: dict[int, bytes] = {}
    ended: list[WorkerHandle] = []
    have = 0
    while waiting and (have < need or not got):
        if need < busy:
            answers = _first(waiting.values(), _wait_s(waiting.values(), timeout_s))
        else:
            answers = _next(waiting, timeout_s)
        if not answers:
            ended += _stalled(waiting, timeout_s, errors)
            continue
        for w, raw in answers:
            del waiting[w.index]
            if isinstance(raw, EnvError):
                errors.update(dict.fromkeys(range(w.lo, w.hi), raw))
            else:
                got[w.index] = raw
            ended.append(w)
            have += w.hi - w.lo
    return got, ended


def _first(workers: Iterable[WorkerHandle], wait_s: float) -> list[Answer]:
    """The answers (or errors) of the workers that finish first, within ``wait_s``."""
    return [(w, _or_error(w.read)) for w in ready_workers(workers, wait_s)]


def _next(waiting: dict[int, WorkerHandle], timeout_s: float | None) -> list[Answer]:
    """The answer of the first waiting worker, blocking on its pipe; when it is late or
    gone, the answers the others already gave (the caller then checks deadlines)."""
    w = next(iter(waiting.values()))
    if w.answered(_wait_s([w], timeout_s)):
        return [(w, _or_error(w.read))]
    return _first(waiting.values(), 0.0)


def _wait_s(workers: Iterable[WorkerHandle], timeout_s: float | None) -> float:
    """Until the first deadline of ``workers``, or ``LIVENESS_S`` (no timeout)."""
    if timeout_s is None:
        return LIVENESS_S
    left = min(w.since for w in workers) + timeout_s - time.monotonic()
    return max(min(left, LIVENESS_S), 0.0)


def _stalled(
    waiting: dict[int, WorkerHandle], timeout_s: float | None, errors: dict[int, BaseException]
) -> list[WorkerHandle]:
    """Fail (and return) the workers past ``timeout_s`` (killed) and those that ended
    without answering (a process their envs started may hold their pipe open, so no end
    of file tells)."""
    now = time.monotonic()
    failed = []
    for key, w in list(waiting.items()):
        late = timeout_s is not None and now - w.since >= timeout_s
        if not late and w.proc.exitcode is None:
            continue
        del waiting[key]
        failed.append(w)
        if not late:
            errors.update(dict.fromkeys(range(w.lo, w.hi), w.died()))
            continue
        pid = w.proc.pid
        w.kill()
        exc = EnvTimeoutError(
            f"the worker process (pid {pid}) of {w.what} did not finish a step within "
            f"{timeout_s} s (sub_env_timeout_s); it was killed"
        )
        errors.update(dict.fromkeys(range(w.lo, w.hi), exc))
    return failed


def _or_error(read: Callable[[], bytes]) -> bytes | EnvError:
    """What ``read`` returns, or the ``EnvError`` of a worker that died."""
    try:
        return read()
    except EnvError as exc:
        return exc
