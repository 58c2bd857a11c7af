"""The on-disk format of runner checkpoints: folder layout, manifest schema, verified reads.

A checkpoint is a folder::

    <path>/
        manifest.json                            # JSON, human-readable (schema below)
        policies/<folder>/weights.safetensors    # rlconnect container, format "rlconnect.weights"
        policies/<folder>/agent_pipeline         # a save_pipeline file
        policies/<folder>/action_pipeline        # a save_pipeline file
        policies/<folder>/learner_pipeline       # a save_pipeline file (absent: empty)

``<folder>`` is the policy id when it is a plain name (letters, digits, ``_ . -``), else
``_policy_<i>``; the manifest maps ids to files, so the folder name carries no meaning.
The manifest (its first two entries are the header of ``RUNNER_CHECKPOINT``,
``rlconnect.checkpoints.formats``)::

    {"format": "rlconnect.runner_checkpoint", "format_version": 1,
     "rlconnect_version": "0.1.0",
     "config": {...RunnerConfig.to_dict()...}, "config_omitted": ["env_config"],
     "policies": [{"id": "default_policy",
                   "spec": {"kind": "MLPPolicy", "kwargs": {...},
                            "observation_space": {...}, "action_space": {...}},
                   "env_observation_space": {...}, "env_action_space": {...},
                   "weights_seq": 3,
                   "files": {"weights": {"path": "policies/default_policy/weights.safetensors",
                                         "sha256": "<64 hex>", "size": 1234},
                             "agent_pipeline": {...}, "action_pipeline": {...},
                             "learner_pipeline": {...}}}]}

``weights_seq`` is the version of the weights (``policy.weights_seq``; absent: 0).

Reading trusts nothing: the manifest is size-capped and schema-checked, every file name is
a relative path of plain components that must resolve inside the folder, every declared
size is bounded and must equal the file's size, and every file's SHA-256 is checked before
its bytes are parsed. Any defect raises ``CheckpointError`` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from rlconnect.checkpoints.damage import DIGEST_MISMATCH, size_damage
from rlconnect.checkpoints.files import MAX_FILE_BYTES, open_regular_file, read_regular_file
from rlconnect.checkpoints.formats import RUNNER_CHECKPOINT
from rlconnect.errors import CheckpointError

__all__ = [
    "FILE_NAMES",
    "FILE_ROLES",
    "MANIFEST",
    "MAX_BLOB_BYTES",
    "MAX_MANIFEST_BYTES",
    "CheckpointNotFoundError",
    "policy_folder",
    "read_blob",
    "read_manifest",
    "sha256_hex",
    "write_folder_atomically",
]

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20
"""A manifest larger than this is rejected before it is read."""
MAX_BLOB_BYTES = MAX_FILE_BYTES
"""A file declared larger than this (4 GiB, ``checkpoints.files.MAX_FILE_BYTES``, the
limit of every other loader) is rejected from its manifest entry and its size on disk,
before a byte of it is read."""
FILE_ROLES = ("weights", "agent_pipeline", "action_pipeline", "learner_pipeline")
REQUIRED_FILE_ROLES = FILE_ROLES[:3]
"""Every policy entry has these files; ``learner_pipeline`` is absent from checkpoints
written before learner pipelines (an empty one is restored then)."""
FILE_NAMES = {
    "weights": "weights.safetensors",
    "agent_pipeline": "agent_pipeline",
    "action_pipeline": "action_pipeline",
    "learner_pipeline": "learner_pipeline",
}
"""The name of each file in a policy's folder, by role."""
MAX_POLICY_ID_CHARS = 256

_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_SAFE_FOLDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_PATH_PARTS = 8


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """There is no checkpoint folder (or no manifest) at the given path."""

    def __str__(self) -> str:  # OSError's own __str__ expects (errno, strerror)
        return str(self.args[0]) if self.args else ""


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data`` as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def policy_folder(policy_id: str, index: int) -> str:
    """The folder name of a policy: its id when that is a plain name, else ``_policy_<i>``."""
    if _SAFE_FOLDER.fullmatch(policy_id) and policy_id not in (".", ".."):
        return policy_id
    return f"_policy_{index}"


# -- writing --------------------------------------------------------------------------------


