"""Parquet output: round trips of everything a runner samples, rolling, crashes, bad data."""

from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tree

import rlconnect as rc
from rlconnect.batches import batches_equal
from rlconnect.offline import (
    BadFileWarning,
    OfflineDataError,
    ParquetBatchWriter,
    read_batches,
    summarize_batches,
)


def assert_same(a, b):
    """Same kind, structure, dtypes (byte order included), values and meta."""
    assert type(a) is type(b)
    assert batches_equal(a, b)
    pairs = (
        [(a, b)]
        if isinstance(a, rc.SampleBatch)
        else [(a.policy_batches[k], b.policy_batches[k]) for k in a.policy_batches]
    )
    if isinstance(a, rc.MultiAgentBatch):
        assert list(a.policy_batches) == list(b.policy_batches)
        assert a.env_steps() == b.env_steps()
    for x, y in pairs:
        assert list(x.keys()) == list(y.keys())
        # A file holds a batch as collected; ``weights_lag`` is what ``sample()`` notes when
        # it hands the batch out (after the output is written), so only the handed-out
        # batch has it.
        assert {k: v for k, v in x.meta.items() if k != "weights_lag"} == y.meta
        for key in x:
            tree.assert_same_structure(x[key], y[key], check_types=True)
            for u, v in zip(tree.flatten(x[key]), tree.flatten(y[key])):
                assert u.dtype.str == v.dtype.str and u.shape == v.shape, key


@pytest.mark.parametrize(
    "module", ["rlconnect.offline.parquet_writer", "rlconnect.offline.estimators"]
)
def test_module_docstring_examples_run(module):
    assert doctest.testmod(importlib.import_module(module)).failed == 0


# --- round trips of what runners sample ------------------------------------------------------
def test_cartpole_output_is_finished_after_every_sample(tmp_path):
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=2, rollout_fragment_length=30, seed=0, output=str(tmp_path))
    runner = rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space), config=cfg
    )
    sampled = []
    for _ in range(4):
        sampled.append(runner.sample())
        back = list(read_batches(tmp_path))  # everything so far, in finished files
        assert len(back) == len(sampled)
        for a, b in zip(sampled, back):
            assert_same(a, b)
    runner.stop()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert back[0]["infos"].dtype == object
    assert set(back[0]) >= {"obs", "new_obs", "actions", "action_logp", "action_dist_inputs"}


class TwoAgentDictEnv(rc.MultiAgentEnv):
    """``a`` acts every step, ``b`` (Dict observations) every other step; infos vary."""

    possible_agents = ["a", "b"]

    def __init__(self, ctx=None):
        self.observation_spaces = {
            "a": gym.spaces.Box(-10, 10, (2,), np.float32),
            "b": gym.spaces.Dict(
                {
                    "pos": gym.spaces.Box(-10, 10, (3,), np.float64),
                    "mode": gym.spaces.Discrete(4),
                    "pair": gym.spaces.Tuple(
                        (gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2, 2), np.float32))
                    ),
                }
            ),
        }
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(3)}
        self.t = 0

    def _obs(self, agents):
        obs = {
            "a": np.full(2, self.t, np.float32),
            "b": {
                "pos": np.full(3, -self.t, np.float64),
                "mode": self.t % 4,
                "pair": (self.t % 2, np.full((2, 2), 0.5, np.float32)),
            },
        }
        return {k: obs[k] for k in agents}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(["a", "b"]), {"a": {"start": [1, 2], "name": "x"}}

    def step(self, actions):
        self.t += 1
        done = self.t >= 6
        agents = ["a", "b"] if self.t % 2 == 0 or done else ["a"]
        rewards = {"a": 1.0, "b": 0.5} if "b" in agents else {"a": 1.0}
        return (
            self._obs(agents),
            rewards,
            {"__all__": done},
            {"__all__": False},
            {"a": {"t": self.t, "nan": float("nan") if self.t == 3 else 0.0}},
        )


