"""How an env worker process is set up before it builds its sub-envs: one thread per
numeric library.

Why one thread: a worker steps its sub-envs one after another, and there are as many
workers as the user gave cores to them, so a library's own thread pool in every worker
only makes the workers and the runner fight for the same cores. Torch's intra-op pool is
the worst case (its OpenMP threads spin between ops, and a pool forked after a threaded
op can hang). PyTorch's own ``DataLoader`` workers set one thread for the same reason.

- ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``,
  ``NUMEXPR_NUM_THREADS``, ``VECLIB_MAXIMUM_THREADS`` and ``OPENCV_FOR_THREADS_NUM``
  are set to ``1`` in the worker's environment: libraries the env creator imports
  first read them;
- torch and OpenCV, when already imported (a forked worker inherits the runner's modules),
  are told ``set_num_threads(1)`` / ``setNumThreads(1)``.

This happens before the env creator runs, so a creator that wants more threads for its
env (a multi-threaded simulator with few workers) sets them itself, e.g.
``torch.set_num_threads(4)`` or ``os.environ["OMP_NUM_THREADS"] = "4"`` before its imports.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["THREAD_VARIABLES", "tune_worker_process"]

THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "OPENCV_FOR_THREADS_NUM",
)
"""Thread-count variables set to ``1`` in every env worker process."""


def tune_worker_process() -> None:
    """One thread per numeric library (see the module docstring). Called first thing in a
    worker; never raises."""
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            torch.set_num_threads(1)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        with contextlib.suppress(Exception):
            cv2.setNumThreads(1)
