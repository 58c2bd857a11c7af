"""Compressed image columns: lossless, transparent on access, kept through row operations,
and what RunnerConfig(compress_observations=True) stores."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.batches.compressed import CompressedColumn, compressible


class MovingSquare(gym.Env):
    """An RGB frame with a square that moves one pixel per step; 30 steps per episode."""

    observation_space = gym.spaces.Box(0, 255, (24, 24, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def _frame(self) -> np.ndarray:
        img = np.full((24, 24, 3), 40, np.uint8)
        x = self._t % 20
        img[8:12, x : x + 4] = (200, 100, 50)
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = int(self.np_random.integers(5))
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        return self._frame(), float(action), self._t >= 30, False, {}


def _frames(n: int = 50) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 3, (n, 4, 8, 8), dtype=np.uint8)


def test_roundtrip_and_sizes():
    x = _frames()
    col = CompressedColumn.compress(x, chunk_bytes=1024)  # 4 rows per chunk: 13 chunks
    assert col.shape == x.shape and col.dtype == x.dtype and len(col) == 50
    np.testing.assert_array_equal(col.decompress(), x)
    np.testing.assert_array_equal(np.asarray(col), x)
    assert col.raw_nbytes == x.nbytes
    zeros = CompressedColumn.compress(np.zeros((100, 4, 84, 84), np.uint8))
    assert zeros.nbytes * 100 < zeros.raw_nbytes


@pytest.mark.parametrize(
    "index", [slice(0, 12), slice(4, 8), slice(3, 47), slice(10, 2), np.array([49, 0, 7, 7])]
)
def test_take_touches_rows_exactly(index):
    x = _frames()
    col = CompressedColumn.compress(x, chunk_bytes=1024)
    part = col.take(index)
    assert isinstance(part, CompressedColumn)
    np.testing.assert_array_equal(part.decompress(), x[index])
    np.testing.assert_array_equal(col.rows(index), x[index])


def test_sample_batch_reads_compressed_columns_transparently():
    x = _frames()
    eps = np.repeat([3, 4], 25)
    b = rc.SampleBatch({"obs": CompressedColumn.compress(x, 1024), "eps_id": eps})
    assert b.compressed_columns() == ["obs"]
    assert isinstance(b["obs"], np.ndarray)
    np.testing.assert_array_equal(b["obs"], x)
    np.testing.assert_array_equal(b[5:30]["obs"], x[5:30])
    assert b[5:30].compressed_columns() == ["obs"]
    parts = b.split_by_episode()
    assert [len(p) for p in parts] == [25, 25]
    joined = rc.concat_samples(parts)
    assert joined.compressed_columns() == ["obs"]
    np.testing.assert_array_equal(joined["obs"], x)
    assert b == rc.SampleBatch({"obs": x, "eps_id": eps})  # equal by value
    assert len(b.values()) == 2 and all(isinstance(v, np.ndarray) for v in b.values())
    assert b.nbytes < x.nbytes + eps.nbytes


def test_compressible_picks_images_only():
    assert compressible(np.zeros((2, 3, 3), np.uint8))
    assert not compressible(np.zeros((2, 3), np.float32))
    assert not compressible(np.zeros(2, object))


def _sample(compress: bool) -> rc.SampleBatch:
    env = MovingSquare()
    ctx = rc.ConnectorContext(env.observation_space, env.action_space, {"preset": "atari"})
    out = rc.default_agent_pipeline(ctx).output_space
    policy = rc.RandomPolicy(out, env.action_space)
    config = rc.RunnerConfig(
        preset="atari", num_envs=2, rollout_fragment_length=40, seed=0,
        compress_observations=compress, keep_raw_obs=True,
    )  # fmt: skip
    with rc.EnvRunner(lambda ctx: MovingSquare(), policy, config=config) as runner:
        return runner.sample()


def test_runner_compress_observations_stores_the_same_data_smaller():
    plain, packed = _sample(False), _sample(True)
    assert plain.compressed_columns() == []  # negative control
    assert sorted(packed.compressed_columns()) == ["new_obs", "obs", "raw_obs"]
    assert packed == plain
    assert packed["obs"].shape == (80, 4, 84, 84)
    assert packed.nbytes * 10 < plain.nbytes
