"""``ParquetBatchWriter``: batches to Apache Parquet files, rolled at a size limit.

>>> import os, tempfile, numpy as np
>>> from rlconnect import SampleBatch
>>> from rlconnect.offline import ParquetBatchWriter, read_batches
>>> d = tempfile.mkdtemp()
>>> with ParquetBatchWriter(d) as w:
...     w.write(SampleBatch({"obs": np.zeros((3, 2), np.float32), "infos": [{}, {"x": 1}, {}]}))
>>> sorted(os.listdir(d))
['part-000-000000.parquet']
>>> [b["infos"][1] for b in read_batches(d)]
[{'x': 1}]

Files
-----
``DIR/part-WWW-NNNNNN.parquet``: ``WWW`` is the writer's ``worker_index``, ``NNNNNN`` its
file number (continuing after the highest already in ``DIR``). A file is written under a
hidden temp name (``.part-....tmp``) and, once complete (footer written, fsynced), linked
to its final name, which is never overwritten; so a crash mid-write leaves every earlier
file complete and no half-written file under a ``.parquet`` name (only, at worst, a stale
``.tmp`` file). ``flush()`` finishes the open file; the runner calls it after every
``sample()``, so everything sampled is in finished files when ``sample()`` returns.
A ``write`` that fails (an exception, Ctrl-C) takes the folder back to the last
``flush()``: the open file and any file rolled since are removed, so no batch is ever
left in pieces. (One file's encoding and writing: ``rlconnect.offline.parquet_file``.)

A file is rolled (finished, and the next one started) before a row group that would take
it past ``max_file_size`` bytes (estimated from the compression seen so far); a batch
bigger than that is split across files. A file also ends when a batch's columns differ
from the open file's (one schema per file).

Compression: the columns named in ``compress_columns`` (a nested column's leaves
included) are compressed with ``compression`` (zstd by default), the others are stored
uncompressed (``policy_id``, ``agent_id`` and ``infos`` dictionary-encoded).

Metadata (key ``rlconnect``, schema version 1)
------------------------------------------------
::

    {"format": "rlconnect.parquet", "version": 1,
     "policies": [[policy_id, {"columns": [[name, NODE], ...],      # batch column order
                               "spaces": {"obs": SPACE, ...}}], ...],
     "batches": [{"index": 7, "kind": "SampleBatch" | "MultiAgentBatch",
                  "env_steps": 400, "part": 0, "last": true,
                  "policies": [[policy_id, {"rows": 200, "row_groups": [3, 5],
                                            "meta": {...}}], ...]}, ...]}

    NODE = {"node": "leaf", "column": "obs/pos", "encoding": "scalar" | "list" |
            "tensor" | "json", "dtype": "<f4", "shape": [3]}    # per-row shape
         | {"node": "dict", "items": [[key, NODE], ...]}
         | {"node": "tuple", "items": [NODE, ...]}

``SPACE`` is ``rlconnect.spaces.space_to_json`` of the space the column's rows lie in
(for the runner: the agent pipeline's output space for ``obs`` / ``new_obs``, its input
space for ``raw_obs``, the policy's action space for ``actions``). A batch's rows of one
policy are row groups ``[start, stop)`` of the file, in row order; a batch split across
files has one record per file, numbered by ``part`` (0, 1, ...), ``"last": false`` in
all but the last. ``meta`` is the JSON form of
``SampleBatch.meta``. A leaf column's name is its path; when two policies store the same
column with different layouts, the second one's is suffixed ``@policy_id``. Rows of one
policy hold nulls in the columns of another.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow as pa

from rlconnect.batches import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from rlconnect.offline._common import (
    AGENT_ID_COLUMN,
    PARQUET_FILE_RE,
    POLICY_ID_COLUMN,
    parquet_file_name,
)
from rlconnect.offline.parquet_file import _fsync_dir as _fsync_dir
from rlconnect.offline.parquet_file import _next_free as _next_free
from rlconnect.offline.parquet_file import _OpenFile, _PolicyRows
from rlconnect.spaces import space_to_json

__all__ = ["PARQUET_FILE_RE", "ParquetBatchWriter", "parquet_file_name"]

_ROW_GROUP_BYTES = 32 * 1024 * 1024

Batch = SampleBatch | MultiAgentBatch
SpacesArg = Mapping[str, gym.Space] | Mapping[str, Mapping[str, gym.Space]] | None


class ParquetBatchWriter:
    """Writes batches to Parquet files under ``directory``; see the module docstring.

    Args:
        directory: created if missing; reopening a folder appends new files.
        max_file_size: roll files at about this many bytes.
        compress_columns: batch columns stored compressed (others: uncompressed).
        compression: the Parquet codec for them ("zstd", "snappy", "gzip", "lz4", ...).
        spaces: spaces recorded in the metadata: ``{"obs": space, ...}`` for every policy,
            or ``{policy_id: {"obs": space, ...}}``; the reader checks rows against them.
        worker_index: part of the file names, so several runners can share a folder.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_file_size: int = 64 * 1024 * 1024,
        compress_columns: Sequence[str] = ("obs", "new_obs"),
        compression: str = "zstd",
        spaces: SpacesArg = None,
        worker_index: int = 0,
    ) -> None:
        if isinstance(max_file_size, bool) or not isinstance(max_file_size, int):
            raise ValueError(f"max_file_size={max_file_size!r}: must be an integer >= 1")
        if max_file_size < 1:
            raise ValueError(f"max_file_size={max_file_size!r}: must be an integer >= 1")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"output {str(self.directory)!r} is not a folder")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_size = max_file_size
        self.compress_columns = tuple(compress_columns)
        self.compression = compression
        self.worker_index = int(worker_index)
        self._spaces = self._space_json(spaces)
        numbers = [
            int(m.group(2))
            for p in self.directory.iterdir()
            if (m := PARQUET_FILE_RE.match(p.name)) and int(m.group(1)) == self.worker_index
        ]
        self._next_file = max(numbers) + 1 if numbers else 0
        self._next_batch = 0
        self._open: _OpenFile | None = None
        self._ratio = 1.0  # bytes on disk per uncompressed byte, learnt while writing
        self._seen = [0, 0]  # uncompressed bytes, bytes on disk (finished row groups)
        self._footer = 4096  # bytes of the last file's footer (schema and metadata)
        self.paths: list[Path] = []
        self._since_flush: list[Path] = []
        self.closed = False

    @staticmethod
    def _space_json(spaces: SpacesArg) -> dict[str, dict[str, Any]]:
        if not spaces:
            return {}
        per_policy = isinstance(next(iter(spaces.values())), Mapping)
        out: dict[str, dict[str, Any]] = {}
        for key, value in spaces.items():
            if isinstance(value, Mapping) != per_policy:
                raise TypeError(
                    "spaces: give {column: space} for every policy, or {policy_id: {column: "
                    f"space}}, not a mix of both (see {key!r})"
                )
            if isinstance(value, Mapping):
                out[key] = {col: space_to_json(sp) for col, sp in value.items()}
            else:
                out.setdefault("*", {})[key] = space_to_json(value)
        return out

    # -- writing --------------------------------------------------------------------------
    def write(self, batch: Batch, *, agent_ids: Mapping[str, Any] | None = None) -> None:
        """Append ``batch`` (its rows may stay in the open file until ``flush``).

        ``agent_ids``: per policy id, the agent id of every row (default: ``"agent0"``).
        Every column is encoded before anything is written, so a batch that cannot be
        stored raises TypeError / ValueError and leaves the files as they were.
        """
        if self.closed:
            raise ValueError("this ParquetBatchWriter is closed")
        if isinstance(batch, SampleBatch):
            pid = str(batch.meta.get("policy_id", DEFAULT_POLICY_ID))
            parts, kind, env_steps = {pid: batch}, "SampleBatch", len(batch)
        elif isinstance(batch, MultiAgentBatch):
            parts, kind = batch.policy_batches, "MultiAgentBatch"
            env_steps = batch.env_steps()
        else:
            raise TypeError(f"can only write SampleBatch or MultiAgentBatch, not {type(batch)}")
        ids = agent_ids or {}
        encoded = [_PolicyRows(pid, b, ids.get(pid)) for pid, b in parts.items()]
        record = {"index": self._next_batch, "kind": kind, "env_steps": int(env_steps)}
        self._next_batch += 1
        try:
            self._write_rows(encoded, record)
        except BaseException:
            self._abort()
            raise

    def _layout(self, encoded: list[_PolicyRows], base: pa.Schema | None) -> dict[str, Any]:
        """Parquet column per leaf (renamed ``name@pid`` on a layout clash) and the schema."""
        fields: dict[str, pa.DataType] = {} if base is None else dict(zip(base.names, base.types))
        fields.setdefault(POLICY_ID_COLUMN, pa.string())
        fields.setdefault(AGENT_ID_COLUMN, pa.string())
        names: dict[str, dict[str, str]] = {}
        for p in encoded:
            rename = names.setdefault(p.pid, {})
            for name, arr in p.leaves:
                col = name if fields.get(name, arr.type) == arr.type else f"{name}@{p.pid}"
                if fields.get(col, arr.type) != arr.type:
                    raise ValueError(f"policy {p.pid!r}: column {name!r} clashes with {col!r}")
                fields[col] = arr.type
                rename[name] = col
        return {"fields": fields, "names": names}

    def _policy_entry(self, p: _PolicyRows, names: dict[str, str]) -> dict[str, Any]:
        def renamed(node: dict[str, Any]) -> dict[str, Any]:
            if node["node"] == "leaf":
                return {**node, "column": names[node["column"]]}
            if node["node"] == "dict":
                return {**node, "items": [[k, renamed(v)] for k, v in node["items"]]}
            return {**node, "items": [renamed(v) for v in node["items"]]}

        spaces = self._spaces.get(p.pid, self._spaces.get("*", {}))
        return {
            "columns": [[k, renamed(n)] for k, n in p.columns],
            "spaces": {c: s for c, s in spaces.items() if c in dict(p.columns)},
        }

    def _ensure_file(self, encoded: list[_PolicyRows]) -> tuple[_OpenFile, dict[str, Any]]:
        f = self._open
        if f is not None:
            layout = self._layout(encoded, f.schema)
            same = len(layout["fields"]) == len(f.schema.names) and all(
                f.policies.get(p.pid, entry) == entry
                for p in encoded
                for entry in [self._policy_entry(p, layout["names"][p.pid])]
            )
            if same:
                return f, layout
            self._roll()
        layout = self._layout(encoded, None)
        schema = pa.schema(list(layout["fields"].items()))
        f = self._open = _OpenFile(self._temp_name(), schema, self._options(schema))
        return f, layout

    def _options(self, schema: pa.Schema) -> dict[str, Any]:
        def top(name: str) -> str:
            return name.split("/", 1)[0].split("@", 1)[0]

        codecs = {}
        for n, t in zip(schema.names, schema.types):
            codec = self.compression if top(n) in self.compress_columns else "none"
            codecs[f"{n}.list.element" if pa.types.is_fixed_size_list(t) else n] = codec
        dictionary = [POLICY_ID_COLUMN, AGENT_ID_COLUMN] + [
            n for n, t in zip(schema.names, schema.types) if pa.types.is_string(t)
        ]
        stats = [n for n, t in zip(schema.names, schema.types) if pa.types.is_primitive(t)]
        return {
            "compression": codecs,
            "use_dictionary": sorted(set(dictionary)),
            "write_statistics": stats,
        }

    def _temp_name(self) -> Path:
        final = parquet_file_name(self.worker_index, self._next_file)
        return self.directory / f".{final}.{uuid.uuid4().hex}.tmp"

    def _register(self, f: _OpenFile, p: _PolicyRows, layout: dict[str, Any]) -> None:
        f.policies.setdefault(p.pid, self._policy_entry(p, layout["names"][p.pid]))

    def _write_rows(self, encoded: list[_PolicyRows], record: dict[str, Any]) -> None:
        f, layout = self._ensure_file(encoded)
        entries: list[list[Any]] = []
        part = 0
        for p in encoded:
            self._register(f, p, layout)
            per_row = max(p.nbytes / max(p.rows, 1), 1.0)
            step = max(1, int(min(self.max_file_size / 2, _ROW_GROUP_BYTES) // per_row))
            start_rg = f.row_groups
            for a in range(0, p.rows, step):
                b = min(p.rows, a + step)
                if (
                    f.row_groups
                    and f.size() + (b - a) * per_row * self._ratio + self._footer
                    > self.max_file_size
                ):
                    entries.append([p.pid, f.entry(p.meta, start_rg)])
                    f.batches.append({**record, "part": part, "last": False, "policies": entries})
                    part += 1
                    self._roll()
                    f, layout = self._ensure_file(encoded)
                    self._register(f, p, layout)
                    entries, start_rg = [], f.row_groups
                before = f.size()
                f.write(self._table(p, layout, f.schema, a, b))
                self._learn(p.nbytes * (b - a) / p.rows, f.size() - before)
            entries.append([p.pid, f.entry(p.meta, start_rg)])
        f.batches.append({**record, "part": part, "last": True, "policies": entries})

    def _learn(self, raw: float, written: int) -> None:
        self._seen[0] += int(raw)
        self._seen[1] += max(written, 0)
        if self._seen[0] > 0 and self._seen[1] > 0:
            self._ratio = min(max(self._seen[1] / self._seen[0], 0.01), 2.0)

    def _table(
        self, p: _PolicyRows, layout: dict[str, Any], schema: pa.Schema, a: int, b: int
    ) -> pa.Table:
        own = {layout["names"][p.pid][n]: arr.slice(a, b - a) for n, arr in p.leaves}
        own[POLICY_ID_COLUMN] = pa.repeat(pa.scalar(p.pid), b - a)
        own[AGENT_ID_COLUMN] = p.agent_ids.slice(a, b - a)
        arrays = [own.get(n, pa.nulls(b - a, t)) for n, t in zip(schema.names, schema.types)]
        return pa.Table.from_arrays(arrays, schema=schema)

    def flush(self) -> list[Path]:
        """Finish the open file (if any); returns the paths finished since the last flush."""
        self._roll()
        done, self._since_flush = self._since_flush, []
        return done

    def _roll(self) -> None:
        f, self._open = self._open, None
        if f is None:
            return
        if not f.batches:
            f.abort()
            return
        final = self.directory / parquet_file_name(self.worker_index, self._next_file)
        try:
            path = f.finish(final)
        except BaseException:
            f.abort()
            raise
        self._footer = max(path.stat().st_size - f.data_end, 0)
        m = PARQUET_FILE_RE.match(path.name)
        self._next_file = (int(m.group(2)) if m else self._next_file) + 1
        self.paths.append(path)
        self._since_flush.append(path)

    def _abort(self) -> None:
        """Back to the last ``flush()``: drop the open file and the files rolled since."""
        f, self._open = self._open, None
        if f is not None:
            f.abort()
        for path in self._since_flush:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self.paths.remove(path)
        self._since_flush = []

    def close(self) -> None:
        """Finish the open file and stop accepting batches."""
        if not self.closed:
            self.flush()
            self.closed = True

    def __enter__(self) -> ParquetBatchWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is not None:
            self._abort()
            self.closed = True
        else:
            self.close()
