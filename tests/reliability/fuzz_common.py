"""Shared pieces of the hostile-input fuzz tests (``test_hostile_*.py``).

- **Mutators**: hypothesis strategies that draw a printable, replayable ``Mutation`` of a
  file's bytes (flips, truncation, insertion, deletion, splices with another valid file,
  interesting values, the 8-byte header length rewritten), of the safetensors tensor
  table (dtype / shape / offsets rewritten to huge, negative or wrongly typed values), or
  of a JSON tree (``JsonEdit``: a value replaced by a hostile one, a key dropped or
  added, a subtree nested 10^5 deep).
- **Canaries**: a pickle whose ``__reduce__`` creates a marker file, and ``module:attr``
  names; loading must never create the marker.
- ``Guard`` and ``publish`` (the invariant check and the figures) live in ``fuzz_guard``
  and are re-exported here, so a test module needs only ``import fuzz_common as fc``.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz_guard import MEMORY_BOUND, TALLIES, Guard, Tally, publish
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "BAD_INTS",
    "CODE_NAMES",
    "HUGE_INTS",
    "MEMORY_BOUND",
    "SETTINGS",
    "TALLIES",
    "Deep",
    "Exploit",
    "Guard",
    "JsonEdit",
    "Mutation",
    "Tally",
    "apply_edits",
    "byte_mutations",
    "examples",
    "ext",
    "join_container",
    "json_edits",
    "json_text",
    "nested_tuples",
    "pack_text",
    "pickle_canary",
    "publish",
    "split_container",
    "tensor_mutations",
]

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""Fixed-seed, no example database: every run tries the same examples."""


def examples(n: int) -> int:
    """``n`` examples, times ``RLCONNECT_FUZZ_SCALE`` (default 1; raise it for a deep run)."""
    return max(1, int(n * float(os.environ.get("RLCONNECT_FUZZ_SCALE", "1"))))


HUGE_INTS = [10**12, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]
BAD_INTS = [-1, -(2**63), -(2**63) - 1, 0, *HUGE_INTS]
CODE_NAMES = [
    "os:system",
    "os.system",
    "builtins:eval",
    "subprocess:Popen",
    "importlib:import_module",
    "rlconnect.testing:__import__",
    "__import__('os').system('true')",
    "tests.reliability.fuzz_common:Exploit",
]


# -- canaries -------------------------------------------------------------------------------
class Exploit:
    """Unpickling this creates the file at ``path``: the proof that a loader ran code."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (builtins.open, (self.path, "w"))


def pickle_canary(marker: Path) -> bytes:
    """Pickle bytes (protocol 4) that create ``marker`` when unpickled."""
    return pickle.dumps({"weights": Exploit(marker), "obs": [Exploit(marker)]}, protocol=4)


# -- byte-level mutations -------------------------------------------------------------------
INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", b"\xff" * 8, b"\x00" * 8, b'"', b"{", b"["]


@dataclass(frozen=True)
class Mutation:
    """One replayable change of a file's bytes; ``str()`` says what it was."""

    kind: str
    args: tuple[Any, ...]
    fn: Callable[..., bytes] = field(repr=False, compare=False)

    def apply(self, data: bytes) -> bytes:
        return self.fn(data, *self.args)

    def __str__(self) -> str:
        shown = ", ".join(repr(a)[:60] for a in self.args)
        return f"{self.kind}({shown})"


def _at(data: bytes, frac: float) -> int:
    return min(int(frac * len(data)), max(len(data) - 1, 0))


def _flip(data: bytes, spots: tuple[tuple[float, int], ...]) -> bytes:
    b = bytearray(data)
    for frac, mask in spots:
        if b:
            b[_at(data, frac)] ^= mask
    return bytes(b)


def _truncate(data: bytes, frac: float) -> bytes:
    return data[: int(frac * len(data))]


def _insert(data: bytes, frac: float, chunk: bytes) -> bytes:
    i = _at(data, frac)
    return data[:i] + chunk + data[i:]


def _delete(data: bytes, frac: float, n: int) -> bytes:
    i = _at(data, frac)
    return data[:i] + data[i + n :]


def _overwrite(data: bytes, frac: float, chunk: bytes) -> bytes:
    i = _at(data, frac)
    return data[:i] + chunk + data[i + len(chunk) :]


def _splice(data: bytes, frac: float, other: bytes, other_frac: float) -> bytes:
    return data[: int(frac * len(data))] + other[int(other_frac * len(other)) :]


