"""Hostile runner checkpoints: ``load_checkpoint``, ``EnvRunner.restore``,
``EnvRunner.from_checkpoint`` and ``rlconnect inspect`` raise only documented errors, run
no code, import nothing, stay within memory, and touch nothing outside the folder.

Each hypothesis example copies a valid checkpoint folder and damages it: the manifest's
JSON tree, one file's bytes (with the manifest's size and SHA-256 updated, so the parser
behind the checks is reached, or not), one weights file's tensor table or structure, or
the folder itself (files swapped, removed, replaced by folders or symlinks).
``tests/runner/test_checkpoint_hostile.py`` holds the hand-written cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.checkpoints import PIPELINE_FILE, WEIGHTS_FILE, load_checkpoint
from rlconnect.cli.describe import describe_path, render
from rlconnect.cli.errors import UsageError

pytestmark = pytest.mark.reliability

ALLOWED = (rc.CheckpointError, rc.UnknownConnectorError)
LOADERS = ["load_checkpoint", "restore", "from_checkpoint", "inspect"]
ROLES = {
    "weights": "policies/default_policy/weights.safetensors",
    "agent_pipeline": "policies/default_policy/agent_pipeline",
    "action_pipeline": "policies/default_policy/action_pipeline",
}
CARTPOLE = gym.make("CartPole-v1")


def make_runner() -> rc.EnvRunner:
    policy = rc.MLPPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, hiddens=(8,), seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=8, seed=0, observation_filter="MeanStdFilter")
    return rc.EnvRunner("CartPole-v1", policy, config=config)


class Checkpoints:
    """A valid checkpoint, a runner to restore into, the canary folder, one Guard per loader."""

    def __init__(self, root: Path) -> None:
        self.root, self.marker_dir = root, root / "canary"
        self.marker_dir.mkdir()
        self.outside = root / "outside"  # nothing may be created or changed here
        self.outside.mkdir()
        self.base = root / "base"
        runner = make_runner()
        runner.sample()
        runner.save_checkpoint(self.base)
        self.runner = make_runner()
        self.ck = root / "ck"
        self.load_all(self.base)  # warm-up: what a good load imports
        self.guards = {
            n: fc.Guard(f"checkpoint:{n}", (*ALLOWED, UsageError), self.marker_dir) for n in LOADERS
        }

    def load_all(self, path: Path) -> None:
        load_checkpoint(path)
        self.runner.restore(path)
        rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
        render(describe_path(str(path)))

    def fresh(self) -> Path:
        """A writable copy of the valid checkpoint at ``self.ck``."""
        if self.ck.is_symlink() or self.ck.is_file():
            self.ck.unlink()
        elif self.ck.exists():
            shutil.rmtree(self.ck)
        shutil.copytree(self.base, self.ck, symlinks=True)
        return self.ck

    def check(self, what: object, kind: str | None = None) -> list[str]:
        """Load the (damaged) checkpoint at ``self.ck`` every way."""
        path = self.ck
        loads: dict[str, Callable[[], Any]] = {
            "load_checkpoint": lambda: load_checkpoint(path),
            "restore": lambda: self.runner.restore(path),
            "from_checkpoint": lambda: rc.EnvRunner.from_checkpoint(path, env="CartPole-v1"),
            "inspect": lambda: json.dumps(render(describe_path(str(path))), default=str),
        }
        outcomes = [self.guards[n].run(loads[n], what, kind) for n in LOADERS]
        if outcomes[LOADERS.index("restore")] == "accepted":  # later examples need the original
            self.runner = make_runner()
        assert not any(self.outside.iterdir()), f"{what}: a load wrote outside the checkpoint"
        return outcomes


@pytest.fixture(scope="module")
def cks(tmp_path_factory) -> Iterator[Checkpoints]:
    yield Checkpoints(tmp_path_factory.mktemp("hostile_checkpoints"))
    fc.publish([*(f"checkpoint:{n}" for n in LOADERS), "checkpoint:config_regressions"])


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())


def write_blob(path: Path, role: str, data: bytes, rehash: bool) -> None:
    """Replace one file; with ``rehash`` the manifest records its new size and SHA-256."""
    (path / ROLES[role]).write_bytes(data)
    if rehash:
        m = manifest(path)
        entry = m["policies"][0]["files"][role]
        entry.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        (path / "manifest.json").write_text(json.dumps(m))


# -- properties ------------------------------------------------------------------------------
@settings(fc.SETTINGS, max_examples=fc.examples(50))
@given(edits=fc.json_edits())
def test_mutated_manifest(cks: Checkpoints, edits: list[fc.JsonEdit]) -> None:
    path = cks.fresh()
    original = manifest(path)
    edited = fc.apply_edits(original, edits)
    config = edited.get("config") if isinstance(edited, dict) else None
    if isinstance(config, dict) and isinstance(config.get("env_config"), dict):
        # what is in env_config is keyword arguments for the caller's env creator (its
        # errors are the env's own); the library checks that it is a dict
        config["env_config"] = original["config"]["env_config"]
    text = fc.json_text(edited)
    (path / "manifest.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    cks.check(edits, "manifest_edit")


@settings(fc.SETTINGS, max_examples=fc.examples(25))
@given(data=st.data())
def test_mutated_manifest_bytes(cks: Checkpoints, data: st.DataObject) -> None:
    """The manifest's bytes: flipped, cut, spliced with or swapped for the other files."""
    path = cks.fresh()
    others = {r: (path / rel).read_bytes() for r, rel in ROLES.items()}
    mutation = data.draw(fc.byte_mutations(others))
    target = path / "manifest.json"
    target.write_bytes(mutation.apply(target.read_bytes()))
    cks.check(f"manifest.json: {mutation}", f"manifest:{str(mutation).split('(')[0]}")


