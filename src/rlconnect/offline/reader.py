"""``read_batches``: batches back from ``.rlb`` and Parquet files, whole or re-cut.

A path is a file, a folder (its ``batch-*.rlb`` files by number, then its ``*.parquet``
files: ours by worker and number, others by name), a glob pattern, or a list of these.
Each file is read by its type: Parquet files start with ``PAR1``, anything else is read as
an ``rlconnect.batch`` file. Batches come back in the order they were written, with their
dtypes, nests, infos and meta.

``batch_size=None`` yields the batches as written (a batch split across Parquet files is
joined again); ``batch_size=n`` re-cuts SampleBatches into batches of exactly ``n`` rows
(the last may be shorter) and merges whole MultiAgentBatches until they hold at least ``n``
env steps (a MultiAgentBatch is never cut: its env steps cannot be split).

``on_bad_file="fail"`` (default) raises the file's ``CheckpointError`` /
``OfflineDataError``; ``"skip"`` first checks each file completely, skips a bad one with
a ``BadFileWarning`` and records ``(path, reason)`` in ``reader.skipped``.
"""

from __future__ import annotations

import functools
import glob
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from rlconnect.batches import MultiAgentBatch, SampleBatch, concat_samples
from rlconnect.checkpoints.files import open_regular_file
from rlconnect.checkpoints.formats import BATCH_FILE, PARQUET_FILE
from rlconnect.errors import CheckpointError
from rlconnect.offline._common import PARQUET_FILE_RE, OfflineDataError
from rlconnect.offline.batch_files import (
    BATCH_FILE_PATTERN,
    _file_index,
    read_batch_file,
)

__all__ = ["BadFileWarning", "BatchReader", "list_batch_files", "read_batches", "summarize_batches"]

PathLike = str | os.PathLike[str]
Batch = SampleBatch | MultiAgentBatch
_GLOB_CHARS = re.compile(r"[*?\[]")


class BadFileWarning(UserWarning):
    """A bad file was skipped (``on_bad_file="skip"``); the message names it and why."""


# --------------------------------------------------------------------------------- listing
def _sort_key(path: str) -> tuple[Any, ...]:
    folder, name = os.path.split(os.path.abspath(path))
    index = _file_index(path)
    if index is not None:
        return (folder, 0, 0, index, name)
    m = PARQUET_FILE_RE.match(name)
    if m:
        return (folder, 1, int(m.group(1)), int(m.group(2)), name)
    return (folder, 2, 0, math.inf, name)


def _folder_files(directory: str) -> list[str]:
    esc = glob.escape(directory)
    rlb = [
        p for p in glob.glob(os.path.join(esc, BATCH_FILE_PATTERN)) if _file_index(p) is not None
    ]
    parquet = glob.glob(os.path.join(esc, "*.parquet"))
    return sorted(rlb + parquet, key=_sort_key)


def list_batch_files(path: PathLike | Iterable[PathLike]) -> list[str]:
    """The files ``read_batches(path)`` reads, in reading order (see the module docstring).

    A folder with no batch files gives an empty list; a missing path, or a pattern matching
    nothing, is FileNotFoundError.
    """
    if not isinstance(path, str | os.PathLike):
        return [f for p in path for f in list_batch_files(p)]
    text = os.fspath(path)
    if os.path.isdir(text):
        return _folder_files(text)
    if os.path.exists(text):
        return [text]
    if _GLOB_CHARS.search(text):
        matches = glob.glob(text)
        if not matches:
            raise FileNotFoundError(f"no batch files match {text!r}")
        files = [p for m in matches for p in (_folder_files(m) if os.path.isdir(m) else [m])]
        return sorted(dict.fromkeys(files), key=_sort_key)
    raise FileNotFoundError(f"no such batch file or folder: {text!r}")


def is_parquet(path: str) -> bool:
    """True if the file starts with Parquet's magic bytes; ``OfflineDataError`` for a
    folder, a FIFO or a device, which are never read (``checkpoints.files``)."""
    fail = functools.partial(OfflineDataError, path)
    with open_regular_file(path, fail=fail) as (fd, _), os.fdopen(fd, "rb", closefd=False) as f:
        return f.read(4) == b"PAR1"


# --------------------------------------------------------------------------------- reading
def _file_batches(path: str, check_spaces: bool) -> Iterator[Any]:
    """Whole batches (``.rlb``) or ``BatchPart``s (Parquet) of one file."""
    if is_parquet(path):
        from rlconnect.offline._common import import_parquet_module

        module = import_parquet_module(
            "rlconnect.offline.parquet_reader", f"reading the Parquet file {path!r}"
        )
        yield from module.read_parquet_parts(path, check_spaces=check_spaces)
    else:
        yield read_batch_file(path)


def _assemble(parts: list[Any]) -> Batch:
    first = parts[0]
    per_policy: dict[str, list[SampleBatch]] = {}
    for part in parts:
        for pid, b in part.policy_batches.items():
            per_policy.setdefault(pid, []).append(b)
    merged = {pid: bs[0] if len(bs) == 1 else concat_samples(bs) for pid, bs in per_policy.items()}
    if first.kind == "SampleBatch":
        return next(iter(merged.values()))
    return MultiAgentBatch(merged, parts[-1].env_steps)


