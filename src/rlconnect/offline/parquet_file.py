"""One Parquet file of a ``ParquetBatchWriter``: a policy's rows encoded, the file written.

``_PolicyRows`` encodes one policy's rows of one batch (leaf columns, column nodes, agent
ids) before anything is written; ``_OpenFile`` is a file being written under its hidden
temp name, finished (metadata, fsync) and linked to a final name that is never
overwritten. The file layout and metadata are described in
``rlconnect.offline.parquet_writer``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlconnect.batches import DEFAULT_AGENT_ID, SampleBatch
from rlconnect.checkpoints.formats import PARQUET_FILE
from rlconnect.offline._common import (
    METADATA_KEY,
    PARQUET_FILE_RE,
    RESERVED_COLUMNS,
    parquet_file_name,
)
from rlconnect.offline.json_values import to_json_value
from rlconnect.offline.parquet_format import encode_column

__all__: list[str] = []  # internal to rlconnect.offline.parquet_writer


class _PolicyRows:
    """One policy's rows of one batch, encoded: leaves, nodes, ids."""

    def __init__(self, pid: str, batch: SampleBatch, agent_ids: Any) -> None:
        self.pid, self.rows, self.meta = pid, len(batch), to_json_value(batch.meta)
        reserved = RESERVED_COLUMNS & set(batch.keys())
        if reserved:
            raise ValueError(f"policy {pid!r}: columns {sorted(reserved)} are reserved")
        self.leaves: list[tuple[str, pa.Array]] = []
        self.columns: list[tuple[str, dict[str, Any]]] = [
            (k, encode_column(v, k, self.leaves)) for k, v in batch.items()
        ]
        names = [n for n, _ in self.leaves]
        if len(set(names)) != len(names):
            raise ValueError(f"policy {pid!r}: flattened column names collide: {names}")
        if agent_ids is None:
            self.agent_ids = pa.repeat(pa.scalar(DEFAULT_AGENT_ID), self.rows)
        else:
            ids = [str(a) for a in agent_ids]
            if len(ids) != self.rows:
                raise ValueError(f"policy {pid!r}: {len(ids)} agent ids for {self.rows} rows")
            self.agent_ids = pa.array(ids, pa.string())
        self.nbytes = sum(a.nbytes for _, a in self.leaves) + self.agent_ids.nbytes


class _OpenFile:
    """A Parquet file being written under its temp name."""

    def __init__(self, tmp: Path, schema: pa.Schema, options: dict[str, Any]) -> None:
        self.tmp, self.schema = tmp, schema
        self.sink = open(tmp, "xb")  # noqa: SIM115  (closed in finish / abort)
        self.writer = pq.ParquetWriter(self.sink, schema, **options)
        self.row_groups = 0
        self.rg_rows: list[int] = []
        self.policies: dict[str, dict[str, Any]] = {}
        self.batches: list[dict[str, Any]] = []

    def size(self) -> int:
        return self.sink.tell()

    def write(self, table: pa.Table) -> int:
        self.writer.write_table(table, row_group_size=max(len(table), 1))
        self.row_groups += 1
        self.rg_rows.append(len(table))
        return self.row_groups - 1

    def entry(self, meta: Any, start_rg: int) -> dict[str, Any]:
        """A batch's rows of one policy in this file: row groups ``start_rg`` to now."""
        rows = sum(self.rg_rows[start_rg:])
        return {"rows": rows, "row_groups": [start_rg, self.row_groups], "meta": meta}

    def finish(self, final: Path) -> Path:
        doc = {
            **PARQUET_FILE.header(),
            "policies": [[pid, p] for pid, p in self.policies.items()],
            "batches": self.batches,
        }
        self.data_end = self.sink.tell()
        text = json.dumps(doc, allow_nan=True, separators=(",", ":"))
        self.writer.add_key_value_metadata({METADATA_KEY: text})
        self.writer.close()
        self.sink.flush()
        os.fsync(self.sink.fileno())
        self.sink.close()
        target = final
        while True:  # never overwrite a finished file
            try:
                os.link(self.tmp, target)
                break
            except FileExistsError:
                target = _next_free(target)
        os.unlink(self.tmp)
        _fsync_dir(target.parent)
        return target

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(Exception):
            self.sink.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)


def _next_free(path: Path) -> Path:
    m = PARQUET_FILE_RE.match(path.name)
    worker, number = (int(m.group(1)), int(m.group(2)) + 1) if m else (0, 0)
    return path.with_name(parquet_file_name(worker, number))


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
