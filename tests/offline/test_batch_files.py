"""Batch files: runner batches and nested columns round-trip exactly; damaged files are named."""

from __future__ import annotations

import doctest
import importlib
import json
import os

import gymnasium as gym
import numpy as np
import pytest
import tree

import rlconnect as rc
from rlconnect.batches import batches_equal
from rlconnect.checkpoints import BATCH_FILE
from rlconnect.checkpoints.container import pack
from rlconnect.offline import (
    BatchWriter,
    list_batch_files,
    read_batch_file,
    read_batches,
    summarize_batches,
    write_batches,
)
from rlconnect.offline.batch_files import to_json_value


def assert_same(a, b):
    """Same structure, dtypes (byte order included), values and meta."""
    assert type(a) is type(b)
    assert batches_equal(a, b), (a, b)
    pairs = (
        [(a, b)]
        if isinstance(a, rc.SampleBatch)
        else [(a.policy_batches[k], b.policy_batches[k]) for k in a.policy_batches]
    )
    for x, y in pairs:
        assert list(x.keys()) == list(y.keys())
        assert x.meta == y.meta
        for key in x:
            for u, v in zip(tree.flatten(x[key]), tree.flatten(y[key])):
                assert u.dtype.str == v.dtype.str and u.shape == v.shape


def test_module_docstring_examples_run():
    module = importlib.import_module("rlconnect.offline.batch_files")
    assert doctest.testmod(module).failed == 0


# --- runner batches ----------------------------------------------------------------------
def test_cartpole_batches_round_trip_in_order(tmp_path):
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=2, rollout_fragment_length=40, seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space), config=cfg
    )
    written = [runner.sample() for _ in range(4)]
    runner.stop()
    paths = write_batches(written, tmp_path / "out")
    assert [p.name for p in paths] == [f"batch-{i:06d}.rlb" for i in range(4)]
    back = list(read_batches(tmp_path / "out"))
    assert len(back) == 4
    for a, b in zip(written, back):
        assert_same(a, b)
    assert back[0]["infos"].dtype == object
    assert back[0].meta["policy_id"] == "default_policy"
    # the same through a single file, a glob and a list
    assert_same(read_batch_file(paths[2]), written[2])
    assert len(list(read_batches(str(tmp_path / "out" / "batch-*.rlb")))) == 4
    assert len(list(read_batches([paths[3], paths[0]]))) == 2


class TwoAgentEnv(rc.MultiAgentEnv):
    """``a`` and ``b`` act every step; ``b`` sees a Dict observation; infos carry arrays."""

    possible_agents = ["a", "b"]

    def __init__(self, ctx=None):
        self.observation_spaces = {
            "a": gym.spaces.Box(-10, 10, (2,), np.float32),
            "b": gym.spaces.Box(-10, 10, (3,), np.float64),
        }
        self.action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(3)}
        self.t = 0

    def _obs(self):
        return {
            "a": np.full(2, self.t, np.float32),
            "b": np.full(3, -self.t, np.float64),
        }

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {"a": {"start": np.arange(2)}}

    def step(self, actions):
        self.t += 1
        done = self.t >= 5
        return (
            self._obs(),
            {"a": 1.0, "b": 0.5},
            {"__all__": done},
            {"__all__": False},
            {"b": {"t": self.t}},
        )


def test_multi_agent_batches_round_trip(tmp_path):
    env = TwoAgentEnv()
    policies = {
        "pa": rc.RandomPolicy(env.observation_spaces["a"], env.action_spaces["a"]),
        "pb": rc.RandomPolicy(env.observation_spaces["b"], env.action_spaces["b"]),
    }
    runner = rc.EnvRunner(
        TwoAgentEnv,
        policies,
        lambda agent_id, episode, **kw: "pa" if agent_id == "a" else "pb",
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=7, seed=1),
    )
    written = [runner.sample() for _ in range(2)]
    runner.stop()
    assert all(isinstance(b, rc.MultiAgentBatch) for b in written)
    write_batches(written, tmp_path)
    back = list(read_batches(tmp_path))
    for a, b in zip(written, back):
        assert_same(a, b)
        assert b.env_steps() == a.env_steps() and b.agent_steps() == a.agent_steps()
    summary = summarize_batches(tmp_path)
    assert summary["kinds"] == {"MultiAgentBatch": 2}
    assert set(summary["policies"]) == {"pa", "pb"}
    assert summary["policies"]["pb"]["columns"]["obs"] == "float64[3]"


class DictObsEnv(gym.Env):
    def __init__(self, ctx=None):
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                "inner": gym.spaces.Tuple(
                    (gym.spaces.Discrete(3), gym.spaces.Box(0, 255, (2, 2), np.uint8))
                ),
            }
        )
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        info = {"t": self.t, "v": np.float32(0.5)}
        return self.observation_space.sample(), 1.0, self.t >= 4, False, info


