"""A checkpoint whose manifest declares a file over 4 GiB (and holds one, sparse) is
refused from the manifest and the size on disk, before a byte of it is read (issue 55,
item 8): before, the limit was 64 GiB and the 4 GiB file was read whole, then refused."""

from __future__ import annotations

import json
import os
import tracemalloc

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.checkpoints.files import MAX_FILE_BYTES
from rlconnect.checkpoints.runner_format import MAX_BLOB_BYTES
from rlconnect.checkpoints.runner_load import load_checkpoint


def test_a_blob_over_4_gib_is_refused_unread(tmp_path):
    assert MAX_BLOB_BYTES == MAX_FILE_BYTES
    env = gym.make("CartPole-v1")
    runner = rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(8,), seed=0)
    )
    ck = tmp_path / "ck"
    runner.save_checkpoint(ck)
    manifest = json.loads((ck / "manifest.json").read_text())
    entry = manifest["policies"][0]["files"]["weights"]
    weights = ck / entry["path"]
    with open(weights, "r+b") as f:  # sparse: no disk used
        f.truncate(MAX_FILE_BYTES + 1)
    entry["size"] = MAX_FILE_BYTES + 1  # the manifest agrees with the file on disk
    (ck / "manifest.json").write_text(json.dumps(manifest))
    tracemalloc.start()
    try:
        for load in (lambda: load_checkpoint(ck), lambda: runner.restore(ck)):
            with pytest.raises(rc.CheckpointError, match="more than the limit"):
                load()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # nothing of the 4 GiB was read
    assert os.path.getsize(weights) == MAX_FILE_BYTES + 1
    runner.stop()