def _header_length(data: bytes, value: int) -> bytes:
    return (value % 2**64).to_bytes(8, "little") + data[8:]


def _replace_all(data: bytes, other: bytes) -> bytes:
    return other


_frac = st.floats(0, 1, allow_nan=False)


def byte_mutations(others: dict[str, bytes] | None = None) -> st.SearchStrategy[Mutation]:
    """Any byte-level mutation; ``others`` are valid files of other kinds to splice in or
    swap for the whole file (a checkpoint given where a pipeline is expected ...)."""
    others = others or {}
    chunk = st.binary(min_size=1, max_size=64) | st.sampled_from(INTERESTING)
    options = [
        st.builds(
            lambda s: Mutation("flip", (tuple(s),), _flip),
            st.lists(st.tuples(_frac, st.integers(1, 255)), min_size=1, max_size=8),
        ),
        st.builds(lambda f: Mutation("truncate", (f,), _truncate), _frac),
        st.builds(lambda f, c: Mutation("insert", (f, c), _insert), _frac, chunk),
        st.builds(lambda f, n: Mutation("delete", (f, n), _delete), _frac, st.integers(1, 256)),
        st.builds(lambda f, c: Mutation("overwrite", (f, c), _overwrite), _frac, chunk),
        st.builds(
            lambda v: Mutation("header_length", (v,), _header_length),
            st.sampled_from([0, 1, 7, 2**32, 2**63, 2**64 - 1, *HUGE_INTS]) | st.integers(0, 4096),
        ),
    ]
    if others:
        names = sorted(others)
        options.append(
            st.builds(
                lambda n, f, g: Mutation(f"splice:{n}", (f, others[n], g), _splice),
                st.sampled_from(names),
                _frac,
                _frac,
            )
        )
        options.append(
            st.builds(
                lambda n: Mutation(f"swap:{n}", (others[n],), _replace_all),
                st.sampled_from(names),
            )
        )
    return st.one_of(options)


# -- safetensors container: the tensor table ------------------------------------------------
def split_container(data: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, tensor bytes)`` of a valid safetensors file."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join_container(header: Any, body: bytes) -> bytes:
    """A safetensors file from any JSON ``header`` (no validation: hostile on purpose)."""
    raw = json.dumps(header, allow_nan=True).encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(8, "little") + raw + body


TENSOR_FIELD_VALUES = st.one_of(
    st.sampled_from([*BAD_INTS, "F64", "O", "U8", "<f8", "|O", "", None, True, 1.5]),
    st.lists(st.sampled_from(BAD_INTS) | st.integers(-3, 3), max_size=4),
)


def _tensor_edit(data: bytes, index: int, key: str, value: Any) -> bytes:
    header, body = split_container(data)
    names = sorted(k for k in header if k != "__metadata__")
    if not names:
        header["arr_0"] = {"dtype": "F64", "shape": [10**12], "data_offsets": [0, 8 * 10**12]}
        return join_container(header, body)
    entry = header[names[index % len(names)]]
    if key == "shape*":  # a consistent huge tensor: shape and offsets agree
        entry.update(dtype="F64", shape=[value], data_offsets=[0, 8 * value])
    else:
        entry[key] = value
    return join_container(header, body)


def tensor_mutations() -> st.SearchStrategy[Mutation]:
    """A field of one tensor entry rewritten: dtype, shape, data_offsets (huge, negative,
    wrong types), or shape and offsets both declaring 10^12 elements."""
    return st.one_of(
        st.builds(
            lambda i, k, v: Mutation("tensor_field", (i, k, v), _tensor_edit),
            st.integers(0, 50),
            st.sampled_from(["dtype", "shape", "data_offsets"]),
            TENSOR_FIELD_VALUES,
        ),
        st.builds(
            lambda i, v: Mutation("tensor_huge", (i, "shape*", v), _tensor_edit),
            st.integers(0, 50),
            st.sampled_from(HUGE_INTS[:6]),
        ),
    )


# -- JSON trees -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Deep:
    """A list (``[[[...]]]``) or object (``{"a": {"a": ...}}``) nested ``depth`` levels.

    Kept symbolic until written out (``json_text``), because Python's ``json`` and
    hypothesis's printer recurse and stop near 1000 levels; the files get the real text.
    """

    kind: str
    depth: int

    @property
    def placeholder(self) -> str:
        return f"\x00DEEP:{self.kind}:{self.depth}\x00"

    def text(self) -> str:
        if self.kind == "list":
            return "[" * self.depth + "0" + "]" * self.depth
        return '{"a":' * self.depth + "{}" + "}" * self.depth


