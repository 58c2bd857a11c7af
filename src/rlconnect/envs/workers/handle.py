"""The runner's handle on one env worker process: start it, talk to it, end it.

Workers are not daemonic, so the envs in them may start processes of their own (a
simulator server, say: a daemonic process may not). ``WorkerEnvs`` ends them instead:
``close()``, its garbage collection and the interpreter's exit all run its shutdown.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import select
import time
from collections.abc import Iterable
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from typing import Any

from rlconnect.envs.workers.frames import read_frame, write_frame
from rlconnect.envs.workers.layout import SharedLayout
from rlconnect.envs.workers.lifeline import Lifeline
from rlconnect.envs.workers.worker import GroupSpec, Hello, decode_error, worker_main
from rlconnect.errors import EnvError, EnvTimeoutError

__all__ = ["WorkerHandle", "ready_workers"]

#: how long workers asked to end may take to close their envs before they are killed
CLOSE_WAIT_S = 2.0


class WorkerHandle:
    """One worker process holding sub-envs ``lo .. hi - 1``; ``busy`` while it polls."""

    def __init__(self, index: int, spec: GroupSpec) -> None:
        self.index = index
        self.spec = spec
        self.lo, self.hi = spec.offset, spec.offset + spec.size
        self.proc: Any = None
        self.to_worker: Any = None  # the runner's ends: commands out, answers in
        self.from_worker: Any = None
        self.busy = False
        self.since = 0.0
        self.alive = False
        self.closing = False
        self._answers: Any = None  # a ``select.poll`` on ``from_worker`` (None: none here)

    @property
    def what(self) -> str:
        """``"sub-envs 4..7"`` (or ``"sub-env 4"``): what this worker holds, for messages."""
        if self.hi - self.lo == 1:
            return f"sub-env {self.lo}"
        return f"sub-envs {self.lo}..{self.hi - 1}"

    def start(self, ctx: Any, blob: bytes) -> None:
        """Start the process; it builds its sub-envs (``hello`` waits for them)."""
        # one resource tracker for the runner and its workers: a worker attaching to the
        # block registers it again, the runner's unlink forgets it (no leak warnings)
        resource_tracker.ensure_running()
        # a pipe each way, not one socket pair: reading a socket wakes its peer (``frames``)
        commands, to_worker = ctx.Pipe(duplex=False)
        from_worker, answers = ctx.Pipe(duplex=False)
        lifeline = Lifeline.here(ctx.get_start_method())
        proc = ctx.Process(
            target=worker_main,
            args=(blob, self.spec, commands, answers, (to_worker, from_worker), lifeline),
            name=f"rlconnect-env-worker-{self.index}",
            daemon=False,  # its envs may start processes; WorkerEnvs ends it
        )
        proc.start()
        commands.close()
        answers.close()
        self.proc, self.alive, self.busy = proc, True, False
        self.to_worker, self.from_worker = to_worker, from_worker
        self._answers = _poller([from_worker])

    def hello(self, build_timeout_s: float | None) -> Hello:
        """The worker's spaces, once it built its sub-envs (within ``build_timeout_s``;
        None: however long it takes); raises what its env creator raised, or on a dead
        worker."""
        raw = self.recv(build_timeout_s, "the building of its sub-envs")
        hello = pickle.loads(raw)  # from the process this runner started
        if hello.error is not None:
            self.kill()
            raise decode_error(hello.error, f"{self.what}, while building them")
        return hello

    def attach(self, name: str, layout: SharedLayout) -> None:
        """Tell the worker to map the shared-memory block ``name`` laid out as ``layout``."""
        self.to_worker.send_bytes(pickle.dumps(("attach", name, layout)))

    def send(self, framed: bytes) -> None:
        """Send a message made by ``frames.frame`` (a poll: the worker is busy until it
        answers); raises ``OSError`` when the process is gone."""
        write_frame(self.to_worker, framed)
        self.busy = True
        self.since = time.monotonic()

    def recv(self, build_timeout_s: float | None, what: str) -> bytes:
        """The answer to a building of sub-envs (``what``: which) within
        ``build_timeout_s`` (None: however long it takes); a dead or late worker is killed
        and raises. Watches the process too: a process the worker's envs started may hold
        the worker's end of the pipe open after the worker died."""
        ready = wait([self.from_worker, self.proc.sentinel], build_timeout_s)
        if not ready:
            self.kill()
            raise EnvTimeoutError(
                f"the worker process of {self.what} did not finish {what} within "
                f"{build_timeout_s} s (RunnerConfig.env_build_timeout_s); it was killed"
            )
        if self.from_worker not in ready and not self.from_worker.poll():  # no answer
            raise self.died()
        return self.read()

    def answered(self, timeout_s: float) -> bool:
        """Whether the worker's answer is there (or its pipe closed) within ``timeout_s``:
        one ``poll(2)`` on a poller made with the pipe, where the OS has it."""
        if self._answers is None:
            return bool(wait([self.from_worker], max(timeout_s, 0.0)))
        return bool(self._answers.poll(max(timeout_s, 0.0) * 1000.0))

    def read(self) -> bytes:
        """The answer of a worker whose pipe is ready; a worker that died raises."""
        try:
            raw = read_frame(self.from_worker)
        except (EOFError, OSError):
            raise self.died() from None  # marks it dead, so no longer busy
        self.busy = False
        return raw

    def died(self) -> EnvError:
        """Mark the worker dead; the error that names its sub-envs."""
        self.kill()  # reaps it, so the exit code is known
        code = self.proc.exitcode if self.proc is not None else None
        return EnvError(
            f"the worker process of {self.what} died (exit code {code}); the open episodes "
            "of these sub-envs are lost"
        )

    def kill(self) -> None:
        """End the process now (if it still runs) and close its pipes."""
        self.alive = False
        self.busy = False
        for end in (self.to_worker, self.from_worker):
            if end is not None:
                with contextlib.suppress(Exception):
                    end.close()
        proc = self.proc
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(1.0)

    def ask_to_close(self) -> None:
        """Ask a live worker to end: it closes its envs first (after the poll it is busy
        with, if any)."""
        if self.alive:
            with contextlib.suppress(Exception):
                self.to_worker.send_bytes(b"c")
                self.closing = True

    def close(self, deadline: float) -> None:
        """Wait until ``deadline`` (``time.monotonic()``) for a worker asked to end, reading
        what it still sends (the answer of a poll it was busy with), then kill it if it
        still runs."""
        waiting = [self.from_worker, self.proc.sentinel] if self.closing else []
        self.closing = False
        while waiting and (left := deadline - time.monotonic()) > 0:
            ready = wait(waiting, left)
            if not ready or self.proc.sentinel in ready:
                break
            try:
                self.from_worker.recv_bytes()
            except (EOFError, OSError):  # it closed its end: wait for it to exit
                waiting = [self.proc.sentinel]
        self.kill()


