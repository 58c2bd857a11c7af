"""Metrics records as JSON lines or CSV rows, one per ``sample()``, flushed at once."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from rlconnect.errors import LoggerError

__all__ = ["CsvLogger", "JsonlLogger", "open_for_logging"]


def open_for_logging(path: str | os.PathLike[str], kind: str) -> tuple[Path, IO[str]]:
    """``path`` (its folders made) opened to write anew: an existing file is replaced;
    what cannot be opened is a ``LoggerError`` naming the path."""
    where = Path(path)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        return where, open(where, "w+", encoding="utf-8", newline="")
    except OSError as exc:
        raise LoggerError(
            f"{kind} cannot write {str(where)!r} ({exc.strerror or type(exc).__name__}); "
            "give a file path in a folder you can write",
            str(where),
        ) from exc


def _write_error(kind: str, path: Path, exc: OSError) -> LoggerError:
    return LoggerError(
        f"{kind} could not write {str(path)!r} ({exc.strerror or type(exc).__name__}); free "
        "space there or give another path",
        str(path),
    )


class JsonlLogger:
    """One JSON object per ``write``: the record with ``wall_time`` (seconds since the
    epoch) first, on its own line, flushed at once. An existing file is replaced.

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "run", "metrics.jsonl")
    >>> logger = JsonlLogger(path)
    >>> logger.write({"env_steps": 200, "episode_return_mean": None})
    >>> logger.close()
    >>> line = json.loads(open(path).readline())
    >>> line["env_steps"], line["episode_return_mean"]
    (200, None)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path, self._file = open_for_logging(path, "JsonlLogger")

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` (numbers, strings, None; numpy scalars become numbers)."""
        line = json.dumps({"wall_time": time.time(), **record}, default=_plain)
        try:
            self._file.write(line + "\n")
            self._file.flush()
        except OSError as exc:
            raise _write_error("JsonlLogger", self.path, exc) from exc
        except ValueError as exc:  # written after close()
            raise LoggerError(f"JsonlLogger({str(self.path)!r}) is closed", str(self.path)) from exc

    def flush(self) -> None:
        """Write buffered lines to disk now (LoggerError naming the file if it cannot)."""
        if not self._file.closed:
            try:
                self._file.flush()
            except OSError as exc:
                raise _write_error("JsonlLogger", self.path, exc) from exc

    def close(self) -> None:
        """Flush and close the file (again: nothing)."""
        try:
            self._file.close()
        except OSError as exc:
            raise _write_error("JsonlLogger", self.path, exc) from exc


def _plain(value: Any) -> Any:
    """A numpy scalar (or anything with ``item()``) as a Python number; else its ``str``."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


class CsvLogger:
    """One CSV row per ``write``, ``wall_time`` (seconds since the epoch) first, flushed
    at once. An existing file is replaced.

    Columns may grow: the header is the keys of the first record; when a later record
    brings new keys (an agent seen for the first time), they become new columns at the
    right and the file is rewritten once with the wider header, earlier rows holding
    empty cells there. A key a record lacks, and a None, is an empty cell. So the file is
    always one header and rows of equal width, which ``csv`` readers and pandas take.

    >>> import csv, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.csv")
    >>> logger = CsvLogger(path)
    >>> logger.write({"env_steps": 200})
    >>> logger.write({"env_steps": 200, "agent/a/num_episodes": 3})
    >>> logger.close()
    >>> rows = list(csv.DictReader(open(path)))
    >>> [(r["env_steps"], r["agent/a/num_episodes"]) for r in rows]
    [('200', ''), ('200', '3')]
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path, self._file = open_for_logging(path, "CsvLogger")
        self._columns: dict[str, None] = {}

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as a row (new keys widen the file first)."""
        row = {"wall_time": time.time(), **record}
        try:
            if any(k not in self._columns for k in row):
                self._widen(row)
            values = ["" if (v := row.get(k)) is None else v for k in self._columns]
            csv.writer(self._file).writerow(values)
            self._file.flush()
        except OSError as exc:
            raise _write_error("CsvLogger", self.path, exc) from exc
        except ValueError as exc:  # written after close()
            raise LoggerError(f"CsvLogger({str(self.path)!r}) is closed", str(self.path)) from exc

    def _widen(self, row: Mapping[str, Any]) -> None:
        """The file rewritten with the new keys of ``row`` as new columns."""
        old = len(self._columns)
        self._columns.update(dict.fromkeys(row))
        self._file.seek(0)
        kept = list(csv.reader(self._file))[1:]
        pad = [""] * (len(self._columns) - old)
        buffer = io.StringIO()
        out = csv.writer(buffer)
        out.writerow(self._columns)
        out.writerows(r + pad for r in kept)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(buffer.getvalue())

    def flush(self) -> None:
        """Write buffered rows to disk now (LoggerError naming the file if it cannot)."""
        if not self._file.closed:
            try:
                self._file.flush()
            except OSError as exc:
                raise _write_error("CsvLogger", self.path, exc) from exc

    def close(self) -> None:
        """Flush and close the file (again: nothing)."""
        try:
            self._file.close()
        except OSError as exc:
            raise _write_error("CsvLogger", self.path, exc) from exc
