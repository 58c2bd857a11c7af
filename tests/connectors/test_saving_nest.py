"""encode_nest / decode_nest, save_nest / load_nest and atomic_write_bytes on their own."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlconnect.checkpoints import (
    FileFormat,
    atomic_write_bytes,
    decode_nest,
    encode_nest,
    load_nest,
    save_nest,
)
from rlconnect.errors import CheckpointError

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", ">f8", ">i4",
]  # fmt: skip


def test_encode_converts_scalars_and_tuples_and_keeps_non_finite_floats() -> None:
    nest = {"a": (np.int64(3), np.float32(0.5), np.bool_(True)), "b": [None, "s", math.inf]}
    obj, arrays = encode_nest(nest)
    assert arrays == {}
    assert obj == {"a": [3, 0.5, True], "b": [None, "s", math.inf]}
    assert type(obj["a"][0]) is int
    assert type(obj["a"][2]) is bool


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (2, 3)])
def test_arrays_round_trip_through_a_file_bit_exactly(
    tmp_path: Path, dtype: str, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(0)
    value = np.asarray(rng.normal(size=shape) * 100).astype(dtype)
    nest = {"x": value, "deep": [{"y": value}], "nan": math.nan}
    save_nest(tmp_path / "n", nest, FileFormat("test.nest", 2))
    version, back = load_nest(tmp_path / "n", FileFormat("test.nest", 2, readable={1, 2}))
    assert version == 2
    assert math.isnan(back["nan"])
    for got in (back["x"], back["deep"][0]["y"]):
        assert got.shape == value.shape
        assert got.dtype == value.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, value)
        assert got.flags.writeable


@pytest.mark.parametrize(
    ("nest", "error", "match"),
    [
        ({"k": np.array(["a"])}, ValueError, r"nest\.k: arrays of dtype <U1"),
        ({"k": [np.array([None])]}, ValueError, r"nest\.k\[0\]: arrays of dtype object"),
        ({"k": np.zeros(2, np.complex128)}, ValueError, "complex128"),
        ({"k": np.datetime64("2020-01-01")}, ValueError, "datetime64"),
        ({3: 1}, TypeError, "keys must be strings"),
        ({"__array__": "x"}, ValueError, "reserved"),
        ({"k": object()}, TypeError, "cannot save a builtins.object"),
    ],
)
def test_encode_rejects_what_json_and_safetensors_cannot_hold(
    nest: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        encode_nest(nest)


def test_encode_rejects_cycles_and_deep_nesting() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="deeper than"):
        encode_nest(loop)


@pytest.mark.parametrize(
    ("obj", "arrays", "match"),
    [
        ({"a": {"__array__": "k"}}, {}, "does not hold"),
        ({"a": {"__array__": 3}}, {"3": np.zeros(1)}, "malformed array reference"),
        ({"a": {"__array__": "k", "b": 1}}, {"k": np.zeros(1)}, "malformed array reference"),
        ([{"__array__": "k"}, {"__array__": "k"}], {"k": np.zeros(1)}, "more than once"),
        ({}, {"k": np.zeros(1)}, "never referenced"),
        ({"a": {"__array__": "k"}}, {"k": np.array(["s"])}, "unsupported type"),
        ({"a": {"__array__": "k"}}, {"k": [1, 2]}, "unsupported type"),
        ({"a": (1, 2)}, {}, "unexpected tuple"),
    ],
)
def test_decode_is_strict(obj: Any, arrays: dict[str, Any], match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        decode_nest(obj, arrays)


def test_load_nest_checks_format_name_and_versions(tmp_path: Path) -> None:
    save_nest(tmp_path / "n", {"a": 1}, FileFormat("runner", 3))
    with pytest.raises(CheckpointError, match="supported versions: 1, 2"):
        load_nest(tmp_path / "n", FileFormat("runner", 2, readable=[1, 2]))
    with pytest.raises(CheckpointError, match="format is 'runner', expected 'other'"):
        load_nest(tmp_path / "n", FileFormat("other", 3))
    assert load_nest(tmp_path / "n", FileFormat("runner", 3)) == (3, {"a": 1})


def test_atomic_write_bytes_writes_exactly_at_path_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "file"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(str(path), b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["file"]


def test_atomic_write_bytes_respects_the_umask(tmp_path: Path) -> None:
    if os.name != "posix":
        pytest.skip("permission bits are POSIX")
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640


def test_atomic_write_bytes_cleans_up_on_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file"
    atomic_write_bytes(path, b"old")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file"]