class BatchReader(Iterator[Batch]):
    """Iterates the batches at ``path``; ``files`` lists them, ``skipped`` the bad ones."""

    def __init__(
        self,
        path: PathLike | Iterable[PathLike],
        *,
        batch_size: int | None = None,
        on_bad_file: str = "fail",
        check_spaces: bool = True,
    ) -> None:
        if on_bad_file not in ("fail", "skip"):
            raise ValueError(f"on_bad_file={on_bad_file!r}: allowed are 'fail' and 'skip'")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size={batch_size!r}: must be None or an integer >= 1")
        self.files = list_batch_files(path)
        self.batch_size, self.on_bad_file, self.check_spaces = batch_size, on_bad_file, check_spaces
        self.skipped: list[tuple[str, str]] = []
        whole = self._whole()
        self._it = whole if batch_size is None else rechunk(whole, batch_size)

    def __iter__(self) -> BatchReader:
        return self

    def __next__(self) -> Batch:
        return next(self._it)

    def _skip(self, path: str, reason: str) -> None:
        self.skipped.append((path, reason))
        warnings.warn(f"skipped bad offline file {path!r}: {reason}", BadFileWarning, stacklevel=3)

    def _whole(self) -> Iterator[Batch]:
        pending: list[Any] = []
        for path in self.files:
            if self.on_bad_file == "skip":
                try:
                    for _ in _file_batches(path, self.check_spaces):
                        pass
                except CheckpointError as exc:
                    self._skip(path, str(exc))
                    continue
            for item in _file_batches(path, self.check_spaces):
                if isinstance(item, SampleBatch | MultiAgentBatch):
                    yield from self._drop_pending(pending, path)
                    yield item
                    continue
                if pending and (pending[0].number != item.number or item.part != len(pending)):
                    yield from self._drop_pending(pending, path)
                if item.part != len(pending):  # the batch's earlier parts are missing
                    yield from self._drop_pending([item], path)
                    continue
                pending.append(item)
                if item.last:
                    yield _assemble(pending)
                    pending.clear()
        yield from self._drop_pending(pending, self.files[-1] if self.files else "")

    def _drop_pending(self, pending: list[Any], path: str) -> Iterator[Batch]:
        """A batch whose last part never came (a file of the run is missing or was skipped)."""
        if not pending:
            return
        index = pending[0].number
        pending.clear()
        problem = f"batch {index} continues in a file that is missing or was skipped"
        if self.on_bad_file == "fail":
            raise OfflineDataError(path, problem)
        self._skip(path, problem)
        yield from ()


def rechunk(batches: Iterable[Batch], size: int) -> Iterator[Batch]:
    """SampleBatches of exactly ``size`` rows (last shorter); MultiAgentBatches merged whole
    until they hold at least ``size`` env steps."""
    buf: list[Any] = []
    rows = 0
    for b in batches:
        if buf and type(b) is not type(buf[0]):
            raise ValueError("cannot re-cut a mix of SampleBatch and MultiAgentBatch")
        buf.append(b)
        if isinstance(b, MultiAgentBatch):
            rows += b.env_steps()
            if rows >= size:
                yield concat_samples(buf) if len(buf) > 1 else buf[0]
                buf, rows = [], 0
            continue
        rows += len(b)
        if rows < size:
            continue
        joined = concat_samples(buf) if len(buf) > 1 else buf[0]
        start = 0
        while len(joined) - start >= size:
            yield joined[start : start + size]
            start += size
        buf = [joined[start:]] if start < len(joined) else []
        rows = len(joined) - start
    if buf and rows:
        yield concat_samples(buf) if len(buf) > 1 else buf[0]


def read_batches(
    path: PathLike | Iterable[PathLike],
    *,
    batch_size: int | None = None,
    on_bad_file: str = "fail",
    check_spaces: bool = True,
) -> BatchReader:
    """Yield the batches stored at ``path`` in the order written (see the module docstring).

    Raises ``FileNotFoundError`` at once for a missing path; while iterating,
    ``CheckpointError`` (``OfflineDataError`` for Parquet files) naming the file, and the
    row group where there is one, for a damaged file, unless ``on_bad_file="skip"``.
    ``check_spaces=False`` skips checking observations against their recorded spaces.
    """
    return BatchReader(
        path, batch_size=batch_size, on_bad_file=on_bad_file, check_spaces=check_spaces
    )


# ------------------------------------------------------------------------------- summaries
def _describe_column(value: Any) -> Any:
    if hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape[1:])}" if value.ndim > 1 else str(value.dtype)
    if isinstance(value, dict):
        return {k: _describe_column(v) for k, v in value.items()}
    return [_describe_column(v) for v in value]


def summarize_batches(path: PathLike | Iterable[PathLike]) -> dict[str, Any]:
    """What ``read_batches(path)`` holds, as JSON values for people: files, batches,
    rows and env steps, and per policy its rows and columns (dtype and per-row shape)."""
    files = list_batch_files(path)
    kinds = sorted({PARQUET_FILE if is_parquet(f) else BATCH_FILE for f in files}, key=str)
    summary: dict[str, Any] = {
        "format": " + ".join(f"{k.name} v{k.version}" for k in kinds or [BATCH_FILE]),
        "files": len(files),
        "first": files[0] if files else None,
        "last": files[-1] if files else None,
        "kinds": {},
        "env_steps": 0,
        "policies": {},
    }
    for batch in BatchReader(files):
        kind = type(batch).__name__
        summary["kinds"][kind] = summary["kinds"].get(kind, 0) + 1
        if isinstance(batch, MultiAgentBatch):
            summary["env_steps"] += batch.env_steps()
            per_policy = batch.policy_batches
        else:
            summary["env_steps"] += len(batch)
            per_policy = {str(batch.meta.get("policy_id", "default_policy")): batch}
        for pid, b in per_policy.items():
            entry = summary["policies"].setdefault(pid, {"rows": 0, "columns": {}})
            entry["rows"] += len(b)
            for name, col in b.items():
                entry["columns"].setdefault(name, _describe_column(col))
    return summary