def test_dict_observations_without_flattening_round_trip(tmp_path):
    env = DictObsEnv()
    runner = rc.EnvRunner(
        DictObsEnv,
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0),
        agent_pipelines={rc.DEFAULT_POLICY_ID: lambda ctx: rc.AgentConnectorPipeline(ctx, [])},
    )
    batch = runner.sample()
    runner.stop()
    assert isinstance(batch["obs"], dict) and isinstance(batch["obs"]["inner"], tuple)
    write_batches(batch, tmp_path)
    (back,) = read_batches(tmp_path)
    assert_same(batch, back)
    assert back["infos"][0]["v"] == 0.5 and isinstance(back["infos"][0]["v"], float)


# --- hand-made batches ----------------------------------------------------------------------
class Opaque:
    def __repr__(self):
        return "<Opaque>"


def nested_batch(n=3):
    rng = np.random.default_rng(0)
    return rc.SampleBatch(
        {
            "obs": {
                "img": rng.integers(0, 255, (n, 2, 2), dtype=np.uint8),
                "pair": (
                    np.arange(n, dtype=np.int8),
                    {"deep": rng.normal(size=(n, 1)).astype(np.float16)},
                ),
            },
            "f32": np.array([0.0, np.nan, -np.inf][:n], np.float32),
            "big_endian": np.arange(n, dtype=">f4"),
            "c64": np.ones(n, np.complex64) * (1 + 2j),
            "c128": np.ones((n, 2), np.complex128) * (3 - 1j),
            "u64": np.full(n, 2**63 + 5, np.uint64),
            "when": np.array(["2024-01-01"] * n, dtype="datetime64[ns]"),
            "label": np.array(["a", "bc", "def"][:n]),
            "flags": np.array([True, False, True][:n]),
            "infos": [
                {"arr": np.arange(3), 7: "int key", "nested": {"x": (1, 2)}},
                {"b": b"raw", "obj": Opaque(), "nan": float("nan"), "s": np.float32(1.5)},
                {},
            ][:n],
        },
        meta={"policy_id": "p", "weights_seen": np.array([1, 2]), "note": "hello"},
    )


def test_nested_columns_and_dtypes_are_preserved(tmp_path):
    batch = nested_batch()
    write_batches(batch, tmp_path)
    (back,) = read_batches(tmp_path)
    assert list(back.keys()) == list(batch.keys())
    for key in batch:
        if key == "infos":
            continue

        tree.assert_same_structure(batch[key], back[key], check_types=True)
        for u, v in zip(tree.flatten(batch[key]), tree.flatten(back[key])):
            assert u.dtype.str == v.dtype.str, key
            np.testing.assert_array_equal(u, v)
    assert back["big_endian"].dtype.str == ">f4"
    assert back["c128"].dtype == np.complex128
    assert back["label"].tolist() == ["a", "bc", "def"]
    # infos: JSON, with the documented fallback for what is not JSON
    assert back["infos"][0] == {"arr": [0, 1, 2], "7": "int key", "nested": {"x": [1, 2]}}
    row = back["infos"][1]
    assert row["b"] == "b'raw'" and row["obj"] == "<Opaque>" and row["s"] == 1.5
    assert np.isnan(row["nan"])
    assert back["infos"][2] == {}
    assert back.meta == {"policy_id": "p", "weights_seen": [1, 2], "note": "hello"}


def test_empty_batch_and_zero_rows(tmp_path):
    write_batches(
        [rc.SampleBatch(), rc.SampleBatch({"x": np.zeros((0, 3), np.float32), "infos": []})],
        tmp_path,
    )
    empty, zero = read_batches(tmp_path)
    assert len(empty) == 0 and list(empty.keys()) == []
    assert zero["x"].shape == (0, 3) and zero["x"].dtype == np.float32
    assert zero["infos"].dtype == object and len(zero["infos"]) == 0


def test_object_columns_other_than_infos(tmp_path):
    col = np.empty((2, 2), dtype=object)
    col[:] = [[{"a": 1}, None], ["s", [1, 2]]]
    write_batches(rc.SampleBatch({"objs": col}), tmp_path)
    (back,) = read_batches(tmp_path)
    assert back["objs"].shape == (2, 2) and back["objs"].dtype == object
    assert back["objs"].tolist() == [[{"a": 1}, None], ["s", [1, 2]]]


def test_to_json_value_fallbacks():
    assert to_json_value((np.int64(3), np.bool_(True), {1: set()})) == [3, True, {"1": "set()"}]
    deep: list = []
    cur = deep
    for _ in range(100):
        cur.append([])
        cur = cur[0]
    json.dumps(to_json_value(deep))  # too deep: cut off with a repr, never a RecursionError