def write_folder_atomically(path: str | os.PathLike[str], fill: Callable[[str], None]) -> None:
    """Build a folder with ``fill(tmp_dir)`` and move it to exactly ``path``.

    ``fill`` writes into a fresh temp sibling folder (same filesystem); then everything is
    fsynced and the folder renamed onto ``path``. A crash or an error while filling leaves
    ``path`` untouched (the temp folder is removed on errors; after a hard crash a hidden
    ``.<name>.<hex>.tmp`` sibling may remain and can be deleted).

    When ``path`` already holds a checkpoint, it is first renamed to a hidden
    ``.<name>.<hex>.old`` sibling, the new folder is renamed into place, and only then is
    the old one deleted. Between those two renames (two metadata operations, no data
    copied) ``path`` does not exist; a crash exactly there leaves the previous checkpoint
    complete in the ``.old`` sibling and the new one complete in the ``.tmp`` sibling.

    Raises:
        FileExistsError: ``path`` exists but is not a checkpoint folder (it is never
            deleted: only a folder holding a ``manifest.json``, or an empty one, is replaced).
    """
    target = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(target)
    _check_replaceable(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.{uuid.uuid4().hex}.tmp")
    os.mkdir(tmp)
    try:
        fill(tmp)
        _fsync_tree(tmp)
        _swap_into_place(tmp, target, parent, name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_replaceable(target: str) -> None:
    if not os.path.lexists(target):
        return
    if os.path.islink(target) or not os.path.isdir(target):
        raise FileExistsError(
            f"{target!r} exists and is not a checkpoint folder; refusing to replace it"
        )
    if os.listdir(target) and not os.path.isfile(os.path.join(target, MANIFEST)):
        raise FileExistsError(
            f"{target!r} is a non-empty folder without a {MANIFEST}: not a checkpoint; "
            "refusing to replace it"
        )


def _swap_into_place(tmp: str, target: str, parent: str, name: str) -> None:
    if not os.path.lexists(target):
        os.rename(tmp, target)
        _fsync_dir(parent)
        return
    old = os.path.join(parent, f".{name}.{uuid.uuid4().hex}.old")
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the previous checkpoint back
        raise
    _fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(root: str) -> None:
    """Call fsync on every file and folder below ``root`` (folders after their contents)."""
    for here, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            fd = os.open(os.path.join(here, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(here)


def _fsync_dir(directory: str) -> None:
    if os.name != "posix":
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# -- reading --------------------------------------------------------------------------------


def _fail(root: str, file: str, msg: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {root!r}: {file}: {msg}")


def read_manifest(root: str) -> dict[str, Any]:
    """The validated manifest of the checkpoint folder ``root``."""
    if not os.path.exists(root):
        raise CheckpointNotFoundError(f"no checkpoint at {root!r}: it does not exist")
    if not os.path.isdir(root):
        raise CheckpointError(
            f"{root!r} is a file, not a checkpoint folder (a saved pipeline? use rc.load_pipeline)"
        )
    path = os.path.join(root, MANIFEST)
    try:
        data = read_regular_file(
            path, max_bytes=MAX_MANIFEST_BYTES, fail=lambda msg: _fail(root, MANIFEST, msg)
        )
    except FileNotFoundError:
        raise CheckpointNotFoundError(
            f"checkpoint {root!r}: {MANIFEST} is missing (not a checkpoint, or damaged)"
        ) from None
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _fail(root, MANIFEST, "is not valid JSON (damaged, or not a checkpoint)") from None
    _check_manifest(obj, lambda msg: _fail(root, MANIFEST, msg))
    return obj


def _check_manifest(obj: Any, fail: Callable[[str], CheckpointError]) -> None:
    if not isinstance(obj, dict):
        raise fail(f"is a JSON {type(obj).__name__}, expected an object")
    RUNNER_CHECKPOINT.check(obj, where=MANIFEST, fail=fail)
    if not isinstance(obj.get("config"), dict):
        raise fail("'config' must be an object")
    omitted = obj.get("config_omitted", [])
    if not isinstance(omitted, list) or not all(isinstance(k, str) for k in omitted):
        raise fail("'config_omitted' must be a list of strings")
    policies = obj.get("policies")
    if not isinstance(policies, list) or not policies:
        raise fail("'policies' must be a non-empty list")
    ids: set[str] = set()
    paths: set[str] = set()
    for i, entry in enumerate(policies):
        _check_policy_entry(entry, i, fail)
        if entry["id"] in ids:
            raise fail(f"policy id {entry['id']!r} appears twice")
        ids.add(entry["id"])
        for role in entry["files"]:
            p = entry["files"][role]["path"]
            if p in paths:
                raise fail(f"file {p!r} is listed twice")
            paths.add(p)


def _check_policy_entry(entry: Any, i: int, fail: Callable[[str], CheckpointError]) -> None:
    where = f"policies[{i}]"
    if not isinstance(entry, dict):
        raise fail(f"{where} must be an object")
    pid = entry.get("id")
    if not (isinstance(pid, str) and 0 < len(pid) <= MAX_POLICY_ID_CHARS and pid.isprintable()):
        raise fail(
            f"{where}.id {_short(pid)} is not a simple string (printable, 1 to "
            f"{MAX_POLICY_ID_CHARS} characters)"
        )
    where = f"policy {pid!r}"
    spec = entry.get("spec")
    if not isinstance(spec, dict):
        raise fail(f"{where}: 'spec' must be an object")
    if spec.get("kind") is not None and not isinstance(spec.get("kind"), str):
        raise fail(f"{where}: spec.kind must be a string or null")
    if not isinstance(spec.get("kwargs"), dict):
        raise fail(f"{where}: spec.kwargs must be an object")
    for key in ("observation_space", "action_space"):
        if not isinstance(spec.get(key), dict):
            raise fail(f"{where}: spec.{key} must be an object")
    for key in ("env_observation_space", "env_action_space"):
        if not isinstance(entry.get(key), dict):
            raise fail(f"{where}: {key} must be an object")
    seq = entry.get("weights_seq", 0)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise fail(f"{where}: weights_seq must be an integer >= 0, got {_short(seq)}")
    files = entry.get("files")
    if (
        not isinstance(files, dict)
        or not set(REQUIRED_FILE_ROLES) <= set(files)
        or not set(files) <= set(FILE_ROLES)
    ):
        raise fail(
            f"{where}: 'files' must be an object with the keys {list(REQUIRED_FILE_ROLES)} "
            f"and optionally {FILE_ROLES[3]!r}"
        )
    for role in files:
        _check_file_entry(files[role], f"{where}: files.{role}", fail)


def _check_file_entry(f: Any, where: str, fail: Callable[[str], CheckpointError]) -> None:
    if not isinstance(f, dict):
        raise fail(f"{where} must be an object with 'path', 'sha256' and 'size'")
    path, digest, size = f.get("path"), f.get("sha256"), f.get("size")
    if not isinstance(path, str):
        raise fail(f"{where}.path must be a string, got {_short(path)}")
    _check_relpath(path, lambda msg: fail(f"{where}.path {_short(path)}: {msg}"))
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise fail(f"{where}.sha256 must be 64 lowercase hex digits, got {_short(digest)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise fail(f"{where}.size must be an integer >= 0, got {_short(size)}")
    if size > MAX_BLOB_BYTES:
        raise fail(f"{where}.size declares {size} bytes, more than the limit {MAX_BLOB_BYTES}")


def _check_relpath(path: str, fail: Callable[[str], CheckpointError]) -> None:
    parts = path.split("/")
    if not 0 < len(parts) <= _MAX_PATH_PARTS:
        raise fail("must be a relative path of 1 to 8 components")
    for part in parts:
        if part in ("", ".", "..") or not _SAFE_COMPONENT.fullmatch(part):
            raise fail(
                "must be a relative path inside the checkpoint, made of plain names "
                "(letters, digits, '_', '.', '-'; no '..', no absolute path, no '\\')"
            )


def read_blob(root: str, entry: dict[str, Any]) -> tuple[str, bytes]:
    """``(absolute path, bytes)`` of a validated file entry, after size and SHA-256 checks."""
    rel = entry["path"]
    real_root = os.path.realpath(root)
    path = os.path.join(real_root, *rel.split("/"))
    real = os.path.realpath(path)
    if os.path.commonpath([real, real_root]) != real_root:
        raise _fail(root, rel, "resolves outside the checkpoint folder (a symlink?)")
    try:
        with open_regular_file(
            real, max_bytes=MAX_BLOB_BYTES, fail=lambda msg: _fail(root, rel, msg)
        ) as (fd, size):
            if size != entry["size"]:
                raise _fail(root, rel, size_damage(size, entry["size"]))
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(size + 1)
    except FileNotFoundError:
        raise _fail(root, rel, "is missing") from None
    if len(data) != entry["size"]:
        raise _fail(root, rel, "changed size while being read")
    if sha256_hex(data) != entry["sha256"]:
        raise _fail(root, rel, DIGEST_MISMATCH)
    return real, data


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
