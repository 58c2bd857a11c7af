"""The space codec bounds the bytes a decoded space allocates, not only its elements
(a Box of 2**24 float64 values with scalar bounds is 60 bytes of JSON but
about 300 MB of arrays)."""

from __future__ import annotations

import json
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.errors import CheckpointError
from rlconnect.spaces import MAX_JSON_ELEMENTS, MAX_SPACE_BYTES, space_from_json, space_to_json


def big_box(shape: list[int], dtype: str = "float64") -> dict:
    return {"type": "Box", "dtype": dtype, "shape": shape, "low": -1, "high": 1}


def peak_of(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_box_within_the_element_limit_but_over_the_byte_budget_is_refused_unallocated():
    obj = big_box([MAX_JSON_ELEMENTS])  # allowed elements, 2**24 * 18 B of arrays
    assert len(json.dumps(obj)) < 100

    def decode() -> None:
        with pytest.raises(
            ValueError,
            match=r"\$: a float64 Box of shape \(16777216,\) would take "
            r"301,989,888 bytes, beyond the 33,554,432 bytes .*MAX_SPACE_BYTES",
        ):
            space_from_json(obj)

    assert peak_of(decode) < 2**20


def test_the_budget_is_for_the_whole_space_not_each_box():
    each = MAX_SPACE_BYTES // 4 // 10  # elements of a float32 Box taking a quarter
    fits = {"type": "Tuple", "spaces": [big_box([each], "float32")] * 3}
    assert len(space_from_json(fits).spaces) == 3
    over = {"type": "Tuple", "spaces": [big_box([each], "float32")] * 5}
    with pytest.raises(ValueError, match=r"\$\.spaces\[4\]: a float32 Box .* in all"):
        space_from_json(over)
    md = {"type": "MultiDiscrete", "nvec": [[2] * 1000] * 1000}  # 16 MB of int64 arrays
    pair = {"type": "Tuple", "spaces": [md, md, md]}
    with pytest.raises(ValueError, match=r"\$\.spaces\[2\]: a MultiDiscrete"):
        space_from_json(pair)


def test_large_real_spaces_still_decode():
    frame = space_from_json(big_box([1000, 1000, 3], "float32"))  # 30 MB of bounds
    assert frame.shape == (1000, 1000, 3) and frame.dtype == np.float32
    for space in (
        gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
        gym.spaces.MultiDiscrete(np.full((100, 100), 5)),
    ):
        assert space_from_json(json.loads(json.dumps(space_to_json(space)))) == space


def test_a_checkpoint_declaring_a_huge_box_is_a_checkpoint_error(tmp_path):
    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space, seed=0)
    runner = rc.EnvRunner("CartPole-v1", policy, config=rc.RunnerConfig(rollout_fragment_length=4))
    runner.save_checkpoint(tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    manifest["policies"][0]["env_observation_space"] = big_box([1 << 23, 2])
    (tmp_path / "ck" / "manifest.json").write_text(json.dumps(manifest))

    def load() -> None:
        with pytest.raises(
            CheckpointError,
            match=r"manifest.json: policy 'default_policy': invalid env_observation_space: "
            r"\$: a float64 Box of shape \(8388608, 2\) would take 301,989,888 bytes",
        ):
            rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")

    assert peak_of(load) < 32 * 2**20  # the whole load (a 300 MB Box was refused)
