"""The runner's handle on one env worker process: start it, talk to it, end it."""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import time
from multiprocessing import resource_tracker
from typing import Any

from rlconnect.envs.workers.layout import SharedLayout
from rlconnect.envs.workers.worker import GroupSpec, Hello, decode_error, worker_main
from rlconnect.errors import EnvError, EnvTimeoutError

__all__ = ["WorkerHandle"]

#: building a group of sub-envs may take this long at least (process start, loading assets)
BUILD_WAIT_S = 60.0
_CLOSE_WAIT_S = 2.0


class WorkerHandle:
    """One worker process holding sub-envs ``lo .. hi - 1``; ``busy`` while it polls."""

    def __init__(self, index: int, spec: GroupSpec) -> None:
        self.index = index
        self.spec = spec
        self.lo, self.hi = spec.offset, spec.offset + spec.size
        self.proc: Any = None
        self.conn: Any = None
        self.busy = False
        self.since = 0.0
        self.alive = False

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
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=worker_main,
            args=(blob, self.spec, child, parent),
            name=f"rlconnect-env-worker-{self.index}",
            daemon=True,
        )
        proc.start()
        child.close()
        self.proc, self.conn, self.alive, self.busy = proc, parent, True, False

    def hello(self, timeout_s: float | None) -> Hello:
        """The worker's spaces; raises what its env creator raised, or on a dead worker."""
        wait_s = BUILD_WAIT_S if timeout_s is None else max(timeout_s, BUILD_WAIT_S)
        raw = self.recv(wait_s, "start")
        hello = pickle.loads(raw)  # from the process this runner started
        if hello.error is not None:
            self.kill()
            raise decode_error(hello.error, f"{self.what}, while building them")
        return hello

    def attach(self, name: str, layout: SharedLayout) -> None:
        self.conn.send_bytes(pickle.dumps(("attach", name, layout)))

    def send(self, msg: bytes) -> None:
        """Start a poll (raises ``OSError`` when the process is gone)."""
        self.conn.send_bytes(msg)
        self.busy = True
        self.since = time.monotonic()

    def recv(self, wait_s: float | None, what: str) -> bytes:
        """The next answer within ``wait_s``; a dead or late worker is killed and raises."""
        if wait_s is not None and not self.conn.poll(wait_s):
            self.kill()
            raise EnvTimeoutError(
                f"the worker process of {self.what} did not answer {what} within {wait_s} s "
                "(RunnerConfig.sub_env_timeout_s); it was killed"
            )
        try:
            return self.conn.recv_bytes()
        except (EOFError, OSError):
            raise self.died() from None
        finally:
            self.busy = False

    def died(self) -> EnvError:
        """Mark the worker dead; the error that names its sub-envs."""
        self.kill()  # reaps it, so the exit code is known
        code = self.proc.exitcode if self.proc is not None else None
        return EnvError(
            f"the worker process of {self.what} died (exit code {code}); the open episodes "
            "of these sub-envs are lost"
        )

    def kill(self) -> None:
        """End the process now (if it still runs) and close the pipe."""
        self.alive = False
        self.busy = False
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        proc = self.proc
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(1.0)

    def close(self) -> None:
        """Ask the worker to end (it closes its envs); kill it if it does not in time."""
        if self.alive and not self.busy:
            with contextlib.suppress(Exception):
                self.conn.send_bytes(b"c")
                self.proc.join(_CLOSE_WAIT_S)
        self.kill()


def mp_context(name: str | None) -> Any:
    """The multiprocessing context workers start in (the platform's default for None)."""
    return multiprocessing.get_context(name)