def _two_agent_runner(tmp_path, **cfg):
    env = TwoAgentDictEnv()
    flat_b = gym.spaces.Box(-np.inf, np.inf, (gym.spaces.flatdim(env.observation_spaces["b"]),))
    policies = {
        "pa": rc.MLPPolicy(env.observation_spaces["a"], env.action_spaces["a"]),
        "pb": rc.MLPPolicy(flat_b, env.action_spaces["b"]),
    }
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=7, seed=1, **cfg)
    return rc.EnvRunner(
        TwoAgentDictEnv,
        policies,
        lambda agent_id, episode, **kw: "pa" if agent_id == "a" else "pb",
        config=config,
    )


def test_multi_agent_nested_obs_round_trip_with_ids(tmp_path):
    runner = _two_agent_runner(
        tmp_path, output=str(tmp_path), keep_raw_obs=True, record_env_actions=True
    )
    sampled = [runner.sample() for _ in range(3)]
    runner.stop()
    back = list(read_batches(tmp_path))
    assert len(back) == 3
    for a, b in zip(sampled, back):
        assert_same(a, b)
    raw = back[0].policy_batches["pb"]["raw_obs"]
    assert isinstance(raw, dict) and isinstance(raw["pair"], tuple)
    # the policy_id / agent_id columns, for other tools
    table = pq.read_table(sorted(tmp_path.glob("*.parquet"))[0])
    ids = set(zip(table["policy_id"].to_pylist(), table["agent_id"].to_pylist()))
    assert ids == {("pa", "a"), ("pb", "b")}
    assert "raw_obs/pair/1" in table.column_names  # nested obs flattened by path
    summary = summarize_batches(tmp_path)
    assert summary["kinds"] == {"MultiAgentBatch": 3}
    assert summary["format"] == "rlconnect.parquet v1"


def test_every_dtype_and_object_column_round_trips(tmp_path):
    n = 5
    batch = rc.SampleBatch(
        {
            "b": np.array([True, False, True, True, False]),
            "i8": np.arange(n, dtype=np.int8),
            "u64": np.arange(n, dtype=np.uint64) * 2**40,
            "f16": np.linspace(0, 1, n).astype(np.float16),
            "c128": np.arange(n) + 1j * np.arange(n),
            "big_endian": np.arange(n * 2, dtype=">i4").reshape(n, 2),
            "text": np.array(["a", "bb", "ccc", "", "e"]),
            "img": np.random.default_rng(0).integers(0, 255, (n, 30, 30), dtype=np.uint8),
            "nan": np.array([np.nan, 1.0, np.inf, -np.inf, 0.0]),
            "infos": [{}, {"x": 1}, {"y": [1, 2]}, {}, {"z": None}],
        },
        meta={"policy_id": "default_policy", "note": [1, 2]},
    )
    with ParquetBatchWriter(tmp_path, compress_columns=("img",)) as w:
        w.write(batch)
        w.write(batch[1:3])
    first, second = read_batches(tmp_path)
    assert_same(batch, first)
    assert_same(batch[1:3], second)
    first["img"][0, 0, 0] = 7  # read arrays are writable


def test_policies_with_different_layouts_share_a_file(tmp_path):
    a = rc.SampleBatch({"obs": np.zeros((3, 2), np.float32), "x": np.ones(3)})
    b = rc.SampleBatch({"obs": np.zeros((2, 5), np.float64), "x": np.ones(2)})
    batch = rc.MultiAgentBatch({"pa": a, "pb": b, "empty": a[0:0]}, 3)
    with ParquetBatchWriter(tmp_path) as w:
        w.write(batch)
    (back,) = read_batches(tmp_path)
    assert_same(batch, back)
    assert "obs@pb" in pq.read_schema(next(tmp_path.glob("*.parquet"))).names