CONFIG_VALUES = st.one_of(
    st.sampled_from(["/", "/etc/passwd", "../../escape", "x\x00y", "sampler", "", "~"]),
    st.sampled_from(fc.BAD_INTS),
    st.sampled_from([None, True, [], {}, {"../../escape": 1.0}, {"sampler": -1.0}]),
)
CONFIG_KEYS = ["output", "input", "num_envs", "seed", "preset", "horizon", "evil"]


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(
    key_value=st.tuples(st.sampled_from(CONFIG_KEYS), CONFIG_VALUES)
    # env_config is handed to the caller's env creator as keyword arguments: only its type
    # is the library's to check (a dict of unknown kwargs is the env's own error)
    | st.tuples(st.just("env_config"), CONFIG_VALUES.filter(lambda v: not isinstance(v, dict)))
)
def test_hostile_config_values(cks: Checkpoints, key_value: tuple[str, Any]) -> None:
    """The saved RunnerConfig: paths, sizes and types chosen by the file."""
    key, value = key_value
    path = cks.fresh()
    m = manifest(path)
    m["config"][key] = str(cks.outside / "made") if value == "~" else value
    (path / "manifest.json").write_text(json.dumps(m))
    cks.check(f"config[{key!r}] = {value!r}", "config_value")


PATHS = st.sampled_from(
    [
        "a\x00b",
        "/etc/passwd",
        "..",
        "../outside_file",
        "policies/../../x",
        "",
        ".",
        "x" * 5000,
        "a/" * 200 + "b",
        "policies\\default_policy",
        "manifest.json",
        "policies",
        "\u202ex",
    ]
) | st.text(max_size=12)


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(
    role=st.sampled_from(sorted(ROLES)),
    field=st.sampled_from(["path", "path", "size", "sha256"]),
    value=PATHS | st.sampled_from(fc.BAD_INTS) | st.sampled_from([None, [], 1.5, "0" * 64]),
)
def test_hostile_file_entries(cks: Checkpoints, role: str, field: str, value: Any) -> None:
    """A manifest's file entry: paths out of the folder or not paths at all, sizes, digests."""
    path = cks.fresh()
    m = manifest(path)
    m["policies"][0]["files"][role][field] = value
    (path / "manifest.json").write_text(json.dumps(m))
    cks.check(f"files.{role}.{field} = {value!r:.80}", f"file_entry:{field}")


