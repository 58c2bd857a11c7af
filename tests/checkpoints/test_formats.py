"""``FileFormat``: one record writes and checks the format header of every rlconnect file."""

from __future__ import annotations

import doctest
import json

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.checkpoints import PIPELINE_FILE, FileFormat, formats
from rlconnect.connectors import AgentConnectorPipeline, ConnectorContext

V2 = FileFormat("test.format", 2, readable={1, 2})


def test_the_header_holds_the_name_and_the_version():
    assert V2.header() == {"format": "test.format", "format_version": 2}
    assert V2.header(text=True) == {"format": "test.format", "format_version": "2"}
    parquet = formats.PARQUET_FILE.header()
    assert parquet == {"format": "rlconnect.parquet", "version": 1}


def test_it_reads_the_versions_it_names_and_by_default_the_one_it_writes():
    assert FileFormat("a", 3).readable == frozenset({3})
    assert V2.check({"format": "test.format", "format_version": 1}, where="x") == 1
    assert V2.check({"format": "test.format", "format_version": "2"}, where="x", text=True) == 2


@pytest.mark.parametrize(
    ("header", "text", "match"),
    [
        ({"format": "other"}, False, r"cannot load 'f': its format is 'other', expected 'test"),
        ({}, False, r"its format is None, expected 'test\.format'"),
        ({"format": "test.format", "format_version": "2"}, False, r"malformed test\.format"),
        ({"format": "test.format", "format_version": True}, False, "malformed"),
        ({"format": "test.format", "format_version": 2}, True, "malformed"),
        ({"format": "test.format", "format_version": "-1"}, True, "malformed"),
        ({"format": "test.format", "format_version": "1" * 10}, True, "malformed"),
        (
            {"format": "test.format", "format_version": 0},
            False,
            r"test\.format format version 0 is not supported; supported versions: 1, 2$",
        ),
        (
            {"format": "test.format", "format_version": 3},
            False,
            r"version 3 is not supported; supported versions: 1, 2; a newer rlconnect wrote it",
        ),
    ],
)
def test_a_wrong_header_names_the_file_the_format_and_the_supported_versions(header, text, match):
    with pytest.raises(rc.CheckpointError, match=match):
        V2.check(header, where="'f'", text=text)


def test_the_caller_chooses_the_error():
    with pytest.raises(KeyError, match="its format is"):
        V2.check({"format": "x"}, where="f", fail=KeyError)


def test_every_file_kind_has_its_own_record():
    records = [v for v in vars(formats).values() if isinstance(v, FileFormat)]
    names = sorted(r.name for r in records)
    assert names == [
        "rlconnect.batch",
        "rlconnect.parquet",
        "rlconnect.pipeline",
        "rlconnect.policy",
        "rlconnect.runner_checkpoint",
        "rlconnect.weights",
    ]


def test_files_keep_their_header_on_disk(tmp_path):
    """The header entries a pipeline file carries are what they were: the name and the
    version as a decimal string."""
    ctx = ConnectorContext(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    rc.save_pipeline(AgentConnectorPipeline(ctx, []), tmp_path / "p")
    data = (tmp_path / "p").read_bytes()
    meta = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])["__metadata__"]
    assert (meta["format"], meta["format_version"]) == ("rlconnect.pipeline", "1")
    assert set(meta) == {"format", "format_version", "structure", "sha256"}
    assert PIPELINE_FILE.check(meta, where="p", text=True) == 1


def test_the_module_doctests_run():
    assert doctest.testmod(formats).failed == 0
