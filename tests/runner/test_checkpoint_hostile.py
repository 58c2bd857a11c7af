"""Every damaged or hostile checkpoint gives CheckpointError naming the file, and runs no code."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.checkpoints import CheckpointNotFoundError

CARTPOLE = gym.make("CartPole-v1")
WEIGHTS = "policies/default_policy/weights.safetensors"
AGENT = "policies/default_policy/agent_pipeline"


def make_runner() -> rc.EnvRunner:
    policy = rc.MLPPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, hiddens=(8,), seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=8, seed=0, observation_filter="MeanStdFilter")
    return rc.EnvRunner("CartPole-v1", policy, config=config)


@pytest.fixture(scope="module")
def runner() -> rc.EnvRunner:
    r = make_runner()
    r.sample()
    return r


@pytest.fixture
def ckpt(runner, tmp_path) -> Path:
    path = tmp_path / "ck"
    runner.save_checkpoint(path)
    return path


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "PWNED"


class _Exploit:
    """Unpickling this creates the marker file: proof that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


def pickle_bytes(marker: Path) -> bytes:
    return pickle.dumps({"weights": _Exploit(marker)}, protocol=4)


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def write_manifest(path: Path, obj) -> None:
    (path / "manifest.json").write_text(json.dumps(obj))


def edit(fn: Callable[[dict], None]) -> Callable[[Path, Path], None]:
    def apply(path: Path, marker: Path) -> None:
        m = manifest(path)
        fn(m)
        write_manifest(path, m)

    return apply


def files(m: dict) -> dict:
    return m["policies"][0]["files"]


def replace_blob(rel: str, data: Callable[[bytes, Path], bytes], rehash: bool = True):
    """Replace a file's bytes; with ``rehash`` the manifest is updated to match them."""

    def apply(path: Path, marker: Path) -> None:
        target = path / rel
        new = data(target.read_bytes(), marker)
        target.write_bytes(new)
        if rehash:
            m = manifest(path)
            for f in files(m).values():
                if f["path"] == rel:
                    f["sha256"] = hashlib.sha256(new).hexdigest()
                    f["size"] = len(new)
            write_manifest(path, m)

    return apply


def remove(rel: str) -> Callable[[Path, Path], None]:
    return lambda path, marker: os.remove(path / rel)


def flip(data: bytes, marker: Path) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


def set_in(keys: tuple, value) -> Callable[[dict], None]:
    def fn(m: dict) -> None:
        obj = m
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value

    return fn


def set_path(value):
    return set_in(("policies", 0, "files", "weights", "path"), value)