@settings(fc.SETTINGS, max_examples=fc.examples(50))
@given(role=st.sampled_from(sorted(ROLES)), rehash=st.booleans(), data=st.data())
def test_mutated_file_bytes(cks: Checkpoints, role: str, rehash: bool, data: st.DataObject) -> None:
    path = cks.fresh()
    others = {r: (path / rel).read_bytes() for r, rel in ROLES.items() if r != role}
    others["manifest"] = (path / "manifest.json").read_bytes()
    mutation = data.draw(fc.byte_mutations(others))
    write_blob(path, role, mutation.apply((path / ROLES[role]).read_bytes()), rehash)
    cks.check(f"{role}: {mutation} (rehash={rehash})", f"file:{str(mutation).split('(')[0]}")


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(role=st.sampled_from(sorted(ROLES)), mutation=fc.tensor_mutations())
def test_mutated_tensor_table(cks: Checkpoints, role: str, mutation: fc.Mutation) -> None:
    path = cks.fresh()
    write_blob(path, role, mutation.apply((path / ROLES[role]).read_bytes()), rehash=True)
    cks.check(f"{role}: {mutation}", "tensor_table")


@settings(fc.SETTINGS, max_examples=fc.examples(40))
@given(role=st.sampled_from(sorted(ROLES)), edits=fc.json_edits())
def test_mutated_file_structure(cks: Checkpoints, role: str, edits: list[fc.JsonEdit]) -> None:
    """A weights or pipeline file whose structure is edited, re-packed with a valid checksum."""
    path = cks.fresh()
    data = (path / ROLES[role]).read_bytes()
    header, _ = fc.split_container(data)
    obj = json.loads(header["__metadata__"]["structure"])
    text = fc.json_text(fc.apply_edits(obj, edits))
    fmt = (WEIGHTS_FILE if role == "weights" else PIPELINE_FILE).name
    arrays = safetensors.numpy.load(data)
    write_blob(path, role, fc.pack_text(text, arrays, fmt, 1), rehash=True)
    cks.check((role, edits), "structure_edit")


def _swap(path: Path, a: str, b: str) -> None:
    pa, pb = path / ROLES[a], path / ROLES[b]
    da, db = pa.read_bytes(), pb.read_bytes()
    write_blob(path, a, db, rehash=True)
    write_blob(path, b, da, rehash=True)


def _folder_op(cks: Checkpoints, path: Path, op: str, role: str) -> None:
    target = path / ("manifest.json" if role == "manifest" else ROLES[role])
    outside = cks.outside.parent / "outside_file"
    outside.write_bytes(target.read_bytes())
    if op == "remove":
        target.unlink()
    elif op == "folder":
        target.unlink()
        target.mkdir()
    elif op == "symlink_out":  # same bytes, but the file lies outside the checkpoint
        target.unlink()
        target.symlink_to(outside)
    elif op == "symlink_dir":
        target.unlink()
        target.symlink_to(path)
    elif op == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif op == "empty":
        target.write_bytes(b"")
    elif op == "extra_file":
        (target.parent / "extra.bin").write_bytes(b"\0" * 64)


@settings(fc.SETTINGS, max_examples=fc.examples(40))
@given(
    op=st.sampled_from(
        ["remove", "folder", "symlink_out", "symlink_dir", "fifo", "empty", "extra_file", "swap"]
    ),
    role=st.sampled_from([*sorted(ROLES), "manifest"]),
    other=st.sampled_from(sorted(ROLES)),
)
def test_damaged_folders(cks: Checkpoints, op: str, role: str, other: str) -> None:
    path = cks.fresh()
    if op == "swap":
        if role == "manifest" or role == other:
            return
        _swap(path, role, other)
    else:
        _folder_op(cks, path, op, role)
    cks.check(f"{op} {role} {other if op == 'swap' else ''}", f"folder:{op}")


# -- canaries and regressions ----------------------------------------------------------------
def test_canary_files_in_every_role_never_run(cks: Checkpoints) -> None:
    marker = cks.marker_dir / "PWNED"
    payload = fc.pickle_canary(marker)
    for role in ROLES:
        path = cks.fresh()
        write_blob(path, role, payload, rehash=True)
        outcomes = cks.check(f"pickle canary as {role}", "canary")
        # load_checkpoint parses the weights; pipelines are parsed when they are built
        first = 0 if role == "weights" else 1
        assert outcomes[first:3] == ["CheckpointError"] * (3 - first), (role, outcomes)
    path = cks.fresh()
    (path / "manifest.json").write_bytes(payload)
    assert cks.check("pickle canary as the manifest", "canary")[0] == "CheckpointError"
    for name in fc.CODE_NAMES:
        path = cks.fresh()
        m = manifest(path)
        m["policies"][0]["spec"]["kind"] = name
        m["policies"][0]["spec"]["observation_space"]["type"] = name
        (path / "manifest.json").write_text(json.dumps(m))
        assert cks.check(f"code name {name!r}", "canary")[:3] == ["CheckpointError"] * 3
    assert not marker.exists()


