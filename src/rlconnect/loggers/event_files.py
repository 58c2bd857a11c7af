"""Metrics records as TensorBoard event files (the extra ``rlconnect[tensorboard]``)."""

from __future__ import annotations

import numbers
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlconnect.errors import LoggerError, describe_exception

__all__ = ["TensorBoardLogger"]

TENSORBOARD_HINT = "pip install 'rlconnect[tensorboard]' (or tensorboard)"


class TensorBoardLogger:
    """Every number of each record as a TensorBoard scalar, its key the tag
    (``policy/<pid>/episode_return_mean`` groups under ``policy``), at the step
    ``record[step_key]`` (default: env steps so far; records without it: their count).
    None and non-numbers are left out.

    The events go to a new ``events.out.tfevents.*`` file in ``logdir`` (made if
    needed), written with TensorBoard's own event-file writer, one event per record;
    a background thread flushes them every ``flush_secs`` seconds (and ``flush()`` /
    ``close()`` at once), so ``tensorboard --logdir DIR`` shows a run as it goes.

    >>> import tempfile
    >>> logger = TensorBoardLogger(tempfile.mkdtemp())
    >>> logger.write({"env_steps_lifetime": 200, "episode_return_mean": 21.5})
    >>> logger.close()
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        step_key: str = "env_steps_lifetime",
        flush_secs: float = 2.0,
    ) -> None:
        try:
            from tensorboard.compat.proto import event_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise ImportError(f"TensorBoardLogger needs tensorboard: {TENSORBOARD_HINT}") from exc
        self.path = str(logdir)
        self.step_key = step_key
        self._event = event_pb2.Event
        self._written = 0
        try:
            Path(logdir).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=logdir, prefix=".rlconnect-check-"):
                pass
            self._writer = EventFileWriter(self.path, flush_secs=flush_secs)
        except Exception as exc:
            raise LoggerError(
                f"TensorBoardLogger cannot write event files in {self.path!r} "
                f"({_reason(exc)}); give a folder you can write",
                self.path,
            ) from exc

    def write(self, record: Mapping[str, Any]) -> None:
        """One event holding every number of ``record`` (bools as 0 / 1)."""
        step = record.get(self.step_key)
        self._written += 1
        event = self._event(
            wall_time=time.time(), step=int(step) if step is not None else self._written
        )
        values = event.summary.value
        for key, value in record.items():
            if isinstance(value, numbers.Real):
                values.add(tag=key, simple_value=float(value))
        self._call("write", self._writer.add_event, event)

    def flush(self) -> None:
        """Write buffered events to disk now (LoggerError naming the folder if it cannot)."""
        self._call("flush", self._writer.flush)

    def close(self) -> None:
        """Flush and close the event file (again: nothing)."""
        self._call("close", self._writer.close)

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the writer's thread re-raises what it met (a full disk)
            raise LoggerError(
                f"TensorBoardLogger could not {what} event files in {self.path!r} "
                f"({_reason(exc)}); free space there or give another folder",
                self.path,
            ) from exc


def _reason(exc: BaseException) -> str:
    strerror = getattr(exc, "strerror", None)
    return strerror if isinstance(strerror, str) else describe_exception(exc)