def mp_context(name: str | None) -> Any:
    """The multiprocessing context workers start in (the platform's default for None)."""
    return multiprocessing.get_context(name)


def ready_workers(workers: Iterable[WorkerHandle], timeout_s: float) -> list[WorkerHandle]:
    """The workers whose pipe has an answer (or was closed) within ``timeout_s``.

    One ``poll(2)`` call where the OS has it (``multiprocessing.connection.wait`` builds a
    selector object in Python on every call); a closed pipe counts as ready, so reading
    it tells that the worker died.
    """
    by_fd = {w.from_worker.fileno(): w for w in workers}
    poller = _poller([w.from_worker for w in by_fd.values()])
    if poller is None:  # e.g. Windows
        ready = wait([w.from_worker for w in by_fd.values()], timeout_s)
        return [w for w in by_fd.values() if w.from_worker in ready]
    return [by_fd[fd] for fd, _ in poller.poll(max(timeout_s, 0.0) * 1000.0)]


def _poller(pipes: list[Any]) -> Any:
    """A ``select.poll`` waiting for input on ``pipes``, or None where there is none."""
    if not hasattr(select, "poll"):
        return None
    poller = select.poll()
    for pipe in pipes:
        poller.register(pipe.fileno(), select.POLLIN)
    return poller
