"""Hostile offline files: ``rc.read_batches`` (whole, re-cut, skipping), ``summarize_batches``
and ``rlconnect inspect`` raise only ``CheckpointError`` / ``OfflineDataError``, run no code,
import nothing and stay within memory (numpy and Arrow allocations both counted).

``.rlb`` files get byte, tensor-table and structure mutations (re-packed with a valid
checksum), plus grammar-generated column nodes with hostile dtypes and shapes. Parquet files
get byte mutations, their ``rlconnect`` metadata edited (the file re-written by pyarrow,
so the metadata checks are reached) and page headers declaring huge sizes.
``tests/offline`` holds the hand-written damaged-file cases.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.checkpoints import BATCH_FILE
from rlconnect.cli.describe import describe_path, render
from rlconnect.cli.errors import UsageError
from rlconnect.offline import read_batches, summarize_batches

pytestmark = pytest.mark.reliability

ALLOWED = (rc.CheckpointError,)  # OfflineDataError is a CheckpointError
LOADERS = ["read_batches", "read_batches_recut", "read_batches_skip", "summarize", "inspect"]


def sample_batches() -> list[rc.SampleBatch | rc.MultiAgentBatch]:
    """Batches using every column encoding: nested, tuple, image, complex, object, infos."""
    rows = 5
    b = rc.SampleBatch(
        {
            "obs": {
                "pos": np.linspace(-1, 1, rows * 2).reshape(rows, 2),
                "img": np.arange(rows * 400, dtype=np.uint8).reshape(rows, 20, 20),
            },
            "pair": (np.arange(rows), np.ones(rows, bool)),
            "actions": np.arange(rows),
            "c": np.arange(rows) * (1 + 2j),
            "infos": [{}, {"x": 1}, {}, {"y": [1, 2]}, {}],
        }
    )
    other = rc.SampleBatch(
        {"obs": np.zeros((3, 4), np.float32), "infos": [{}] * 3, "rewards": np.ones(3)}
    )
    return [b, rc.MultiAgentBatch({"p0": b, "p1": other}, 6)]


class Files:
    """Valid ``.rlb`` and Parquet files, the canary folder, one Guard per loader."""

    def __init__(self, root: Path) -> None:
        self.root, self.marker_dir = root, root / "canary"
        self.marker_dir.mkdir()
        batches = sample_batches()
        rlb = rc.offline.write_batches(batches, root / "rlb")
        self.valid = {"rlb_single": rlb[0].read_bytes(), "rlb_multi": rlb[1].read_bytes()}
        space = gym.spaces.Box(-1, 1, (4,), np.float32)
        with rc.offline.ParquetBatchWriter(root / "pq", spaces={"p1": {"obs": space}}) as w:
            for b in batches:
                w.write(b)
        self.parquet_path = next((root / "pq").glob("*.parquet"))
        self.valid["parquet"] = self.parquet_path.read_bytes()
        pf = pq.ParquetFile(self.parquet_path)
        self.parquet_groups = [pf.read_row_group(i) for i in range(pf.metadata.num_row_groups)]
        self.parquet_schema = pf.schema_arrow
        self.parquet_meta = json.loads(pf.metadata.metadata[b"rlconnect"])
        self.page_offsets = sorted(
            {
                off
                for i in range(pf.metadata.num_row_groups)
                for j in range(pf.metadata.num_columns)
                for off in (
                    pf.metadata.row_group(i).column(j).data_page_offset,
                    pf.metadata.row_group(i).column(j).dictionary_page_offset,
                )
                if off is not None
            }
        )
        for name in self.valid:  # warm-up: what a good load imports
            self.check(self.valid[name], "valid", "valid", name, record=False)
        self.guards = {
            n: fc.Guard(f"offline:{n}", (*ALLOWED, UsageError), self.marker_dir, arrow=True)
            for n in LOADERS
        }

    def check(
        self, data: bytes, what: object, kind: str | None, suffix: str, record: bool = True
    ) -> list[str]:
        """Write ``data`` as a batch file and read it every way."""
        path = self.root / ("hostile.parquet" if suffix == "parquet" else "batch-000000.rlb")
        for old in (self.root / "hostile.parquet", self.root / "batch-000000.rlb"):
            old.unlink(missing_ok=True)
        path.write_bytes(data)

        def skipping() -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rc.offline.BadFileWarning)
                list(read_batches(path, on_bad_file="skip"))

        loads = {
            "read_batches": lambda: list(read_batches(path)),
            "read_batches_recut": lambda: list(read_batches(path, batch_size=2)),
            "read_batches_skip": skipping,
            "summarize": lambda: summarize_batches(path),
            "inspect": lambda: json.dumps(render(describe_path(str(path))), default=str),
        }
        if not record:
            for load in loads.values():
                load()
            return []
        return [self.guards[n].run(loads[n], what, kind) for n in LOADERS]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Iterator[Files]:
    yield Files(tmp_path_factory.mktemp("hostile_offline"))
    fc.publish([f"offline:{n}" for n in LOADERS])


RLB = st.sampled_from(["rlb_single", "rlb_multi"])


# -- .rlb files ------------------------------------------------------------------------------
@settings(fc.SETTINGS, max_examples=fc.examples(50))
@given(which=st.sampled_from(["rlb_single", "rlb_multi", "parquet"]), data=st.data())
def test_mutated_bytes(files: Files, which: str, data: st.DataObject) -> None:
    mutation = data.draw(fc.byte_mutations({k: v for k, v in files.valid.items() if k != which}))
    suffix = "parquet" if which == "parquet" else "rlb"
    files.check(
        mutation.apply(files.valid[which]),
        f"{which}: {mutation}",
        str(mutation).split("(")[0],
        suffix,
    )


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(which=RLB, mutation=fc.tensor_mutations())
def test_mutated_rlb_tensor_table(files: Files, which: str, mutation: fc.Mutation) -> None:
    files.check(mutation.apply(files.valid[which]), mutation, "tensor_table", "rlb")


def rlb_structure(data: bytes) -> tuple[Any, dict[str, np.ndarray]]:
    header, _ = fc.split_container(data)
    return json.loads(header["__metadata__"]["structure"]), safetensors.numpy.load(data)


@settings(fc.SETTINGS, max_examples=fc.examples(60))
@given(which=RLB, edits=fc.json_edits())
def test_mutated_rlb_structure(files: Files, which: str, edits: list[fc.JsonEdit]) -> None:
    obj, arrays = rlb_structure(files.valid[which])
    text = fc.json_text(fc.apply_edits(obj, edits))
    files.check(fc.pack_text(text, arrays, BATCH_FILE.name, 1), edits, "structure_edit", "rlb")


DTYPES = st.sampled_from(
    [
        "<c16",
        "<U5",
        "|S3",
        "<M8[ns]",
        "<m8[D]",
        ">f8",
        "|O",
        "O",
        "|V8",
        "<U1000000000",
        "<f8[(3,)]",
        "<i8",
        "float32",
        "uint8",
        "bool",
        "=f4",
        "|b1",
        "<U0",
        "",
    ]
)
SHAPES = st.lists(st.sampled_from([0, 1, 2, 3, 5, -1, 10**12, 2**63]), max_size=3)
ARRAYS = st.sampled_from(
    [
        np.zeros(0, np.uint8),
        np.arange(10, dtype=np.uint8),
        np.zeros(5, np.float32),
        np.zeros((5, 2)),
        np.frombuffer(b'[{}, 1, "a", null, [1]]', np.uint8).copy(),
        np.frombuffer(b"[" + b"[" * 5000 + b"]" * 5000 + b"]", np.uint8).copy(),
    ]
)


def column_nodes(depth: int = 2) -> st.SearchStrategy[Any]:
    leaf = st.fixed_dictionaries(
        {
            "node": st.sampled_from(["array", "raw", "json", "bogus"]),
            "shape": SHAPES,
            "data": ARRAYS,
        },
        optional={"dtype": DTYPES},
    )
    if depth == 0:
        return leaf
    inner = column_nodes(depth - 1)
    return leaf | st.fixed_dictionaries(
        {
            "node": st.sampled_from(["dict", "tuple"]),
            "items": st.lists(inner, max_size=2)
            | st.lists(st.tuples(st.text(max_size=3), inner).map(list), max_size=2),
        }
    )


@settings(fc.SETTINGS, max_examples=fc.examples(80))
@given(count=st.sampled_from([0, 3, 5, -1, 10**12]), columns=st.lists(column_nodes(), max_size=3))
def test_generated_rlb_columns(files: Files, count: int, columns: list[Any]) -> None:
    """Grammar-generated column nodes: every decoder branch with hostile dtypes and shapes."""
    arrays: dict[str, np.ndarray] = {}

    def refs(node: Any) -> Any:  # arrays become {"__array__": key} references
        if isinstance(node, np.ndarray):
            arrays[f"arr_{len(arrays)}"] = node
            return {"__array__": f"arr_{len(arrays) - 1}"}
        if isinstance(node, dict):
            return {k: refs(v) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [refs(v) for v in node]
        return node

    batch = {"count": count, "meta": "{}", "columns": [[f"c{i}", c] for i, c in enumerate(columns)]}
    obj = refs({"kind": "SampleBatch", "index": 0, "batch": batch})
    text = fc.json_text(obj)
    files.check(fc.pack_text(text, arrays, BATCH_FILE.name, 1), obj, "generated", "rlb")


# -- Parquet files ---------------------------------------------------------------------------
def rewrite_parquet(files: Files, meta: bytes, path: Path) -> bytes:
    """The valid Parquet file with its ``rlconnect`` metadata replaced by ``meta``."""
    schema = files.parquet_schema.with_metadata({b"rlconnect": meta})
    with pq.ParquetWriter(path, schema) as w:
        for table in files.parquet_groups:
            w.write_table(table.replace_schema_metadata({b"rlconnect": meta}))
    return path.read_bytes()


@settings(fc.SETTINGS, max_examples=fc.examples(50))
@given(edits=fc.json_edits())
def test_mutated_parquet_metadata(files: Files, edits: list[fc.JsonEdit]) -> None:
    text = fc.json_text(fc.apply_edits(files.parquet_meta, edits))
    data = rewrite_parquet(files, text.encode("utf-8", "surrogatepass"), files.root / "tmp.pq")
    files.check(data, edits, "metadata_edit", "parquet")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> int:
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


def page_size_edit(data: bytes, offset: int, field: int, value: int) -> bytes:
    """Rewrite field 2 (uncompressed) or 3 (compressed page size) of the Thrift page
    header at ``offset`` (fields 1-3 are i32s, each ``0x15`` + a zigzag varint)."""
    pos = offset
    for f in (1, 2, 3):
        if data[pos] != 0x15:
            return data
        end = _read_varint(data, pos + 1)
        if f == field:
            zigzag = (value << 1) ^ (value >> 31)
            return data[: pos + 1] + _varint(zigzag & 0xFFFFFFFF) + data[end:]
        pos = end
    return data


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(
    page=st.integers(0, 100),
    field=st.sampled_from([2, 3]),
    value=st.sampled_from([2**31 - 1, 2**30, 10**9, -1, -(2**31), 0, 1 << 20]),
)
def test_parquet_pages_declaring_huge_sizes(files: Files, page: int, field: int, value: int):
    offset = files.page_offsets[page % len(files.page_offsets)]
    data = page_size_edit(files.valid["parquet"], offset, field, value)
    assert data != files.valid["parquet"]
    files.check(data, f"page at {offset}: field {field} = {value}", "page_size", "parquet")


# -- canaries --------------------------------------------------------------------------------
def test_canaries_in_offline_files(files: Files) -> None:
    marker = files.marker_dir / "PWNED"
    payload = fc.pickle_canary(marker)
    pickled = {"arr_0": np.frombuffer(payload, np.uint8).copy()}
    raw_object = {"node": "raw", "dtype": "|O8", "shape": [1], "data": {"__array__": "arr_0"}}
    object_meta = json.loads(json.dumps(files.parquet_meta))
    columns = dict(object_meta["policies"][0][1]["columns"])
    columns["actions"]["dtype"] = "|O"  # a scalar int64 leaf declared as Python objects
    object_meta["policies"][0][1]["columns"] = [[k, v] for k, v in columns.items()]
    cases = {
        "pickle file (.rlb)": (payload, "rlb"),
        "pickle file (.parquet)": (payload, "parquet"),
        "pickle bytes as an object column": (
            fc.pack_text(
                json.dumps(
                    {
                        "kind": "SampleBatch",
                        "index": 0,
                        "batch": {"count": 1, "meta": "{}", "columns": [["x", raw_object]]},
                    }
                ),
                pickled,
                BATCH_FILE.name,
                1,
            ),
            "rlb",
        ),
        "object dtype in parquet metadata": (
            rewrite_parquet(files, json.dumps(object_meta).encode(), files.root / "tmp.pq"),
            "parquet",
        ),
        "msgpack-numpy object marker in infos": (
            fc.pack_text(
                json.dumps(
                    {
                        "kind": "SampleBatch",
                        "index": 0,
                        "batch": {
                            "count": 1,
                            "meta": "{}",
                            "columns": [
                                [
                                    "infos",
                                    {"node": "json", "shape": [1], "data": {"__array__": "arr_0"}},
                                ]
                            ],
                        },
                    }
                ),
                {
                    "arr_0": np.frombuffer(
                        json.dumps([{"nd": True, "kind": "O", "data": list(payload)}]).encode(),
                        np.uint8,
                    ).copy()
                },
                BATCH_FILE.name,
                1,
            ),
            "rlb",
        ),
    }
    for what, (data, suffix) in cases.items():
        outcomes = files.check(data, what, "canary", suffix)
        if what != "msgpack-numpy object marker in infos":  # plain JSON infos are data
            assert outcomes[0] in ("CheckpointError", "OfflineDataError"), (what, outcomes)
    batch = next(iter(read_batches(files.root / "batch-000000.rlb")))
    assert batch["infos"][0]["kind"] == "O"  # read back as a plain dict: nothing unpickled
    assert not marker.exists()


# -- regressions: library bugs this suite found -------------------------------------------------
@pytest.mark.parametrize("version", [[], {}, [1]])
def test_regression_unhashable_schema_version_is_offline_data_error(
    files: Files, version: Any
) -> None:
    """A Parquet schema version given as a JSON list or object raised TypeError."""
    meta = {**files.parquet_meta, "version": version}
    data = rewrite_parquet(files, json.dumps(meta).encode(), files.root / "tmp.pq")
    (files.root / "v.parquet").write_bytes(data)
    with pytest.raises(rc.offline.OfflineDataError, match=r"malformed rlconnect\.parquet format"):
        list(read_batches(files.root / "v.parquet"))
