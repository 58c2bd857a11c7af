"""Reading ``rlconnect.parquet`` files back into batches, checking every step.

``read_parquet_parts(path)`` yields one ``BatchPart`` per batch record of the file (a batch
split across files has one part per file; ``rlconnect.offline.reader`` joins them). Every
defect raises ``OfflineDataError`` naming the file and, where the defect lies in one, the
row group: a missing or damaged footer (a truncated file), missing ``rlconnect`` metadata,
an unknown schema version, metadata that contradicts itself, a missing column, a column of
the wrong type or with nulls, and observations outside the space recorded for them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rlconnect.batches import SampleBatch
from rlconnect.batches.columns import OBSERVATION_COLUMNS
from rlconnect.checkpoints.formats import PARQUET_FILE
from rlconnect.offline._common import (
    METADATA_KEY,
    Malformed,
    OfflineDataError,
    expect,
    name_value_pairs,
)
from rlconnect.offline.parquet_format import (
    check_node,
    decode_column,
    decode_leaf,
    leaf_nodes,
)
from rlconnect.spaces import check_batch, space_from_json

__all__ = ["BatchPart", "ParquetFileReader", "read_parquet_parts"]


class BatchPart(NamedTuple):
    """The rows of one written batch that lie in one file."""

    number: int  # the batch's index in the run
    kind: str
    env_steps: int
    part: int
    last: bool
    policy_batches: dict[str, SampleBatch]


def _int(value: Any, lo: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


class ParquetFileReader:
    """One opened, validated file (footer and metadata); reads its batches lazily."""

    def __init__(self, path: str | os.PathLike[str], *, check_spaces: bool = True) -> None:
        self.path = os.fspath(path)
        self.check_spaces = check_spaces
        try:
            self.file = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise OfflineDataError(
                self.path,
                f"not a readable Parquet file: the footer is missing or damaged "
                f"(a truncated or unfinished file?) [{exc}]",
            ) from None
        try:
            self._parse(self.file.metadata.metadata or {})
        except Malformed as exc:
            raise OfflineDataError(self.path, str(exc)) from None

    # -- metadata -------------------------------------------------------------------------
    def _parse(self, kv: dict[bytes, bytes]) -> None:
        raw = kv.get(METADATA_KEY.encode())
        if raw is None:
            raise Malformed(
                f"no {METADATA_KEY!r} metadata: not written by rlconnect's ParquetBatchWriter"
            )
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise Malformed(f"the {METADATA_KEY!r} metadata is not valid JSON") from None
        expect(isinstance(doc, dict), "the metadata is not a JSON object")
        PARQUET_FILE.check(doc, where=f"the {METADATA_KEY!r} metadata", fail=Malformed)
        self.policies: dict[str, dict[str, Any]] = {}
        for pid, entry in name_value_pairs(doc.get("policies"), "policies"):
            self.policies[pid] = self._parse_policy(pid, entry)
        self.batches = [self._parse_batch(b, i) for i, b in enumerate(_list(doc, "batches"))]

    def _parse_policy(self, pid: str, entry: Any) -> dict[str, Any]:
        where = f"policy {pid!r}"
        expect(isinstance(entry, dict), f"{where} is not an object")
        columns = name_value_pairs(entry.get("columns"), f"{where} columns")
        for name, node in columns:
            check_node(node, f"{where} column {name!r}")
        spaces_json = entry.get("spaces", {})
        expect(isinstance(spaces_json, dict), f"{where} spaces is not an object")
        spaces = {}
        for col, sp in spaces_json.items():
            try:
                spaces[col] = space_from_json(sp)
            except (ValueError, TypeError) as exc:
                raise Malformed(
                    f"{where}: the recorded space of {col!r} is invalid: {exc}"
                ) from None
        leaves = [leaf for _, node in columns for leaf in leaf_nodes(node)]
        return {"columns": columns, "spaces": spaces, "leaves": leaves}

    def _parse_batch(self, rec: Any, i: int) -> dict[str, Any]:
        where = f"batch record {i}"
        expect(isinstance(rec, dict), f"{where} is not an object")
        expect(_int(rec.get("index")), f"{where}: bad index")
        expect(rec.get("kind") in ("SampleBatch", "MultiAgentBatch"), f"{where}: bad kind")
        expect(_int(rec.get("env_steps")), f"{where}: bad env_steps")
        expect(isinstance(rec.get("last"), bool), f"{where}: bad 'last'")
        expect(_int(rec.get("part")), f"{where}: bad 'part'")
        parts = name_value_pairs(rec.get("policies"), f"{where} policies")
        n_rg = self.file.metadata.num_row_groups
        for pid, e in parts:
            expect(pid in self.policies, f"{where}: unknown policy {pid!r}")
            expect(isinstance(e, dict) and _int(e.get("rows")), f"{where}: bad rows")
            rg = e.get("row_groups")
            expect(
                isinstance(rg, list)
                and len(rg) == 2
                and all(_int(x) for x in rg)
                and rg[0] <= rg[1] <= n_rg,
                f"{where}: row groups {rg!r} are not within the file's {n_rg}",
            )
            expect(isinstance(e.get("meta"), dict), f"{where}: meta is not an object")
        if rec["kind"] == "SampleBatch":
            expect(len(parts) == 1, f"{where}: a SampleBatch holds one policy")
        return {**rec, "policies": parts}

    # -- data -----------------------------------------------------------------------------
    def parts(self) -> Iterator[BatchPart]:
        """The file's batch parts, in the order written, read one at a time."""
        for rec in self.batches:
            batches = {pid: self._read_policy(pid, e) for pid, e in rec["policies"]}
            yield BatchPart(
                rec["index"], rec["kind"], rec["env_steps"], rec["part"], rec["last"], batches
            )

    def _read_policy(self, pid: str, entry: dict[str, Any]) -> SampleBatch:
        info = self.policies[pid]
        leaves = info["leaves"]
        start, stop = entry["row_groups"]
        chunks: dict[str, list[np.ndarray]] = {leaf["column"]: [] for leaf in leaves}
        for rg in range(start, stop):
            try:
                arrays = self._read_row_group(rg, leaves)
                if self.check_spaces:
                    self._check_spaces(info, arrays)
            except Malformed as exc:
                raise OfflineDataError(self.path, str(exc), rg) from None
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise OfflineDataError(self.path, f"damaged data [{exc}]", rg) from None
            for name, arr in arrays.items():
                chunks[name].append(arr)
        arrays = {leaf["column"]: _join(chunks[leaf["column"]], leaf) for leaf in leaves}
        columns = {name: decode_column(node, arrays) for name, node in info["columns"]}
        try:
            batch = SampleBatch(columns, meta=entry["meta"])
        except (ValueError, TypeError) as exc:
            raise OfflineDataError(self.path, f"policy {pid!r}: {exc}", start) from None
        if len(batch) != entry["rows"] and columns:
            raise OfflineDataError(
                self.path, f"policy {pid!r}: {len(batch)} rows, metadata says {entry['rows']}"
            )
        return batch

    def _read_row_group(self, rg: int, leaves: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        names = [leaf["column"] for leaf in leaves]
        present = set(self.file.schema_arrow.names)
        missing = [n for n in names if n not in present]
        expect(not missing, f"column(s) {missing} missing (listed in the file's metadata)")
        rows = self.file.metadata.row_group(rg).num_rows
        table = self.file.read_row_group(rg, columns=names)
        return {
            leaf["column"]: decode_leaf(leaf, table.column(leaf["column"]), rows) for leaf in leaves
        }

    @staticmethod
    def _check_spaces(info: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        for name, node in info["columns"]:
            space = info["spaces"].get(name)
            if space is None or name not in OBSERVATION_COLUMNS:
                continue
            try:
                check_batch(space, decode_column(node, arrays), field=name)
            except ValueError as exc:
                raise Malformed(f"observations outside the recorded space: {exc}") from None


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise Malformed(f"metadata {key!r} is not a list")
    return value


def _join(chunks: list[np.ndarray], leaf: dict[str, Any]) -> np.ndarray:
    if len(chunks) == 1:
        return chunks[0]
    if chunks:
        return np.concatenate(chunks)
    return np.empty((0, *leaf["shape"]), dtype=np.dtype(leaf["dtype"]))


def read_parquet_parts(
    path: str | os.PathLike[str], *, check_spaces: bool = True
) -> Iterator[BatchPart]:
    """Open and validate ``path`` now; yield its batch parts lazily."""
    return ParquetFileReader(path, check_spaces=check_spaces).parts()