# --- rolling, compression, crashes ---------------------------------------------------------
def _cartpole_like(n, seed=0):
    rng = np.random.default_rng(seed)
    return rc.SampleBatch(
        {
            "obs": rng.standard_normal((n, 4)).astype(np.float32),
            "new_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n),
            "rewards": np.ones(n),
            "eps_id": np.repeat(np.arange(n // 10 + 1), 10)[:n],
            "infos": [{}] * n,
        }
    )


def test_files_roll_at_the_size_limit_and_batches_span_them(tmp_path):
    batches = [_cartpole_like(400, seed=s) for s in range(6)]
    limit = 20_000
    with ParquetBatchWriter(tmp_path, max_file_size=limit) as w:
        for b in batches:
            w.write(b)
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) > 6  # batches larger than the limit were split
    for f in files:
        if pq.ParquetFile(f).metadata.num_row_groups > 1:
            assert f.stat().st_size <= limit
    back = list(read_batches(tmp_path))
    assert len(back) == 6
    for a, b in zip(batches, back):
        assert_same(a, b)
    sizes = [len(b) for b in read_batches(tmp_path, batch_size=500)]
    assert sizes == [500] * 4 + [400]


def test_compressed_columns_are_compressed(tmp_path):
    with ParquetBatchWriter(tmp_path, compress_columns=("obs",)) as w:
        w.write(_cartpole_like(100))
    meta = pq.ParquetFile(next(tmp_path.glob("*.parquet"))).metadata
    rg = meta.row_group(0)
    codecs = {
        rg.column(i).path_in_schema.split(".")[0]: rg.column(i).compression
        for i in range(rg.num_columns)
    }
    assert codecs["obs"] == "ZSTD"
    assert codecs["new_obs"] == codecs["rewards"] == "UNCOMPRESSED"
    doc = json.loads(meta.metadata[b"rlconnect"])
    assert (doc["format"], doc["version"]) == ("rlconnect.parquet", 1)


def test_an_error_mid_write_leaves_earlier_files_and_no_partial_file(tmp_path, monkeypatch):
    from rlconnect.offline import parquet_writer

    w = ParquetBatchWriter(tmp_path, max_file_size=10_000)
    w.write(_cartpole_like(100))
    w.flush()
    before = sorted(p.name for p in tmp_path.iterdir())
    calls = []

    def failing_write(self, table):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C half-way through a batch
        return original(self, table)

    original = parquet_writer._OpenFile.write
    monkeypatch.setattr(parquet_writer._OpenFile, "write", failing_write)
    with pytest.raises(KeyboardInterrupt):
        w.write(_cartpole_like(1000, seed=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # rolled parts removed too
    assert [len(b) for b in read_batches(tmp_path)] == [100]


def test_a_killed_process_leaves_only_finished_files(tmp_path):
    code = f"""
import os, numpy as np, rlconnect as rc
from rlconnect.offline import ParquetBatchWriter
w = ParquetBatchWriter({str(tmp_path)!r})
b = rc.SampleBatch({{"x": np.arange(1000.0)}})
w.write(b); w.flush()
w.write(b)           # in the open file, not finished
os._exit(1)          # killed: no cleanup runs
"""
    subprocess.run([sys.executable, "-c", code], check=False, timeout=120)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == "part-000-000000.parquet"
    assert all(n.endswith(".tmp") and n.startswith(".") for n in names[:-1])
    (back,) = read_batches(tmp_path)
    assert len(back) == 1000
    # a new writer in the same folder continues the numbering
    with ParquetBatchWriter(tmp_path) as w:
        w.write(back)
    assert (tmp_path / "part-000-000001.parquet").exists()


# --- bad data ------------------------------------------------------------------------------
def _write_one(path, **kw):
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    with ParquetBatchWriter(path, spaces={"obs": space}, max_file_size=8000, **kw) as w:
        w.write(_cartpole_like(300).copy())
    return sorted(path.glob("*.parquet"))


def _rewrite(path, fn_table=None, fn_meta=None):
    pf = pq.ParquetFile(path)
    doc = json.loads(pf.metadata.metadata[b"rlconnect"])
    tables = [pf.read_row_group(i) for i in range(pf.metadata.num_row_groups)]
    if fn_meta:
        fn_meta(doc)
    with pq.ParquetWriter(path, (fn_table or (lambda t: t))(tables[0]).schema) as w:
        for t in tables:
            w.write_table((fn_table or (lambda t: t))(t))
        w.add_key_value_metadata({"rlconnect": json.dumps(doc)})


def test_missing_column_names_file_and_row_group(tmp_path):
    b = _cartpole_like(50)
    b["obs"] = np.clip(b["obs"], -1, 1)
    with ParquetBatchWriter(tmp_path) as w:
        w.write(b)
    path = next(tmp_path.glob("*.parquet"))
    _rewrite(path, fn_table=lambda t: t.drop_columns(["actions"]))
    with pytest.raises(OfflineDataError, match=r"row group 0.*'actions'") as info:
        list(read_batches(tmp_path))
    assert info.value.path == str(path) and info.value.row_group == 0
    assert str(path) in str(info.value)


def test_wrong_schema_version_is_named(tmp_path):
    with ParquetBatchWriter(tmp_path) as w:
        w.write(_cartpole_like(20))
    path = next(tmp_path.glob("*.parquet"))
    _rewrite(path, fn_meta=lambda d: d.update(version=99))
    with pytest.raises(OfflineDataError, match=r"version 99 is not supported; supported versions"):
        list(read_batches(path))


def test_truncated_footer_is_named(tmp_path):
    with ParquetBatchWriter(tmp_path) as w:
        w.write(_cartpole_like(20))
    path = next(tmp_path.glob("*.parquet"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 50])
    with pytest.raises(OfflineDataError, match=r"footer is missing or damaged") as info:
        list(read_batches(tmp_path))
    assert info.value.path == str(path)


def test_foreign_parquet_file_is_named(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "other.parquet")
    with pytest.raises(OfflineDataError, match="not written by rlconnect"):
        list(read_batches(tmp_path))


def test_observations_outside_the_recorded_space_name_row_group_and_rows(tmp_path):
    b = _cartpole_like(300)
    b["obs"] = np.clip(b["obs"], -1, 1)
    b["obs"][250, 2] = 5.0  # outside Box(-1, 1)
    space = gym.spaces.Box(-1, 1, (4,), np.float32)
    with ParquetBatchWriter(tmp_path, spaces={"obs": space}, max_file_size=12_000) as w:
        w.write(b)
    with pytest.raises(OfflineDataError, match=r"outside the recorded space") as info:
        list(read_batches(tmp_path))
    assert info.value.row_group is not None
    assert "obs" in info.value.problem
    assert len(list(read_batches(tmp_path, check_spaces=False))) == 1


def test_one_bad_file_among_good_ones_fails_or_is_skipped(tmp_path):
    for s in range(3):
        with ParquetBatchWriter(tmp_path) as w:
            w.write(_cartpole_like(20, seed=s))
    bad = sorted(tmp_path.glob("*.parquet"))[1]
    bad.write_bytes(bad.read_bytes()[:-30])
    with pytest.raises(OfflineDataError, match=bad.name):
        list(read_batches(tmp_path))
    reader = read_batches(tmp_path, on_bad_file="skip")
    with pytest.warns(BadFileWarning, match=bad.name):
        got = list(reader)
    assert [len(b) for b in got] == [20, 20]
    assert [p for p, _ in reader.skipped] == [str(bad)]
    assert_same(got[1], _cartpole_like(20, seed=2))
    with pytest.raises(ValueError, match="on_bad_file"):
        read_batches(tmp_path, on_bad_file="ignore")


def test_skipping_a_file_that_held_part_of_a_batch_drops_that_batch(tmp_path):
    with ParquetBatchWriter(tmp_path, max_file_size=6000) as w:
        w.write(_cartpole_like(300))
        w.write(_cartpole_like(10, seed=1))
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) >= 3
    files[1].write_bytes(b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadFileWarning)
        reader = read_batches(tmp_path, on_bad_file="skip")
        got = list(reader)
    assert [len(b) for b in got] == [10]
    assert any("continues in a file" in why for _, why in reader.skipped)


def test_spaces_that_mix_flat_and_per_policy_forms_are_refused(tmp_path):
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    with pytest.raises(TypeError, match=r"not a mix of both \(see 'p'\)"):
        rc.offline.ParquetBatchWriter(tmp_path, spaces={"obs": box, "p": {"obs": box}})
    # either form alone is fine
    rc.offline.ParquetBatchWriter(tmp_path / "a", spaces={"obs": box}).close()
    rc.offline.ParquetBatchWriter(tmp_path / "b", spaces={"p": {"obs": box}}).close()
