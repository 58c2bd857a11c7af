"""save_pipeline / load_pipeline: exact round trips, hostile files, atomic writes, registry."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.checkpoints import (
    PIPELINE_FILE,
    FileFormat,
    load_pipeline,
    load_statistics,
    save_pipeline,
)
from rlconnect.checkpoints import atomic as atomic_mod
from rlconnect.checkpoints.container import pack
from rlconnect.checkpoints.nest import encode_nest
from rlconnect.connectors.base import (
    AgentData,
    ColumnActionConnector,
    ConnectorContext,
    ObservationConnector,
)
from rlconnect.connectors.pipeline import ActionConnectorPipeline, AgentConnectorPipeline
from rlconnect.connectors.registry import register_connector
from rlconnect.errors import CheckpointError, UnknownConnectorError

HERE = Path(__file__).resolve().parent
OBS_DIM = 3


@register_connector("SavingTestNorm")
class RunningNorm(ObservationConnector):
    """Subtracts a running mean; statistics are arrays of several dtypes plus JSON values."""

    def __init__(self, ctx: ConnectorContext, scale: float = 1.0) -> None:
        super().__init__(ctx, scale=scale)
        self.mean = np.zeros(OBS_DIM, np.float64)
        self.count = np.zeros((), np.int64)
        self.seen = np.zeros(OBS_DIM, bool)

    def transform(self, obs: np.ndarray) -> np.ndarray:
        if self.is_training:
            n = self.count + len(obs)
            self.mean = self.mean + (obs.sum(axis=0) - len(obs) * self.mean) / n
            self.count = n
            self.seen |= (obs != 0).any(axis=0)
        return ((obs - self.mean) * self.scale).astype(np.float32)

    @property
    def scale(self) -> float:
        return self.params["scale"]

    def get_statistics(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "count": self.count.copy(), "seen": self.seen.copy()}

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        for key, ref in (("mean", self.mean), ("count", self.count), ("seen", self.seen)):
            value = np.asarray(stats[key])
            if value.shape != ref.shape or value.dtype != ref.dtype:
                raise ValueError(
                    f"{key} must be {ref.dtype}{ref.shape}, got {value.dtype}{value.shape}"
                )
        self.mean, self.count, self.seen = (np.array(stats[k]) for k in ("mean", "count", "seen"))


@register_connector("SavingTestCounter")
class StepCounter(ObservationConnector):
    """Counts rows seen; its statistics are plain JSON."""

    def __init__(self, ctx: ConnectorContext) -> None:
        super().__init__(ctx)
        self.rows = 0

    def transform(self, obs: np.ndarray) -> np.ndarray:
        self.rows += len(obs)
        return obs

    def get_statistics(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        self.rows = int(stats["rows"])


@register_connector("SavingTestTagged")
class Tagged(ObservationConnector):
    """Stateless, with params of every JSON kind (tuples come back as lists)."""

    def __init__(self, ctx: ConnectorContext, tag: str = "", weights: Any = (1, 2.5)) -> None:
        super().__init__(ctx, tag=tag, weights=weights)

    def transform(self, obs: np.ndarray) -> np.ndarray:
        return obs


@register_connector("SavingTestNegate")
class Negate(ColumnActionConnector):
    def transform(self, actions: np.ndarray) -> np.ndarray:
        return -actions


def make_ctx() -> ConnectorContext:
    box = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    return ConnectorContext(observation_space=box, action_space=box)


def batch(seed: int, rows: int = 4) -> AgentData:
    obs = np.random.default_rng(seed).normal(size=(rows, OBS_DIM)).astype(np.float32)
    return AgentData(np.arange(rows), ["agent0"] * rows, {"obs": obs})


def trained_pipeline() -> AgentConnectorPipeline:
    ctx = make_ctx()
    pipe = AgentConnectorPipeline(
        ctx,
        [
            Tagged(ctx, tag="x", weights=(1, 2.5, None, float("nan"))),
            RunningNorm(ctx, scale=0.5),
            StepCounter(ctx),
            RunningNorm(ctx, scale=2.0),
        ],
    )
    for seed in range(3):
        pipe(batch(seed))
    return pipe


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline"
    save_pipeline(trained_pipeline(), path)
    return path


def assert_stats_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        for key in a[name]:
            np.testing.assert_array_equal(a[name][key], b[name][key], strict=True)


# -- round trips ---------------------------------------------------------------------------
def test_round_trip_reproduces_outputs_and_statistics_exactly(tmp_path: Path) -> None:
    pipe = trained_pipeline()
    path = tmp_path / "pipe"
    save_pipeline(pipe, path)
    assert os.listdir(tmp_path) == ["pipe"]  # written exactly at path, no suffix, no temp file
    loaded = load_pipeline(path, make_ctx())
    assert isinstance(loaded, AgentConnectorPipeline)
    assert loaded.names == ["SavingTestTagged", "SavingTestNorm", "SavingTestCounter",
                            "SavingTestNorm_1"]  # fmt: skip
    assert_stats_equal(loaded.get_statistics(), pipe.get_statistics())
    params = loaded["SavingTestTagged"].params
    assert params["tag"] == "x"
    assert params["weights"][:3] == [1, 2.5, None]
    assert np.isnan(params["weights"][3])
    for seed in (10, 11):  # statistics keep evolving identically after the load
        np.testing.assert_array_equal(loaded(batch(seed))["obs"], pipe(batch(seed))["obs"])
    assert_stats_equal(loaded.get_statistics(), pipe.get_statistics())


def test_negative_control_a_fresh_pipeline_gives_different_outputs(saved: Path) -> None:
    pipe = trained_pipeline()
    fresh = AgentConnectorPipeline(make_ctx(), [RunningNorm(make_ctx(), scale=0.5)])
    assert not np.array_equal(fresh(batch(10))["obs"], pipe(batch(10))["obs"])


def test_action_pipeline_kind_is_recorded(tmp_path: Path) -> None:
    ctx = make_ctx()
    save_pipeline(ActionConnectorPipeline(ctx, [Negate(ctx)]), tmp_path / "act")
    loaded = load_pipeline(tmp_path / "act", make_ctx())
    assert isinstance(loaded, ActionConnectorPipeline)
    assert loaded.names == ["SavingTestNegate"]


def test_statistics_survive_reordering_and_an_inserted_member(saved: Path) -> None:
    ctx = make_ctx()
    pipe = AgentConnectorPipeline(ctx, [StepCounter(ctx), Tagged(ctx), RunningNorm(ctx)])
    before = pipe.get_statistics()
    pipe.set_statistics(load_statistics(saved), strict=False)  # SavingTestNorm_1 is ignored
    expected = trained_pipeline().get_statistics()
    assert_stats_equal(
        pipe.get_statistics(),
        {k: expected[k] for k in ("SavingTestCounter", "SavingTestNorm")},
    )
    assert pipe.get_statistics()["SavingTestCounter"] != before["SavingTestCounter"]


def test_default_pipelines_round_trip(tmp_path: Path) -> None:
    from rlconnect.connectors.defaults import default_action_pipeline, default_agent_pipeline

    box = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
    config = {"observation_filter": "MeanStdFilter", "clip_rewards": 1.0, "framestack": 2}
    pipe = default_agent_pipeline(ConnectorContext(box, box, config=config))
    assert "MeanStdFilter" in pipe.names
    for seed in range(3):
        pipe(with_rewards(batch(seed)))
    save_pipeline(pipe, tmp_path / "agent")
    save_pipeline(default_action_pipeline(ConnectorContext(box, box)), tmp_path / "action")
    loaded = load_pipeline(tmp_path / "agent", ConnectorContext(box, box, config=config))
    assert loaded.names == pipe.names
    for env_id in range(4):  # FrameStack history is per episode, not a statistic
        pipe.reset(env_id)
    for seed in (7, 8):
        out, expected = loaded(with_rewards(batch(seed))), pipe(with_rewards(batch(seed)))
        np.testing.assert_array_equal(out["obs"], expected["obs"])
        np.testing.assert_array_equal(out["rewards"], expected["rewards"])
    action = load_pipeline(tmp_path / "action", ConnectorContext(box, box))
    assert isinstance(action, ActionConnectorPipeline)
    assert action.names == default_action_pipeline(ConnectorContext(box, box)).names


def test_builtin_statistics_of_the_wrong_shape_name_the_member(tmp_path: Path) -> None:
    from rlconnect.connectors.agent import MeanStdFilter

    small = ConnectorContext(gym.spaces.Box(-1, 1, (2,), np.float32), make_ctx().action_space)
    pipe = AgentConnectorPipeline(small, [MeanStdFilter(small)])
    pipe(AgentData([0], ["a"], {"obs": np.ones((1, 2), np.float32)}))
    save_pipeline(pipe, tmp_path / "p")
    with pytest.raises(CheckpointError, match="'MeanStdFilter'"):
        load_pipeline(tmp_path / "p", make_ctx())  # 3 features now


def with_rewards(data: AgentData) -> AgentData:
    data["rewards"] = np.linspace(-3, 3, len(data))
    data["t"] = np.zeros(len(data), np.int64)
    return data


# -- saving refuses what it cannot store without pickle --------------------------------------
@pytest.mark.parametrize(
    ("bad", "what"),
    [
        (np.array(["a", "b"]), "dtype <U1"),
        (np.array([{}, 1], dtype=object), "dtype object"),
        ({1: 2}, "keys must be strings"),
        ({1, 2}, "cannot save a builtins.set"),
    ],
)
def test_save_rejects_unsavable_params_naming_connector_and_param(
    tmp_path: Path, bad: Any, what: str
) -> None:
    ctx = make_ctx()
    pipe = AgentConnectorPipeline(ctx, [Tagged(ctx, weights={"inner": bad})])
    with pytest.raises((ValueError, TypeError), match=what) as info:
        save_pipeline(pipe, tmp_path / "p")
    assert "'SavingTestTagged'" in str(info.value)
    assert "weights.inner" in str(info.value)
    assert os.listdir(tmp_path) == []


# -- atomic writes ----------------------------------------------------------------------------
class Crash(Exception):
    pass


def _half_write_then_crash(fd: int, data: bytes) -> None:
    os.write(fd, data[: len(data) // 2])
    raise Crash("disk full")


@pytest.mark.parametrize(
    ("target", "replacement"),
    [
        ("_write_fully", _half_write_then_crash),
        ("os.fsync", Crash),
        ("os.replace", Crash),
    ],
)
def test_crash_during_save_keeps_previous_file_and_leaves_no_temp(
    saved: Path, monkeypatch: pytest.MonkeyPatch, target: str, replacement: Any
) -> None:
    previous = saved.read_bytes()
    if target == "_write_fully":
        monkeypatch.setattr(atomic_mod, "_write_fully", replacement)
    else:

        def boom(*args: Any) -> None:
            raise Crash(target)

        monkeypatch.setattr(os, target.split(".")[1], boom)
    ctx = make_ctx()
    with pytest.raises(Crash):
        save_pipeline(AgentConnectorPipeline(ctx, [StepCounter(ctx)]), saved)
    monkeypatch.undo()
    assert saved.read_bytes() == previous
    assert os.listdir(saved.parent) == [saved.name]
    assert load_pipeline(saved, make_ctx()).names[0] == "SavingTestTagged"


def test_save_overwrites_previous_file(saved: Path) -> None:
    ctx = make_ctx()
    save_pipeline(AgentConnectorPipeline(ctx, [StepCounter(ctx)]), saved)
    assert load_pipeline(saved, make_ctx()).names == ["SavingTestCounter"]
    assert os.listdir(saved.parent) == [saved.name]


# -- hostile and damaged files -----------------------------------------------------------------
def raw_header(raw: bytes) -> bytes:
    return len(raw).to_bytes(8, "little") + raw


def header_file(header: Any) -> bytes:
    return raw_header(json.dumps(header).encode())


def good_metadata() -> dict[str, str]:
    return json.loads(state_file(pipeline_state())[8:].decode())["__metadata__"]


def state_file(state: Any, arrays: dict[str, np.ndarray] | None = None, **kw: Any) -> bytes:
    """A pipeline file holding ``state``; raw (arrays given) or encoded (arrays=None)."""
    fmt = FileFormat(kw.get("format_name", PIPELINE_FILE.name), kw.get("format_version", 1))
    if arrays is None:
        state, arrays = encode_nest(state)
    return pack(state, arrays, fmt)


def deep(n: int) -> Any:
    value: Any = 0
    for _ in range(n):
        value = [value]
    return value


def member(name: str = "SavingTestCounter", params: Any = None) -> dict[str, Any]:
    return {"name": name, "connector": name, "params": {} if params is None else params}


def pipeline_state(*members: Any, kind: str = "AgentConnectorPipeline") -> dict[str, Any]:
    return {"kind": kind, "version": 1, "members": list(members)}


NORM_OK = {"mean": np.zeros(OBS_DIM), "count": np.zeros((), np.int64), "seen": np.zeros(3, bool)}
DAMAGED = {
    "empty": (b"", "empty"),
    "too short": (b"\x05\x00", "not a complete rlconnect file \\(truncated"),
    "random bytes": (np.random.default_rng(0).bytes(300), "header claims"),
    "length field 10**12": ((10**12).to_bytes(8, "little") + b"{}", "header claims 1000000000000"),
    "header not json": (b"\x04" + bytes(7) + b"{{{{", "not valid JSON"),
    "header is a list": (header_file([1, 2]), "JSON list"),
    "no metadata": (header_file({}), "no rlconnect metadata"),
    "metadata not strings": (header_file({"__metadata__": {"format": 1}}), "no rlconnect metadata"),
    "header nested deeply": (raw_header(b'{"x":' + b"[" * 10**5 + b"]" * 10**5 + b"}"), "JSON"),
    "wrong format name": (state_file(pipeline_state(), format_name="other.fmt"), "'other.fmt'"),
    "unknown version": (state_file(pipeline_state(), format_version=7), "supported versions: 1"),
    "no sha256": (
        header_file({"__metadata__": {"format": PIPELINE_FILE.name, "format_version": "1"}}),
        "lacks",
    ),
    "unsupported tensor dtype": (
        header_file({"__metadata__": good_metadata(), "a": {"dtype": "O", "shape": [1]}}),
        "unsupported dtype",
    ),
    "structure not an object": (state_file([1, 2]), "'members' list"),
    "unknown kind": (state_file(pipeline_state(kind="os.system")), "unknown pipeline kind"),
    "state version": (state_file({**pipeline_state(), "version": 99}), "state version"),
    "member not an object": (state_file(pipeline_state("x")), "member 0"),
    "params not an object": (state_file(pipeline_state(member(params=[1]))), "member 0"),
    "duplicate member": (state_file(pipeline_state(member(), member())), "duplicate"),
    "array missing": (
        state_file(pipeline_state(member(params={"__state__": {"__array__": "arr_7"}})), {}),
        "'arr_7', which the file does not hold",
    ),
    "array not referenced": (state_file(pipeline_state(), {"arr_0": np.zeros(2)}), "never ref"),
    "array referenced twice": (
        state_file(
            pipeline_state(member(params={"a": [{"__array__": "k"}] * 2})), {"k": np.ones(1)}
        ),
        "more than once",
    ),
    "bad array reference": (
        state_file(pipeline_state(member(params={"a": {"__array__": "k", "x": 1}})), {}),
        "malformed array reference",
    ),
    "structure nested deeply": (
        state_file(pipeline_state(member(params={"a": deep(100)})), {}),
        "deeper than 64",
    ),
    "member rejects dtype": (
        state_file(
            pipeline_state(member("SavingTestNorm", {"__state__": {**NORM_OK, "seen": np.ones(3)}}))
        ),
        "member 'SavingTestNorm' .* seen must be bool",
    ),
    "member rejects shape": (
        state_file(
            pipeline_state(member("SavingTestNorm", {"__state__": {**NORM_OK, "mean": np.ones(2)}}))
        ),
        "member 'SavingTestNorm' .* mean must be float64",
    ),
    "member rejects params": (
        state_file(pipeline_state(member(params={"bogus": 1}))),
        "member 'SavingTestCounter' .*bogus",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_damaged_files_raise_checkpoint_error_naming_file_and_defect(
    tmp_path: Path, case: str
) -> None:
    data, match = DAMAGED[case]
    path = tmp_path / "damaged"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=match) as info:
        load_pipeline(path, make_ctx())
    assert str(path) in str(info.value)


def test_good_file_built_by_test_helpers_loads(tmp_path: Path) -> None:
    """Positive control for the crafted files above: the helpers themselves are sound."""
    path = tmp_path / "ok"
    path.write_bytes(state_file(pipeline_state(member("SavingTestNorm", {"__state__": NORM_OK}))))
    assert load_pipeline(path, make_ctx()).names == ["SavingTestNorm"]


@pytest.mark.parametrize("cut", range(20))
def test_truncated_files_raise_checkpoint_error(saved: Path, cut: int) -> None:
    data = saved.read_bytes()
    end = int(len(data) * cut / 20)  # 0, 5%, ..., 95% of the file
    saved.write_bytes(data[:end])
    with pytest.raises(CheckpointError, match="truncated"):  # every cut says so
        load_pipeline(saved, make_ctx())


@pytest.mark.parametrize("offset", [9, 100, 200, -200, -50, -1])
def test_flipped_bytes_raise_checkpoint_error(saved: Path, offset: int) -> None:
    data = bytearray(saved.read_bytes())
    data[offset] ^= 0x5A
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        load_pipeline(saved, make_ctx())


def test_huge_declared_array_allocates_nothing(tmp_path: Path) -> None:
    meta = good_metadata()
    big = {"dtype": "F64", "shape": [10**12], "data_offsets": [0, 8 * 10**12]}
    path = tmp_path / "huge"
    path.write_bytes(header_file({"__metadata__": meta, "arr_0": big}) + bytes(64))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="truncated: 395 of its 8,000,000,000,331 bytes"):
            load_pipeline(path, make_ctx())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20


def test_pickle_payload_is_rejected_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> Any:
            return (Path.write_text, (marker, "x"))

    path = tmp_path / "evil"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match="not an rlconnect file"):
        load_pipeline(path, make_ctx())
    assert not marker.exists()


def test_module_attr_connector_name_is_unknown_not_imported(tmp_path: Path) -> None:
    path = tmp_path / "p"
    path.write_bytes(state_file(pipeline_state(member("os:system"))))
    with pytest.raises(UnknownConnectorError, match="SavingTestNorm") as info:
        load_pipeline(path, make_ctx())
    assert isinstance(info.value, KeyError)
    assert "'os:system'" in str(info.value)


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_pipeline(tmp_path / "nope", make_ctx())


# -- a custom connector in a fresh process ----------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys
    import gymnasium as gym, numpy as np
    if sys.argv[2] == "import":
        import _custom_connector_mod  # registers SavingTestRunningMax
    from rlconnect.checkpoints import load_pipeline
    from rlconnect.connectors.base import AgentData, ConnectorContext
    from rlconnect.errors import UnknownConnectorError
    box = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    try:
        pipe = load_pipeline(sys.argv[1], ConnectorContext(box, box))
    except UnknownConnectorError as exc:
        print(exc)
        sys.exit(3)
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = pipe(AgentData([0, 1], ["a", "a"], {"obs": obs}))["obs"]
    print(out.tobytes().hex())
    """
)


def run_child(path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(path), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_custom_connector_loads_in_a_fresh_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    mod = importlib.import_module("_custom_connector_mod")
    ctx = make_ctx()
    pipe = AgentConnectorPipeline(ctx, [mod.RunningMax(ctx)])
    pipe(batch(0))
    path = tmp_path / "custom"
    save_pipeline(pipe, path)
    obs = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = pipe(AgentData([0, 1], ["a", "a"], {"obs": obs}))["obs"].tobytes().hex()

    ok = run_child(path, "import")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == expected

    missing = run_child(path, "no-import")
    assert missing.returncode == 3, missing.stderr
    assert "no connector registered as 'SavingTestRunningMax'" in missing.stdout
    assert "SavingTestRunningMax" not in missing.stdout.split("registered:")[1]
    assert "Traceback" not in missing.stderr