def test_inspect_never_shows_files_outside_the_checkpoint(cks: Checkpoints) -> None:
    """A member symlinked to a file elsewhere: inspect must not read or describe it."""
    path = cks.fresh()
    secret = cks.root / "secret_pipeline"
    ctx = rc.ConnectorContext(CARTPOLE.observation_space, CARTPOLE.action_space)
    rc.save_pipeline(rc.AgentConnectorPipeline(ctx, [rc.connectors.ClipReward(ctx, 7.25)]), secret)
    (path / "policies" / "leak").symlink_to(secret)
    shown = json.dumps(describe_path(str(path)), default=str)
    assert "7.25" not in shown and "ClipReward" not in shown


# -- regressions: library bugs this suite found -------------------------------------------------
def _config_edit(cks: Checkpoints, **changes: Any) -> Path:
    path = cks.fresh()
    m = manifest(path)
    m["config"].update(changes)
    (path / "manifest.json").write_text(json.dumps(m))
    return path


def test_regression_saved_paths_never_choose_where_a_rebuilt_runner_writes(
    cks: Checkpoints,
) -> None:
    """A saved ``output`` made from_checkpoint create folders anywhere (and a file there
    raised NotADirectoryError); a saved ``input`` read files anywhere (FileNotFoundError)."""
    target = cks.outside / "made"
    path = _config_edit(cks, output=str(target), input=str(cks.outside / "missing"))
    runner = rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")
    offline = runner.config.offline
    assert offline is not None and offline.output is None and offline.input == "sampler"
    assert not target.exists()
    path = _config_edit(cks, output=str(path / "manifest.json"))  # a file, not a folder
    assert rc.EnvRunner.from_checkpoint(path, env="CartPole-v1").config.offline.output is None
    out = cks.root / "chosen_by_caller"
    runner = rc.EnvRunner.from_checkpoint(
        path, env="CartPole-v1", config_overrides={"output": str(out)}
    )
    assert runner.config.offline.output == str(out)  # the caller still can


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_envs": 10**12}, r"num_envs=1000000000000: at most 4096"),  # built envs forever
        ({"env_config": "/"}, r"env_config='/': must be a dict"),  # ValueError from make_env
    ],
)
def test_regression_config_values_are_bounded_and_typed(
    cks: Checkpoints, changes: dict[str, Any], match: str
) -> None:
    path = _config_edit(cks, **changes)
    guard = fc.Guard("checkpoint:config_regressions", ALLOWED, cks.marker_dir)

    def load() -> Any:
        return rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")

    assert guard.run(load, changes, "config_value") == "CheckpointError"
    with pytest.raises(rc.CheckpointError, match=match):
        rc.EnvRunner.from_checkpoint(path, env="CartPole-v1")


@pytest.mark.parametrize("bad", ["a\x00b", "x" * 5000, "/etc/passwd"])
def test_regression_inspect_reports_bad_manifest_paths(cks: Checkpoints, bad: str) -> None:
    """A NUL byte in a manifest path made ``rlconnect inspect`` raise ValueError."""
    path = cks.fresh()
    m = manifest(path)
    m["policies"][0]["files"]["weights"]["path"] = bad
    (path / "manifest.json").write_text(json.dumps(m))
    desc = describe_path(str(path))["checkpoint"]
    assert desc["integrity"][bad] == "BAD PATH (outside the checkpoint)"
    assert any(p.startswith(bad[:20]) for p in desc["problems"])


def test_regression_swapped_pipeline_files_are_refused(cks: Checkpoints) -> None:
    """The action pipeline's file in the agent pipeline's place: from_checkpoint raised
    ValueError from the runner, and restore relied on the spaces happening to differ."""
    path = cks.fresh()
    _swap(path, "agent_pipeline", "action_pipeline")
    for load in (cks.runner.restore, lambda p: rc.EnvRunner.from_checkpoint(p, env="CartPole-v1")):
        with pytest.raises(rc.CheckpointError, match="holds an ActionConnectorPipeline"):
            load(path)
