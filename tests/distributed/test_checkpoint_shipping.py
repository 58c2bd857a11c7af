"""A checkpoint folder shipped as bytes (to a remote runner, or by the policy server's
``checkpoint`` endpoint): every file read bounded, nothing written outside the target."""

from __future__ import annotations

import os
import threading
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.checkpoints.files import MAX_FILE_BYTES, read_folder, write_folder
from rlconnect.checkpoints.runner_format import read_manifest
from rlconnect.distributed.worker import RemoteRunner, RunnerSpec

ACT = gym.spaces.Discrete(2)


def _spec() -> RunnerSpec:
    config = rc.RunnerConfig(num_envs=1, rollout_fragment_length=4, seed=0)
    return RunnerSpec(
        "CartPole-v1",
        rc.MLPPolicy(gym.spaces.Box(-np.inf, np.inf, (4,)), ACT, seed=0),
        None,
        config,
        None,
    )


def test_a_shipped_checkpoint_restores_a_remote_runner(tmp_path) -> None:
    spec = _spec()
    source = spec.build(0)
    source.sample()
    source.save_checkpoint(tmp_path / "ckpt")
    files = read_folder(tmp_path / "ckpt")
    assert "manifest.json" in files and all(isinstance(v, bytes) for v in files.values())
    remote = RemoteRunner(spec, 1)
    try:
        remote.restore_files(files)
        got, want = remote.get_weights(), source.get_weights()
        for key, value in want["default_policy"].items():
            np.testing.assert_array_equal(got["default_policy"][key], value)
    finally:
        remote.stop()
        source.stop()


def test_an_oversized_file_is_refused_unread(tmp_path) -> None:
    """A sparse file one byte over the limit: refused from its size, naming the file, its
    size and the limit, without its 4 GiB being allocated."""
    (tmp_path / "manifest.json").write_bytes(b"{}")
    giant = tmp_path / "policies" / "huge.bin"
    giant.parent.mkdir()
    with open(giant, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    tracemalloc.start()
    try:
        with pytest.raises(rc.CheckpointError) as info:
            read_folder(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "huge.bin" in message
    assert f"{MAX_FILE_BYTES + 1:,} bytes" in message and f"limit of {MAX_FILE_BYTES:,}" in message
    assert peak < 1 << 20
    with pytest.raises(
        rc.CheckpointError, match=r"manifest.json.*holds 2 bytes, more than the limit of 1"
    ):
        read_folder(tmp_path, max_bytes=1)  # the manifest: limits apply to every file


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_a_symlink_in_the_folder_is_not_read(tmp_path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"abc")
    os.mkfifo(tmp_path / "pipe")  # reading it would block until someone writes
    os.symlink("/dev/zero", tmp_path / "zeros")  # reading it would never end
    out: dict = {}
    reader = threading.Thread(target=lambda: out.update(read_folder(tmp_path)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and out == {"weights.bin": b"abc"}


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"../escape.bin": b"x"}, "lies outside the checkpoint folder"),
        ({"a/../../escape.bin": b"x"}, "lies outside the checkpoint folder"),
        ({"weights.bin": "not bytes"}, "expected a str path and bytes"),
        ({7: b"x"}, "expected a str path and bytes"),
    ],
)
def test_files_from_elsewhere_cannot_write_outside_the_folder(tmp_path, files, match) -> None:
    with pytest.raises(ValueError, match=match):
        write_folder(files, tmp_path / "ckpt")
    assert not (tmp_path / "escape.bin").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_group_ships_only_the_files_the_manifest_lists(tmp_path) -> None:
    """Issue 55, item 9: a restore reads the manifest and the files it lists, each size-
    and digest-checked, and nothing else the folder holds (a sparse 1 GiB stray file, a
    FIFO, a symlink to /dev/zero); the shipped files restore a remote runner."""
    from rlconnect.distributed.group import checkpoint_files

    spec = _spec()
    source = spec.build(0)
    source.sample()
    ck = tmp_path / "ckpt"
    source.save_checkpoint(ck)
    with open(ck / "stray.bin", "wb") as f:
        f.truncate(1 << 30)
    os.mkfifo(ck / "policies" / "pipe")
    os.symlink("/dev/zero", ck / "zero")
    tracemalloc.start()
    try:
        files = checkpoint_files(ck)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    manifest = read_manifest(str(ck))
    listed = {e["path"] for p in manifest["policies"] for e in p["files"].values()}
    assert set(files) == {"manifest.json", *listed}
    assert peak < 16 << 20, peak
    remote = RemoteRunner(spec, 1)
    try:
        remote.restore_files(files)
        w = source.get_weights()["default_policy"]
        got = remote.runner.get_weights()["default_policy"]
        assert all(np.array_equal(w[k], got[k]) for k in w)
    finally:
        remote.runner.stop()
        source.stop()
    (ck / "stray.bin").unlink()
    weights = next(p for p in listed if p.endswith("weights.safetensors"))
    (ck / weights).write_bytes(b"x" * len(files[weights]))
    with pytest.raises(rc.CheckpointError):  # a listed file that changed is refused
        checkpoint_files(ck)
