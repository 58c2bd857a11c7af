"""A small policy file whose declared pipeline would allocate gigabytes when built is
refused before anything is built (issue 55, item 7): a memory budget estimated from the
declared members and spaces (``checkpoints.budget``). Before, a 1 KB file made
``load_policy`` allocate 0.4-1.5 GB (6 GB for a Discrete(40000)) before refusing it."""

from __future__ import annotations

import json
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest
import safetensors.numpy

import rlconnect as rc
from rlconnect.checkpoints import POLICY_FILE
from rlconnect.checkpoints.budget import MAX_PIPELINE_BYTES, pipeline_cost
from rlconnect.checkpoints.container import _digest
from rlconnect.serve import ServingEnv

ACT = gym.spaces.Discrete(2)


def _repack(data: bytes, edit) -> bytes:
    """The policy file with its JSON structure edited and a valid digest."""
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    structure = json.loads(meta["structure"])
    edit(structure)
    text = json.dumps(structure)
    arrays = safetensors.numpy.load(data)
    metadata = {**meta, "structure": text, "sha256": _digest(POLICY_FILE.name, 1, text, arrays)}
    return safetensors.numpy.save(arrays, metadata=metadata)


def _member(kind: str, i: int = 0, **params) -> dict:
    return {"name": f"{kind}{i}", "connector": kind, "params": params}


ATTACKS = {
    "two resizes to 4096x4096": (
        gym.spaces.Box(0, 255, (64, 64, 1), np.uint8),
        [_member("Resize", i, height=4096, width=4096) for i in range(2)],
        None,
    ),
    "flatten of a Discrete(40000)": (
        gym.spaces.Discrete(4),
        [_member("FlattenObservations")],
        40000,
    ),
    "FrameStack of 16000 frames, then filters": (
        gym.spaces.Box(-1, 1, (1000,), np.float32),
        [_member("FrameStack", num_frames=16000)] + [_member("MeanStdFilter", i) for i in range(4)],
        None,
    ),
}


def _policy_file(tmp_path, obs: gym.Space) -> bytes:
    flat = gym.spaces.Box(0, 1, (4,), np.float32) if isinstance(obs, gym.spaces.Discrete) else obs
    runner = rc.EnvRunner(ServingEnv(ACT, obs, 1), rc.RandomPolicy(flat, ACT, seed=0))
    path = tmp_path / "base.policy"
    rc.export_policy(runner, path)
    return path.read_bytes()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_pipeline_that_would_allocate_gigabytes_is_refused_before_building(tmp_path, attack):
    obs, members, discrete_n = ATTACKS[attack]

    def edit(structure: dict) -> None:
        structure["agent_pipeline"]["members"] = members
        if discrete_n is not None:
            structure["observation_space"]["n"] = discrete_n

    data = _repack(_policy_file(tmp_path, obs), edit)
    assert len(data) < 128 << 10  # a small file (its Box bounds are most of it)
    bad = tmp_path / "bad.policy"
    bad.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(rc.CheckpointError, match=r"would allocate about .* nothing was built"):
            rc.load_policy(bad)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak


def test_ordinary_pipelines_are_far_inside_the_budget():
    atari = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    state = {
        "members": [
            _member("Grayscale"),
            _member("Resize", height=84, width=84),
            _member("FrameStack", num_frames=4),
        ]
    }
    cost, member = pipeline_cost(state, atari)
    assert member is None and cost < MAX_PIPELINE_BYTES // 20
    cost, member = pipeline_cost(
        {"members": [_member("FlattenObservations")]}, gym.spaces.Discrete(500)
    )
    assert member is None and cost < MAX_PIPELINE_BYTES // 100
