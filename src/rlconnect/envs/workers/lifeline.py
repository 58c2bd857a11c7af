"""An env worker process dies with its runner's process, even inside a hung env step.

A worker notices its runner is gone when its command pipe closes, but only between two
polls: a worker whose env step hangs (a simulator that never answers) would outlive a
runner killed with SIGKILL for as long as the step lasts, forever if it never returns.
So two guards that do not depend on the step returning:

- on Linux, the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, through
  ctypes): the worker is killed as soon as its parent goes, even when the hung step holds
  the GIL in C code. The kernel sends it when the *thread* that started the worker ends,
  so the runner asks for it only when it starts workers itself (``fork``, ``spawn``) from
  its main thread, which lives as long as its process;
- on POSIX systems, a daemon thread in the worker that checks every ``WATCH_INTERVAL_S``
  whether the runner's process is gone and then ends the worker with ``os._exit``. With
  the ``fork`` and ``spawn`` start methods the runner is the worker's parent, so its death
  shows as a new parent (the worker was handed to another process); with ``forkserver``
  the parent is the fork server, which stays while any worker lives, so the thread looks
  for the runner's pid itself (gone, or a zombie). It needs the GIL for a moment, which a
  step sleeping, waiting on I/O or running Python code leaves it.

Windows keeps a dead parent's pid (and ``os.kill`` there ends a process), so there only the
closed command pipe tells a worker, between two polls.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

import attrs

__all__ = ["WATCH_INTERVAL_S", "Lifeline"]

WATCH_INTERVAL_S = 0.25
"""How often a worker's watchdog checks its runner (its exit follows within about this)."""
_PR_SET_PDEATHSIG = 1
_ORPHAN_EXIT_CODE = 1


@attrs.frozen
class Lifeline:
    """What a worker needs to die with its runner: the runner's pid, whether the runner is
    the worker's parent (``fork``, ``spawn``) or a fork server is, and whether the worker
    may ask for the parent-death signal."""

    runner: int
    runner_is_parent: bool
    death_signal: bool

    @classmethod
    def here(cls, start_method: str) -> Lifeline:
        """The lifeline of a worker this thread starts now with ``start_method``. The
        death signal is asked for only when the worker's parent is this thread and it
        lives as long as the runner's process: the main thread (module docstring)."""
        forkserver = start_method == "forkserver"
        main = threading.current_thread() is threading.main_thread()
        return cls(os.getpid(), not forkserver, main and not forkserver)

    def follow(self) -> None:
        """Make this worker die with its runner; called first thing in the worker. Exits
        at once if the runner is already gone."""
        if self.death_signal and sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # (no effect if it fails)
        if os.name != "posix":
            return
        if not self._runner_lives():  # it went before the signal was asked for
            os._exit(_ORPHAN_EXIT_CODE)
        threading.Thread(target=self._watch, name="rlconnect-worker-lifeline", daemon=True).start()

    def _runner_lives(self) -> bool:
        if self.runner_is_parent:
            return os.getppid() == self.runner
        try:
            os.kill(self.runner, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # (a process of another user took the pid: ours is gone)
            return False
        try:  # a killed runner not yet reaped by its own parent is a zombie: gone too
            with open(f"/proc/{self.runner}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
        except (OSError, IndexError):  # no /proc (macOS): os.kill said it lives
            return True

    def _watch(self) -> None:
        """End the process once the runner is gone (see the module docstring)."""
        while self._runner_lives():
            time.sleep(WATCH_INTERVAL_S)
        os._exit(_ORPHAN_EXIT_CODE)
