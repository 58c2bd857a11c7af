"""Loggers that write one record of ``runner.metrics()`` per ``sample()``.

Give one to ``runner.add_logger(logger)``; ``runner.stop()`` flushes and closes it.

- ``JsonlLogger(path)``: one JSON object per line (``tail -f`` shows a run live);
- ``CsvLogger(path)``: one row per record, columns added as new keys appear;
- ``TensorBoardLogger(logdir)``: event files TensorBoard reads (extra
  ``rlconnect[tensorboard]``), every number a scalar over ``env_steps_lifetime``.

Any object with ``write(record)``, ``flush()`` and ``close()`` is a logger too. A logger
that cannot write raises ``rc.LoggerError`` naming its path, when it is made or (through
the runner) from ``sample()``, which still hands out its batch as the error's ``batch``.
"""

from __future__ import annotations

from rlconnect.loggers.event_files import TensorBoardLogger
from rlconnect.loggers.files import CsvLogger, JsonlLogger

__all__ = ["CsvLogger", "JsonlLogger", "TensorBoardLogger"]