def json_text(obj: Any) -> str:
    """``json.dumps(obj)`` with every ``Deep`` placeholder string replaced by its nesting."""
    text = json.dumps(obj, allow_nan=True, separators=(",", ":"))
    for kind in ("list", "dict"):
        for depth in DEEP_LEVELS:
            deep = Deep(kind, depth)
            text = text.replace(json.dumps(deep.placeholder), deep.text())
    return text


DEEP_LEVELS = (65, 200, 2000, 100_000)
HOSTILE_VALUES = st.one_of(
    st.sampled_from(BAD_INTS),
    st.sampled_from(CODE_NAMES),
    st.sampled_from(
        [None, True, False, 1.5, float("nan"), float("inf"), -1e308, "", "\x00", "\ud800"]
    ),
    st.sampled_from(["../../x", "/etc/passwd", "a/../../b", "x" * 100_000, "\u202e"]),
    st.sampled_from([[], {}, [None], {"__array__": "arr_0"}, {"__array__": "nope"}]),
    st.sampled_from([{"__array__": 1}, {"__array__": "arr_0", "x": 1}]),
    st.sampled_from([{"type": "Box", "shape": [10**12], "low": 0, "high": 1}]),
    st.builds(Deep, st.sampled_from(["list", "dict"]), st.sampled_from(DEEP_LEVELS)),
    st.integers(),
    st.text(max_size=20),
    st.lists(st.integers(-5, 10**13), max_size=5),
)


def json_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys / indexes) in ``obj``, root first, preorder."""
    out = [prefix]
    if isinstance(obj, dict):
        for k in obj:
            out.extend(json_paths(obj[k], (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.extend(json_paths(v, (*prefix, i)))
    return out


@dataclass(frozen=True)
class JsonEdit:
    """Replace, drop, or add a key at the ``pick``-th node (preorder, modulo the count)."""

    pick: int
    op: str  # "set" | "drop" | "add"
    value: Any = None

    def apply(self, obj: Any) -> Any:
        obj = json.loads(json.dumps(obj, allow_nan=True))  # a private copy
        value = self.value.placeholder if isinstance(self.value, Deep) else self.value
        paths = json_paths(obj)
        path = paths[self.pick % len(paths)]
        if not path:
            return value if self.op == "set" else obj
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        if self.op == "set":
            parent[last] = value
        elif self.op == "drop":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last]["__evil__"] = value
        elif isinstance(parent[last], list):
            parent[last].append(value)
        else:
            parent[last] = [parent[last], value]
        return obj

    def __str__(self) -> str:
        return f"JsonEdit({self.pick}, {self.op}, {repr(self.value)[:60]})"


def json_edits(max_edits: int = 3) -> st.SearchStrategy[list[JsonEdit]]:
    """1 to ``max_edits`` edits of a JSON tree."""
    edit = st.builds(
        JsonEdit,
        st.integers(0, 10_000),
        st.sampled_from(["set", "set", "drop", "add"]),
        HOSTILE_VALUES,
    )
    return st.lists(edit, min_size=1, max_size=max_edits)


def apply_edits(obj: Any, edits: list[JsonEdit]) -> Any:
    """``obj`` after ``edits`` (a copy); write it out with ``json_text``."""
    for e in edits:
        obj = e.apply(obj)
    return obj


def ext(code: int, payload: bytes) -> bytes:
    """A msgpack extension value (type ``code``, 0 to 127) holding ``payload``."""
    import msgpack

    return msgpack.packb(msgpack.ExtType(code, payload))


def nested_tuples(depth: int) -> bytes:
    """A wire message: the number 1 inside ``depth`` nested one-item tuples (ext type 2)."""
    import msgpack

    data = msgpack.packb(1)
    for _ in range(depth):
        data = ext(2, b"\x91" + data)
    return data


def pack_text(structure: str, arrays: dict[str, Any], format_name: str, version: int) -> bytes:
    """An rlconnect container whose structure is the given JSON text, with a valid
    checksum (as ``rlconnect.checkpoints.container.pack`` computes it)."""
    import safetensors.numpy

    from rlconnect.checkpoints.container import _digest

    metadata = {
        "format": format_name,
        "format_version": str(version),
        "structure": structure,
        "sha256": _digest(format_name, version, structure, arrays),
    }
    return safetensors.numpy.save(arrays, metadata=metadata)