def test_unstorable_columns_are_rejected_before_writing(tmp_path):
    structured = np.zeros(2, dtype=[("a", "O")])
    with pytest.raises(ValueError, match="'s'"):
        write_batches(rc.SampleBatch({"s": structured}), tmp_path)
    with pytest.raises(TypeError, match=r"SampleBatch or rc\.MultiAgentBatch"):
        write_batches([{"x": np.zeros(2)}], tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- files, folders, order ----------------------------------------------------------------
def test_writer_appends_after_existing_files(tmp_path):
    b = rc.SampleBatch({"x": np.arange(2)})
    write_batches([b, b], tmp_path)
    with BatchWriter(tmp_path) as w:
        path = w.write(rc.SampleBatch({"x": np.arange(5)}))
    assert path.name == "batch-000002.rlb" and w.num_written == 1 and w.env_steps == 5
    assert [len(x) for x in read_batches(tmp_path)] == [2, 2, 5]
    with pytest.raises(ValueError, match="closed"):
        w.write(b)


def test_order_is_numeric_beyond_six_digits(tmp_path):
    for i in (999_999, 1_000_000, 5):
        (tmp_path / f"batch-{i:06d}.rlb").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / ".batch-000007.rlb.abc.tmp").write_bytes(b"")  # an unfinished write
    names = [os.path.basename(p) for p in list_batch_files(tmp_path)]
    assert names == ["batch-000005.rlb", "batch-999999.rlb", "batch-1000000.rlb"]


def test_missing_paths_and_empty_folders(tmp_path):
    assert list(read_batches(tmp_path)) == []
    with pytest.raises(FileNotFoundError, match="nope"):
        read_batches(tmp_path / "nope")  # at once, not on first next()
    with pytest.raises(FileNotFoundError, match="match"):
        read_batches(str(tmp_path / "x-*.rlb"))
    with pytest.raises(NotADirectoryError):
        BatchWriter(__file__)


# --- damaged and hostile files --------------------------------------------------------------
@pytest.fixture
def good_file(tmp_path):
    (path,) = write_batches(nested_batch(), tmp_path / "d")
    return path


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: b"", "empty"),
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:-5] + bytes([d[-5] ^ 0xFF]) + d[-4:], "digest mismatch"),
        (lambda d: b"garbage garbage garbage", "header"),
    ],
    ids=["empty", "truncated", "flipped-byte", "garbage"],
)
def test_damaged_files_raise_checkpoint_error_naming_the_file(good_file, damage, message):
    good_file.write_bytes(damage(good_file.read_bytes()))
    with pytest.raises(rc.CheckpointError, match=message) as err:
        list(read_batches(good_file.parent))
    assert str(good_file) in str(err.value)


def test_a_pipeline_file_is_not_a_batch_file(tmp_path):
    env = gym.make("CartPole-v1")
    ctx = rc.ConnectorContext(env.observation_space, env.action_space)
    rc.save_pipeline(rc.default_agent_pipeline(ctx), tmp_path / "batch-000000.rlb")
    with pytest.raises(rc.CheckpointError, match=r"rlconnect\.pipeline"):
        list(read_batches(tmp_path))


def forge(tmp_path, structure, arrays=None):
    path = tmp_path / "batch-000000.rlb"
    path.write_bytes(pack(structure, arrays or {}, BATCH_FILE))
    return path


def batch_with(column, count=2):
    return {
        "kind": "SampleBatch",
        "index": 0,
        "batch": {"count": count, "meta": "{}", "columns": [["c", column]]},
    }


REF = {"__array__": "arr_0"}


@pytest.mark.parametrize(
    ("structure", "arrays", "message"),
    [
        ({"kind": "Pickle", "index": 0}, {}, "unknown batch kind"),
        ({"kind": "SampleBatch"}, {}, "lacks 'index'"),
        ([1, 2], {}, "not an object"),
        (
            batch_with({"node": "raw", "dtype": "|O8", "shape": [2], "data": REF}),
            {"arr_0": np.zeros(16, np.uint8)},
            "not allowed",
        ),
        (
            batch_with({"node": "raw", "dtype": "<f8", "shape": [3], "data": REF}),
            {"arr_0": np.zeros(16, np.uint8)},
            "16 bytes",
        ),
        (
            batch_with({"node": "array", "dtype": "float32", "shape": [2], "data": REF}),
            {"arr_0": np.zeros(2, np.float64)},
            "not float32",
        ),
        (
            batch_with({"node": "json", "shape": [2], "data": REF}),
            {"arr_0": np.frombuffer(b"[1]", np.uint8).copy()},
            "list of 2",
        ),
        (
            batch_with({"node": "json", "shape": [2], "data": REF}),
            {"arr_0": np.frombuffer(b"\xff\xfe", np.uint8).copy()},
            "damaged",
        ),
        (
            batch_with({"node": "array", "dtype": "int64", "shape": [2], "data": REF}, count=5),
            {"arr_0": np.zeros(2, np.int64)},
            "not 5",
        ),
        (
            batch_with({"node": "lambda", "shape": [2], "data": REF}),
            {"arr_0": np.zeros(2, np.uint8)},
            "unknown node",
        ),
        (
            {"kind": "MultiAgentBatch", "index": 0, "env_steps": -1, "policy_batches": []},
            {},
            "negative",
        ),
    ],
)
def test_hostile_structures_raise_checkpoint_error(tmp_path, structure, arrays, message):
    path = forge(tmp_path, structure, arrays)
    with pytest.raises(rc.CheckpointError, match=message) as err:
        read_batch_file(path)
    assert str(path) in str(err.value)