# (case id, mutation, regex the CheckpointError must match)
CASES = [
    ("missing_weights", remove(WEIGHTS), r"weights\.safetensors: is missing"),
    ("missing_agent_pipeline", remove(AGENT), r"agent_pipeline: is missing"),
    ("checksum", replace_blob(WEIGHTS, flip, rehash=False), "weights.safetensors: digest mismatch"),
    (
        "checksum_pipeline",
        replace_blob(AGENT, flip, rehash=False),
        "agent_pipeline: digest mismatch",
    ),
    (
        "truncated",
        replace_blob(WEIGHTS, lambda d, m: d[: len(d) // 2], rehash=False),
        r"weights\.safetensors: truncated: [\d,]+ of its [\d,]+ bytes are there",
    ),
    (
        "truncated_rehashed",
        replace_blob(WEIGHTS, lambda d, m: d[: len(d) // 2]),
        r"weights\.safetensors.*truncated",
    ),
    (
        "random_rehashed",
        replace_blob(WEIGHTS, lambda d, m: os.urandom(len(d))),
        r"weights\.safetensors",
    ),
    ("empty_rehashed", replace_blob(WEIGHTS, lambda d, m: b""), r"weights\.safetensors.*empty"),
    ("pickle_weights", replace_blob(WEIGHTS, lambda d, m: pickle_bytes(m)), "weights.safetensors"),
    ("pickle_pipeline", replace_blob(AGENT, lambda d, m: pickle_bytes(m)), "agent_pipeline"),
    (
        "pickle_manifest",
        lambda p, m: (p / "manifest.json").write_bytes(pickle_bytes(m)),
        "manifest.json: is not valid JSON",
    ),
    (
        "truncated_manifest",
        lambda p, m: (p / "manifest.json").write_bytes((p / "manifest.json").read_bytes()[:200]),
        "manifest.json: is not valid JSON",
    ),
    (
        "deeply_nested_manifest",
        lambda p, m: (p / "manifest.json").write_text("[" * 200_000 + "]" * 200_000),
        "manifest.json: is not valid JSON",
    ),
    (
        "huge_manifest",
        lambda p, m: os.truncate(p / "manifest.json", 1 << 30),
        r"manifest.json: it holds [\d,]+ bytes, more than the limit",
    ),
    ("not_an_object", lambda p, m: write_manifest(p, [1, 2]), "is a JSON list"),
    (
        "wrong_format",
        edit(set_in(("format",), "other.format")),
        "expected 'rlconnect.runner_checkpoint'",
    ),
    (
        "unknown_version",
        edit(set_in(("format_version",), 99)),
        r"format version 99 is not supported; supported versions: 1; a newer rlconnect",
    ),
    (
        "version_as_string",
        edit(set_in(("format_version",), "1")),
        "malformed rlconnect.runner_checkpoint format version",
    ),
    ("config_not_object", edit(set_in(("config",), [])), "'config' must be an object"),
    ("policies_not_list", edit(set_in(("policies",), {"a": 1})), "'policies' must be"),
    ("no_policies", edit(set_in(("policies",), [])), "'policies' must be a non-empty list"),
    ("policy_not_object", edit(set_in(("policies", 0), "x")), r"policies\[0\] must be"),
    ("policy_id_int", edit(set_in(("policies", 0, "id"), 3)), "id 3 is not a simple string"),
    ("policy_id_list", edit(set_in(("policies", 0, "id"), ["a"])), "is not a simple string"),
    ("policy_id_empty", edit(set_in(("policies", 0, "id"), "")), "is not a simple string"),
    ("policy_id_control", edit(set_in(("policies", 0, "id"), "a\x00b")), "not a simple string"),
    (
        "policy_id_huge",
        edit(set_in(("policies", 0, "id"), "p" * 100_000)),
        "is not a simple string",
    ),
    (
        "duplicate_policy",
        edit(lambda m: m["policies"].append(m["policies"][0])),
        "appears twice",
    ),
    ("spec_not_object", edit(set_in(("policies", 0, "spec"), None)), "'spec' must be an object"),
    ("kwargs_list", edit(set_in(("policies", 0, "spec", "kwargs"), [])), "spec.kwargs must be"),
    ("kind_int", edit(set_in(("policies", 0, "spec", "kind"), 5)), "spec.kind must be"),
    (
        "space_evil",
        edit(set_in(("policies", 0, "spec", "observation_space"), {"type": "os.system"})),
        "invalid observation_space",
    ),
    (
        "space_huge",
        edit(
            set_in(
                ("policies", 0, "spec", "observation_space"),
                {"type": "Box", "shape": [10**9, 10**9], "low": 0, "high": 1},
            )
        ),
        "invalid observation_space",
    ),
    ("files_missing_role", edit(lambda m: files(m).pop("weights")), "'files' must be an object"),
    ("file_entry_string", edit(set_in(("policies", 0, "files", "weights"), "x")), "files.weights"),
    ("sha_int", edit(set_in(("policies", 0, "files", "weights", "sha256"), 12)), "sha256 must"),
    ("size_string", edit(set_in(("policies", 0, "files", "weights", "size"), "9")), "size must"),
    ("size_negative", edit(set_in(("policies", 0, "files", "weights", "size"), -1)), "size must"),
    (
        "size_huge",
        edit(set_in(("policies", 0, "files", "weights", "size"), 10**15)),
        r"declares 1000000000000000 bytes, more than the limit",
    ),
    ("path_parent", edit(set_path("../x")), r"path '\.\./x': must be a relative path"),
    ("path_nested_parent", edit(set_path("policies/../../x")), "must be a relative path"),
    ("path_absolute", edit(set_path("/etc/passwd")), "must be a relative path"),
    ("path_backslash", edit(set_path("policies\\..\\x")), "must be a relative path"),
    ("path_dot", edit(set_path("./manifest.json")), "must be a relative path"),
    ("path_int", edit(set_path(7)), "path must be a string"),
    (
        "path_duplicate",
        edit(lambda m: files(m)["agent_pipeline"].update(path=files(m)["weights"]["path"])),
        "is listed twice",
    ),
]


def load_both_ways(path: Path) -> None:
    """Each way to read a checkpoint must fail: restore into a runner, and rebuild."""
    with pytest.raises(rc.CheckpointError) as first:
        make_runner().restore(path)
    with pytest.raises(rc.CheckpointError) as second:
        rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
    assert "does not fit" not in str(first.value) + str(second.value)
    raise first.value


@pytest.mark.parametrize(("mutate", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_damaged_or_hostile_checkpoints_raise_checkpoint_error(ckpt, marker, mutate, match):
    mutate(ckpt, marker)
    with pytest.raises(rc.CheckpointError, match=match):
        load_both_ways(ckpt)
    assert not marker.exists(), "loading the checkpoint ran code"


def test_the_exploit_works_when_unpickled(marker):
    """Negative control: the payload used above does run code when unpickled."""
    pickle.loads(pickle_bytes(marker))
    assert marker.exists()


def test_a_symlink_out_of_the_checkpoint_is_rejected(ckpt, tmp_path, marker):
    outside = tmp_path / "outside.bin"
    outside.write_bytes((ckpt / WEIGHTS).read_bytes())
    os.remove(ckpt / WEIGHTS)
    os.symlink(outside, ckpt / WEIGHTS)
    with pytest.raises(rc.CheckpointError, match="resolves outside the checkpoint folder"):
        load_both_ways(ckpt)


def test_a_folder_in_place_of_a_file_is_rejected(ckpt, marker):
    os.remove(ckpt / WEIGHTS)
    os.mkdir(ckpt / WEIGHTS)
    with pytest.raises(
        rc.CheckpointError, match=r"weights\.safetensors: it is a folder, not a regular file"
    ):
        load_both_ways(ckpt)


def test_missing_checkpoint_and_manifest(tmp_path, ckpt):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        make_runner().restore(tmp_path / "nothing")
    assert issubclass(CheckpointNotFoundError, FileNotFoundError)
    os.remove(ckpt / "manifest.json")
    with pytest.raises(rc.CheckpointError, match=r"manifest\.json is missing"):
        load_both_ways(ckpt)


def test_a_pipeline_file_is_not_a_checkpoint(tmp_path, runner):
    rc.save_pipeline(runner.agent_pipeline(), tmp_path / "pipe")
    with pytest.raises(rc.CheckpointError, match="is a file, not a checkpoint folder"):
        load_both_ways(tmp_path / "pipe")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (set_in(("config", "num_envs"), -1), r"invalid config: RunnerConfig.num_envs=-1"),
        (set_in(("config", "batch_mode"), "all"), "invalid config: RunnerConfig.batch_mode"),
        (set_in(("config", "evil"), 1), r"config has unknown fields \['evil'\]"),
        (set_in(("policies", 0, "spec", "kind"), "os.system"), "registered kinds"),
        (set_in(("policies", 0, "spec", "kind"), None), "registered kinds"),
        (
            set_in(("policies", 0, "spec", "kwargs"), {"activation": "evil"}),
            "cannot rebuild MLPPolicy from its saved spec",
        ),
        (
            set_in(("policies", 0, "spec", "kwargs"), {"__class__": 1}),
            "cannot rebuild MLPPolicy from its saved spec",
        ),
    ],
)
def test_rebuilding_checks_config_and_policy_kind(ckpt, mutate, match):
    m = manifest(ckpt)
    mutate(m)
    write_manifest(ckpt, m)
    with pytest.raises(rc.CheckpointError, match=match):
        rc.EnvRunner.from_checkpoint(ckpt, env="CartPole-v1")
    make_runner().restore(ckpt)  # restoring into a built runner uses neither
