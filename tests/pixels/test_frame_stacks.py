"""Frame stacks stored once (`FrameStackColumn`): lossless, shared only where verified,
transparent in `SampleBatch`, and what the runner stores for a frame-stacking pipeline."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.batches.compressed import CompressedColumn
from rlconnect.batches.frame_stacks import (
    FrameStackColumn,
    pack_image_columns,
    share_frames,
    transition_observations,
)
from rlconnect.collectors import policy_collector
from rlconnect.connectors import AgentData, FrameStack
from rlconnect.offline.batch_files import write_batches

K = 4


def _stacks(frames: np.ndarray, k: int = K) -> np.ndarray:
    """FrameStack's output for one trajectory by hand: row t holds frames t-k+1..t, the
    first frame repeated before the start."""
    pos = np.maximum(np.arange(len(frames))[:, None] - (k - 1) + np.arange(k), 0)
    return frames[pos]


def _trajectories(lengths: list[int], k: int = K, shape=(6, 5), seed: int = 0):
    """obs / new_obs of transitions as a collector builds them: trajectories one after
    another, each of L transitions (L + 1 observations of distinct random frames)."""
    rng = np.random.default_rng(seed)
    obs, new = [], []
    for n in lengths:
        stacks = _stacks(rng.integers(0, 256, (n + 1, *shape), dtype=np.uint8), k)
        obs.append(stacks[:-1])
        new.append(stacks[1:])
    return np.concatenate(obs), np.concatenate(new)


def test_each_frame_stored_once_and_lossless():
    lengths = [7, 1, 12, 3]
    obs, new = _trajectories(lengths)
    col, new_col = share_frames(obs, new)
    assert col.pool is new_col.pool  # obs and new_obs share one pool
    # per trajectory: its first stack (k frames) + one frame per further row of obs + the
    # newest frame of the last new_obs; new_obs[t] is obs[t + 1] everywhere else
    assert col.pool_frames == sum(n + K for n in lengths)
    np.testing.assert_array_equal(col.materialize(), obs)
    np.testing.assert_array_equal(new_col.materialize(), new)
    assert col.shape == obs.shape and col.dtype == obs.dtype and len(col) == len(obs)
    assert col.raw_nbytes == obs.nbytes


def test_rows_that_do_not_match_are_stored_in_full():
    obs, new = _trajectories([10])
    base = share_frames(obs, new)[0].pool_frames
    obs[5, 0, 0, 0] ^= 1  # obs[5] no longer continues obs[4] (frames 1..3 still match)
    new[8, -1, 2, 2] ^= 1  # new_obs[8]: still obs[8] shifted, but no longer obs[9]
    new[2, 0, 1, 1] ^= 1  # new_obs[2]: neither obs[3] nor obs[2] shifted
    col, new_col = share_frames(obs, new)
    np.testing.assert_array_equal(col.materialize(), obs)  # never trusts the layout
    np.testing.assert_array_equal(new_col.materialize(), new)
    # obs[5] in full (k - 1 more frames, obs[6] continues it); new_obs[4] is no longer
    # obs[5] and new_obs[8] no longer obs[9] (one newest frame each); new_obs[2] in full
    assert col.pool_frames == base + (K - 1) + 2 + K


def test_matches_the_framestack_connector_output():
    space = gym.spaces.Box(0, 255, (5, 3), np.uint8)
    ctx = rc.ConnectorContext(space, gym.spaces.Discrete(2))
    stack = FrameStack(ctx, num_frames=3)
    rng = np.random.default_rng(1)
    rows = [stack(AgentData([0, 1], ["a", "a"], {"obs": rng.integers(0, 256, (2, 5, 3))}))]
    for t in range(6):
        if t == 3:
            stack.reset(1)  # env 1 starts a new episode: a padded stack
        data = AgentData([0, 1], ["a", "a"], {"obs": rng.integers(0, 256, (2, 5, 3))})
        rows.append(stack(data))
    env0, env1 = (np.stack([r["obs"][e] for r in rows]) for e in (0, 1))
    # as the collector builds them: trajectories one after another, each transition two
    # consecutive rows; env 1's episode ended after its row 3 (rows 4.. are a new episode)
    obs = np.concatenate([env0[:-1], env1[0:3], env1[4:6]])
    new = np.concatenate([env0[1:], env1[1:4], env1[5:7]])
    col, new_col = share_frames(obs, new)
    np.testing.assert_array_equal(col.materialize(), obs)
    np.testing.assert_array_equal(new_col.materialize(), new)
    # per trajectory: k = 3 frames + one per transition
    assert col.pool_frames == (3 + 6) + (3 + 3) + (3 + 2)


def _store(lengths: list[int], seed: int = 0):
    """A collector's observation rows: trajectories of ``lengths`` rows, one per sub-env,
    stored interleaved in arrival order; ``rows`` / ``nxt`` pair each row with the next of
    its trajectory, trajectories one after another (as ``PolicyCollector.build``)."""
    rng = np.random.default_rng(seed)
    per_env = [_stacks(rng.integers(0, 256, (n, 6, 5), dtype=np.uint8)) for n in lengths]
    column, traj = [], []
    for t in range(max(lengths)):
        for e, stacks in enumerate(per_env):
            if t < len(stacks):
                column.append(stacks[t])
                traj.append(e)
    traj = np.array(traj)
    order = np.argsort(traj, kind="stable")
    pair = traj[order][:-1] == traj[order][1:]
    return np.stack(column), order[:-1][pair], order[1:][pair]


def test_transition_observations_from_collector_rows():
    column, rows, nxt = _store([9, 4, 12])
    obs, new = transition_observations(column, rows, nxt)
    assert isinstance(obs, FrameStackColumn) and obs.pool is new.pool
    np.testing.assert_array_equal(obs.materialize(), column[rows])
    np.testing.assert_array_equal(new.materialize(), column[nxt])
    assert obs.pool_frames == (8 + K) + (3 + K) + (11 + K)  # transitions + k per trajectory
    column[rows[5], 1, 0, 0] ^= 1  # a stored row that is not its predecessor shifted
    obs, new = transition_observations(column, rows, nxt)
    np.testing.assert_array_equal(obs.materialize(), column[rows])  # verified, not trusted
    np.testing.assert_array_equal(new.materialize(), column[nxt])
    # that row in full, and the row after it no longer continues it: 2 (k - 1) more
    assert obs.pool_frames == (8 + K) + (3 + K) + (11 + K) + 2 * (K - 1)


def test_transition_observations_of_anything_else_are_taken_plainly():
    column, rows, nxt = _store([5, 5])
    images = column[:, 0]  # (n, 6, 5): images, not stacks
    obs, new = transition_observations(images, rows, nxt)
    np.testing.assert_array_equal(obs, images[rows])
    np.testing.assert_array_equal(new, images[nxt])
    nest = {"a": np.arange(len(column)), "b": (column,)}
    obs, new = transition_observations(nest, rows, nxt)
    np.testing.assert_array_equal(obs["a"], rows)
    np.testing.assert_array_equal(new["b"][0], column[nxt])


@pytest.mark.parametrize(
    ("obs", "why"),
    [
        (np.zeros((4, 8, 8, 3), np.uint8) + np.arange(8)[:, None, None], "RGB images"),
        (np.zeros((4, 3, 5), np.float32), "stacks of vectors"),
        (np.zeros((4, 1, 5, 5), np.uint8), "k = 1"),
        (np.zeros((0, 4, 5, 5), np.uint8), "no rows"),
    ],
)
def test_not_frame_stacks_stay_plain(obs, why):
    assert share_frames(obs, obs.copy()) is None, why
    cols = {"obs": obs, "new_obs": obs.copy()}
    assert isinstance(pack_image_columns(cols, ["obs"])["obs"], np.ndarray)


def test_pack_without_observations():
    cols = {"rewards": np.zeros(3), "obs": None}
    assert pack_image_columns(cols, ["obs", "new_obs"], compress=True) == cols
    assert share_frames(None, None) is None


def test_no_saving_stays_plain():
    obs, new = _trajectories([1, 1, 1, 1, 1])  # every row its own trajectory
    assert share_frames(obs, new) is None  # pool would be 5 * (k + 1) > n * k frames
    assert share_frames(*_trajectories([3, 3])) is not None


@pytest.mark.parametrize(
    ("shape", "dtype"), [((3, 5), np.uint8), ((4, 2), np.float32), ((2, 3), np.int16)]
)
def test_frames_of_any_size_and_dtype(shape, dtype):
    obs, new = _trajectories([6, 4], shape=shape)
    obs, new = obs.astype(dtype), new.astype(dtype)
    col, new_col = share_frames(obs, new)
    assert col.pool_frames == 6 + 4 + 2 * K and col.dtype == dtype
    np.testing.assert_array_equal(col.materialize(), obs)
    np.testing.assert_array_equal(new_col.materialize(), new)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    k=st.integers(2, 4),
    levels=st.integers(1, 3),  # few gray levels: frames that happen to be equal
    corrupt=st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_property_lossless_through_row_operations(lengths, k, levels, corrupt, seed):
    rng = np.random.default_rng(seed)
    obs, new = [], []
    for n in lengths:
        stacks = _stacks(rng.integers(0, levels, (n + 1, 2, 3), dtype=np.uint8), k)
        obs.append(stacks[:-1])
        new.append(stacks[1:])
    obs, new = np.concatenate(obs), np.concatenate(new)
    for row, in_new in corrupt:
        (new if in_new else obs)[row % len(obs), row % k, 0, 0] += 7
    packed = share_frames(obs, new)
    if packed is None:
        return
    col, new_col = packed
    assert col.pool_frames <= len(obs) * k
    np.testing.assert_array_equal(col.materialize(), obs)
    np.testing.assert_array_equal(new_col.materialize(), new)
    idx = rng.permutation(len(obs))[: max(1, len(obs) // 2)]
    np.testing.assert_array_equal(col.take(idx).materialize(), obs[idx])
    np.testing.assert_array_equal(new_col.take(slice(1, None, 2)).materialize(), new[1::2])
    joined = FrameStackColumn.concat([col.take(idx), new_col, col])
    np.testing.assert_array_equal(joined.materialize(), np.concatenate([obs[idx], new, obs]))
    assert joined.pool is col.pool  # one pool: joined without copying a frame


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    k=st.integers(2, 4),
    levels=st.integers(1, 3),
    corrupt=st.lists(st.integers(0, 40), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_property_transition_observations_equal_plain_takes(lengths, k, levels, corrupt, seed):
    rng = np.random.default_rng(seed)
    per_env = [_stacks(rng.integers(0, levels, (n, 3, 2), dtype=np.uint8), k) for n in lengths]
    arrival = rng.permutation(np.repeat(np.arange(len(lengths)), lengths))  # any interleaving
    taken = [0] * len(lengths)
    column, traj = [], []
    for e in arrival.tolist():
        column.append(per_env[e][taken[e]])
        taken[e] += 1
        traj.append(e)
    column, traj = np.stack(column), np.array(traj)
    for row in corrupt:
        column[row % len(column), row % k, 0, 0] += 5
    order = np.argsort(traj, kind="stable")
    pair = traj[order][:-1] == traj[order][1:]
    rows, nxt = order[:-1][pair], order[1:][pair]
    obs, new = transition_observations(column, rows, nxt)
    np.testing.assert_array_equal(np.asarray(obs), column[rows])
    np.testing.assert_array_equal(np.asarray(new), column[nxt])
    if isinstance(obs, FrameStackColumn):
        assert obs.pool is new.pool and obs.pool_frames <= len(rows) * k


def _batch(lengths=(5, 9), compress=False) -> tuple[rc.SampleBatch, np.ndarray, np.ndarray]:
    obs, new = _trajectories(list(lengths))
    eps = np.repeat(np.arange(len(lengths)), lengths)
    cols = pack_image_columns({"obs": obs, "new_obs": new, "eps_id": eps}, ["obs", "new_obs"],
                              compress=compress)  # fmt: skip
    return rc.SampleBatch(cols), obs, new


def test_sample_batch_reads_frame_stacks_transparently():
    b, obs, new = _batch()
    assert b.lazy_columns() == {"obs": "FrameStackColumn", "new_obs": "FrameStackColumn"}
    assert b.compressed_columns() == []
    got = b["obs"]
    assert isinstance(got, np.ndarray) and got.flags.writeable
    np.testing.assert_array_equal(got, obs)
    got[:] = 0  # a fresh array: the batch is unchanged
    np.testing.assert_array_equal(b["obs"], obs)
    np.testing.assert_array_equal(b[3:11]["new_obs"], new[3:11])
    np.testing.assert_array_equal(b.take([13, 0, 4])["obs"], obs[[13, 0, 4]])
    parts = b.split_by_episode()
    assert [len(p) for p in parts] == [5, 9]
    joined = rc.concat_samples(parts)
    assert joined.lazy_columns() == b.lazy_columns()
    assert joined.nbytes == b.nbytes  # the parts' shared pool is not copied
    plain = rc.SampleBatch({"obs": obs, "new_obs": new, "eps_id": b["eps_id"]})
    assert b == plain and joined == plain and b.copy(deep=True) == plain
    assert all(isinstance(v, np.ndarray) for v in b.values())
    assert "obs(4, 6, 5) uint8" in repr(b)
    # obs and new_obs share the pool: it is counted once
    pool = b._columns["obs"].pool
    index_bytes = b._columns["obs"].index.nbytes * 2
    assert b.nbytes == pool.nbytes + index_bytes + b["eps_id"].nbytes
    assert b.nbytes * 2 < plain.nbytes  # tiny 30-byte frames: the index weighs too


def test_concat_of_separate_batches_joins_pools_once():
    (a, obs_a, new_a), (b, obs_b, new_b) = _batch((4, 6)), _batch((7,))
    joined = rc.concat_samples([a, b])
    assert joined._columns["obs"].pool is joined._columns["new_obs"].pool
    assert joined.nbytes == a.nbytes + b.nbytes
    np.testing.assert_array_equal(joined["obs"], np.concatenate([obs_a, obs_b]))
    np.testing.assert_array_equal(joined["new_obs"], np.concatenate([new_a, new_b]))
    mixed = rc.concat_samples([a, rc.SampleBatch({k: b[k] for k in b})])
    assert mixed.lazy_columns() == {}  # a plain part: plain arrays
    np.testing.assert_array_equal(mixed["new_obs"], np.concatenate([new_a, new_b]))


def test_compressed_pool():
    b, obs, new = _batch(compress=True)
    assert b.compressed_columns() == ["obs", "new_obs"]
    col = b._columns["obs"]
    assert isinstance(col.pool, CompressedColumn) and col.pool is b._columns["new_obs"].pool
    np.testing.assert_array_equal(b["obs"], obs)
    np.testing.assert_array_equal(b[2:9]["new_obs"], new[2:9])
    joined = rc.concat_samples([b, b[1:4]])
    assert isinstance(joined._columns["obs"].pool, CompressedColumn)
    np.testing.assert_array_equal(joined["obs"], np.concatenate([obs, obs[1:4]]))


def test_bad_index_is_refused():
    pool = np.zeros((3, 2, 2), np.uint8)
    with pytest.raises(ValueError, match="outside the pool"):
        FrameStackColumn(pool, np.array([[0, 3]]))
    with pytest.raises(ValueError, match="int array"):
        FrameStackColumn(pool, np.array([0, 1]))
    FrameStackColumn(pool, np.array([[0, 1]]))
    assert pool.flags.writeable  # the caller's array keeps its flags


class MovingSquare(gym.Env):
    """An RGB frame with a square that moves one pixel per step; 30 steps per episode."""

    observation_space = gym.spaces.Box(0, 255, (24, 24, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = int(self.np_random.integers(5))
        return self._frame(), {}

    def step(self, action):
        self._t += 1
        return self._frame(), float(action), self._t >= 30, False, {}

    def _frame(self) -> np.ndarray:
        img = np.full((24, 24, 3), 40, np.uint8)
        img[8:12, self._t % 20 : self._t % 20 + 4] = (200, 100, 50)
        img[0, 0] = self._t  # every frame of an episode differs
        return img


def _sample(monkeypatch=None, **config) -> rc.SampleBatch:
    if monkeypatch is not None:  # the negative control: the collector stores plain arrays
        plain = lambda column, rows, nxt: (column[rows], column[nxt])  # noqa: E731
        monkeypatch.setattr(policy_collector, "transition_observations", plain)
        monkeypatch.setattr(policy_collector, "pack_image_columns", lambda cols, *a, **k: cols)
    policy = rc.RandomPolicy(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(2))
    cfg = rc.RunnerConfig(preset="atari", num_envs=2, rollout_fragment_length=50, seed=0, **config)
    with rc.EnvRunner(lambda ctx: MovingSquare(), policy, config=cfg) as runner:
        return runner.sample()


def test_runner_stores_frame_stacks_once(monkeypatch):
    packed = _sample()
    assert packed.lazy_columns() == {"obs": "FrameStackColumn", "new_obs": "FrameStackColumn"}
    # per trajectory in the batch: k frames for its first stack, one per further row,
    # one for the last new_obs (eps_id and env_id pick out trajectories: one agent)
    keys = np.stack([packed["env_id"], packed["eps_id"]], axis=1)
    _, rows = np.unique(keys, axis=0, return_counts=True)
    assert packed._columns["obs"].pool_frames == int((rows + K).sum())
    both = _sample(compress_observations=True)
    assert both.compressed_columns() == ["obs", "new_obs"]
    assert both.nbytes * 10 < packed.nbytes
    plain = _sample(monkeypatch)  # (patched from here on)
    assert plain.lazy_columns() == {}
    assert packed == plain and both == plain
    assert packed.nbytes * 6 < plain.nbytes


def test_runner_frame_stacks_write_and_read_back(tmp_path):
    batch = _sample(output=str(tmp_path / "parquet"))  # the runner's own output files
    assert batch.lazy_columns()
    write_batches(batch, tmp_path / "rlb")
    (back,) = list(rc.read_batches(tmp_path / "rlb"))
    assert back.lazy_columns() == {} and back == batch
    written = rc.concat_samples(list(rc.read_batches(tmp_path / "parquet")))
    for name in ("obs", "new_obs", "eps_id", "rewards"):
        np.testing.assert_array_equal(written[name], batch[name])
