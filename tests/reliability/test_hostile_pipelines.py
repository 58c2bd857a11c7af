"""Hostile saved pipelines: ``rc.load_pipeline``, ``load_statistics``,
``describe_pipeline_file`` and ``rlconnect inspect`` raise only documented errors, run no
code, import nothing and stay within the memory bound.

Each hypothesis example mutates a valid saved pipeline (its bytes, its tensor table, or its
JSON structure re-packed with a valid checksum so the deeper checks are reached) and loads
it every way the library offers. ``tests/connectors/test_saving.py`` holds the hand-written
cases; this is the systematic layer.
"""

from __future__ import annotations

import inspect
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import numpy as np
import pytest
import safetensors.numpy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.checkpoints import PIPELINE_FILE
from rlconnect.checkpoints.container import pack
from rlconnect.checkpoints.nest import encode_nest
from rlconnect.checkpoints.pipelines import describe_pipeline_file, load_statistics
from rlconnect.cli.describe import describe_path, render
from rlconnect.cli.errors import UsageError
from rlconnect.connectors import ActionConnectorPipeline, AgentConnectorPipeline, ConnectorContext
from rlconnect.connectors.action import ClipActions, ConvertToNumpy, UnsquashActions
from rlconnect.connectors.agent import ClipReward, FrameStack, MeanStdFilter
from rlconnect.connectors.base import AgentData
from rlconnect.connectors.registry import _CONNECTORS

pytestmark = pytest.mark.reliability

ALLOWED = (rc.CheckpointError, rc.UnknownConnectorError)
LOADERS = ["load_pipeline", "load_statistics", "describe_pipeline_file", "inspect"]
OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)


def make_ctx() -> ConnectorContext:
    return ConnectorContext(OBS, ACT)


def trained_agent_pipeline(ctx: ConnectorContext) -> AgentConnectorPipeline:
    pipe = AgentConnectorPipeline(
        ctx, [MeanStdFilter(ctx), ClipReward(ctx, limit=1.0), FrameStack(ctx, num_frames=3)]
    )
    rng = np.random.default_rng(0)
    for _ in range(3):
        obs = rng.uniform(-1, 1, (5, 4)).astype(np.float32)
        pipe(AgentData(np.arange(5), ["a"] * 5, {"obs": obs, "rewards": rng.normal(size=5)}))
    return pipe


class Files:
    """The valid inputs, the canary folder and one Guard per loader."""

    def __init__(self, root: Path) -> None:
        self.root, self.marker_dir = root, root / "canary"
        self.marker_dir.mkdir()
        self.ctx = make_ctx()
        self.agent, self.action = root / "agent_pipeline", root / "action_pipeline"
        rc.save_pipeline(trained_agent_pipeline(self.ctx), self.agent)
        action = ActionConnectorPipeline(
            self.ctx, [ConvertToNumpy(self.ctx), UnsquashActions(self.ctx), ClipActions(self.ctx)]
        )
        rc.save_pipeline(action, self.action)
        self.valid = {"agent": self.agent.read_bytes(), "action": self.action.read_bytes()}
        self.others = {**self.valid, **foreign_files(root)}
        self.target = root / "hostile"
        for path in (self.agent, self.action):  # warm-up: what a good load imports
            self.load_all(path)
        for path in [*(root / "foreign").rglob("*.rlb"), *(root / "foreign").rglob("*.parquet")]:
            render(describe_path(str(path)))  # inspect reads these kinds too
        self.guards = {
            name: fc.Guard(
                f"pipeline:{name}",
                ALLOWED + ((UsageError,) if name == "inspect" else ()),
                self.marker_dir,
            )
            for name in LOADERS
        }

    def load_all(self, path: Path) -> None:
        rc.load_pipeline(path, self.ctx)
        load_statistics(path)
        describe_pipeline_file(path)
        render(describe_path(str(path)))

    def check(self, data: bytes, what: object, kind: str | None = None) -> list[str]:
        """Write ``data`` as the pipeline file and load it every way."""
        self.target.write_bytes(data)
        path = self.target
        loads = {
            "load_pipeline": lambda: rc.load_pipeline(path, self.ctx),
            "load_statistics": lambda: load_statistics(path),
            "describe_pipeline_file": lambda: describe_pipeline_file(path),
            "inspect": lambda: json.dumps(render(describe_path(str(path))), default=str),
        }
        return [self.guards[n].run(loads[n], what, kind) for n in LOADERS]


def foreign_files(root: Path) -> dict[str, bytes]:
    """Valid files of other kinds, spliced in or swapped for the pipeline."""
    d = root / "foreign"
    rc.offline.write_batches(rc.SampleBatch({"obs": np.zeros((3, 4), np.float32)}), d / "rlb")
    with rc.offline.ParquetBatchWriter(d / "pq") as w:
        w.write(rc.SampleBatch({"obs": np.zeros((3, 4), np.float32), "infos": [{}] * 3}))
    buf = d / "t.pt"
    torch.save({"w": torch.zeros(3)}, buf)
    return {
        "rlb": next((d / "rlb").glob("*.rlb")).read_bytes(),
        "parquet": next((d / "pq").glob("*.parquet")).read_bytes(),
        "torch_pt": buf.read_bytes(),
        "manifest": json.dumps({"format": "rlconnect.runner_checkpoint"}).encode(),
        "weights": safetensors.numpy.save({"w": np.zeros(3)}),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Iterator[Files]:
    yield Files(tmp_path_factory.mktemp("hostile_pipelines"))
    fc.publish([*(f"pipeline:{n}" for n in LOADERS), "pipeline:declared_sizes"])


def structure_of(data: bytes) -> tuple[Any, dict[str, np.ndarray]]:
    """The encoded structure (``{"__array__": key}`` references) and the array table."""
    header, _ = fc.split_container(data)
    return json.loads(header["__metadata__"]["structure"]), safetensors.numpy.load(data)


# -- properties ------------------------------------------------------------------------------
@settings(fc.SETTINGS, max_examples=fc.examples(60))
@given(which=st.sampled_from(["agent", "action"]), data=st.data())
def test_mutated_bytes(files: Files, which: str, data: st.DataObject) -> None:
    mutation = data.draw(fc.byte_mutations(files.others))
    files.check(mutation.apply(files.valid[which]), mutation)


@settings(fc.SETTINGS, max_examples=fc.examples(40))
@given(which=st.sampled_from(["agent", "action"]), mutation=fc.tensor_mutations())
def test_mutated_tensor_table(files: Files, which: str, mutation: fc.Mutation) -> None:
    files.check(mutation.apply(files.valid[which]), mutation)


@settings(fc.SETTINGS, max_examples=fc.examples(80))
@given(which=st.sampled_from(["agent", "action"]), edits=fc.json_edits())
def test_mutated_structure_with_valid_checksum(files: Files, which: str, edits: list) -> None:
    obj, arrays = structure_of(files.valid[which])
    text = fc.json_text(fc.apply_edits(obj, edits))
    files.check(fc.pack_text(text, arrays, PIPELINE_FILE.name, 1), edits, kind="json_edit")


# -- pipelines generated from the registered connectors ----------------------------------------
BUILTINS = {
    name: cls
    for name, cls in sorted(_CONNECTORS.items())
    if cls.__module__.startswith("rlconnect.")  # not the test modules' own connectors
}
PARAMS = {
    name: [
        p
        for p, spec in inspect.signature(cls.__init__).parameters.items()
        if p not in ("self", "ctx") and spec.kind is not spec.VAR_KEYWORD
    ]
    for name, cls in BUILTINS.items()
}
PARAM_NAMES = sorted({p for names in PARAMS.values() for p in names} | {"evil"})
CONTEXTS = {
    "vector": ConnectorContext(OBS, ACT),
    "image": ConnectorContext(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), gym.spaces.Discrete(3)),
    "dict": ConnectorContext(
        gym.spaces.Dict({"a": OBS, "b": gym.spaces.Discrete(3)}),
        gym.spaces.MultiDiscrete([2, 3]),
    ),
}


def _array(dtype: str, shape: tuple[int, ...], fill: float) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.full(shape, fill).astype(dtype)


SMALL_ARRAYS = st.builds(
    _array,
    st.sampled_from(["float64", "float32", "int64", "bool", "uint8"]),
    st.sampled_from([(), (0,), (2,), (4,), (2, 2), (8, 8, 3)]),
    st.sampled_from([0, 1, -1, 1e300, float("nan")]),
)
PARAM_VALUES = st.one_of(
    st.integers(-2, 1000),  # sizes a file may legitimately declare
    st.sampled_from(fc.HUGE_INTS),  # sizes over every limit: rejected before allocating
    st.sampled_from(["area", "bilinear", "CHW", "HWC", "obs", "actions", *fc.CODE_NAMES]),
    st.sampled_from([None, True, 0.5, float("nan"), float("inf"), -1e308, [], {}]),
    SMALL_ARRAYS,
)
STATISTICS = st.dictionaries(
    st.sampled_from(["count", "mean", "m2", "std", "shape", "n", "frames"]),
    PARAM_VALUES | st.dictionaries(st.sampled_from(["obs", "x"]), SMALL_ARRAYS, max_size=2),
    max_size=4,
)


def _member(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """A member of kind ``name`` with hostile values for (mostly) its own params."""
    names = st.sampled_from(PARAMS[name]) if PARAMS[name] else st.sampled_from(PARAM_NAMES)
    params = st.dictionaries(names | st.sampled_from(PARAM_NAMES), PARAM_VALUES, max_size=3)
    return st.fixed_dictionaries(
        {
            "connector": st.just(name),
            "params": params | st.builds(lambda s: {"__state__": s}, STATISTICS),
        }
    )


MEMBERS = st.lists(st.sampled_from(sorted(BUILTINS)).flatmap(_member), min_size=1, max_size=4)


@settings(fc.SETTINGS, max_examples=fc.examples(80))
@given(
    context=st.sampled_from(sorted(CONTEXTS)),
    kind=st.sampled_from(["AgentConnectorPipeline", "ActionConnectorPipeline"]),
    members=MEMBERS,
)
def test_generated_pipelines_of_registered_connectors(
    files: Files, context: str, kind: str, members: list[dict[str, Any]]
) -> None:
    """Grammar-generated pipelines reach every connector's own checks with hostile params."""
    state = {
        "kind": kind,
        "version": 1,
        "members": [{"name": f"m{i}", **m} for i, m in enumerate(members)],
    }
    obj, arrays = encode_nest(state)
    files.target.write_bytes(pack(obj, arrays, PIPELINE_FILE))
    ctx = CONTEXTS[context]
    files.guards["load_pipeline"].run(
        lambda: rc.load_pipeline(files.target, ctx), (context, state), "generated"
    )


# -- canaries --------------------------------------------------------------------------------
def member(name: str, params: Any = None) -> dict[str, Any]:
    return {"name": "m", "connector": name, "params": {} if params is None else params}


def pipeline_file(*members: Any, kind: str = "AgentConnectorPipeline", arrays=None) -> bytes:
    obj = {"kind": kind, "version": 1, "members": list(members)}
    return pack(obj, arrays or {}, PIPELINE_FILE)


def canaries(marker: Path, scratch: Path) -> dict[str, bytes]:
    """Hostile files whose loading would create ``marker`` if anything ran them."""
    payload = fc.pickle_canary(marker)
    evil_tensor = {"arr_0": np.frombuffer(payload, np.uint8).copy()}
    npz = scratch / "evil.npz"
    np.savez(npz, w=np.array([fc.Exploit(marker)], dtype=object))
    pt = scratch / "evil.pt"
    torch.save({"w": fc.Exploit(marker)}, pt)
    cases = {
        "pickle file": payload,
        "torch .pt file with a payload": pt.read_bytes(),
        "npz with an object array": npz.read_bytes(),
        "pickle bytes as statistics": pipeline_file(
            member("MeanStdFilter", {"__state__": {"mean": {"__array__": "arr_0"}}}),
            arrays=evil_tensor,
        ),
        "pickle bytes in a tensor of dtype O": fc.join_container(
            {
                "__metadata__": fc.split_container(pipeline_file())[0]["__metadata__"],
                "arr_0": {"dtype": "O", "shape": [len(payload)], "data_offsets": [0, len(payload)]},
            },
            payload,
        ),
        "msgpack-numpy object marker as params": pipeline_file(
            member("ClipReward", {"limit": {"nd": True, "kind": "O", "data": list(payload)}})
        ),
        "pipeline kind names code": pipeline_file(kind="os.system"),
        "lambda names code": pipeline_file(member("AgentLambda", {"fn": "os:system"})),
    }
    for name in fc.CODE_NAMES:
        cases[f"connector {name!r}"] = pipeline_file(member(name))
    return cases


def test_canaries_are_rejected_and_never_run(files: Files) -> None:
    marker = files.marker_dir / "PWNED"
    cases = canaries(marker, files.root)
    outcomes = {what: files.check(data, what, "canary") for what, data in cases.items()}
    for what, got in outcomes.items():  # statistics and descriptions may show the bytes
        assert got[0] != "accepted", f"load_pipeline accepted {what}"
    assert outcomes["connector 'os:system'"][0] == "UnknownConnectorError"
    assert not marker.exists()


def test_negative_control_the_canaries_do_run_code(tmp_path: Path) -> None:
    """The payloads above are live: unpickling, or torch.load without weights_only, runs them."""
    marker = tmp_path / "PWNED"
    pickle.loads(fc.pickle_canary(marker))
    assert marker.exists()
    marker.unlink()
    pt = tmp_path / "evil.pt"
    torch.save({"w": fc.Exploit(marker)}, pt)
    torch.load(pt, weights_only=False)
    assert marker.exists()


def test_the_structure_mutator_keeps_the_checksum_valid(files: Files) -> None:
    """Positive control: an unedited re-pack loads, so edited files reach the deep checks."""
    obj, arrays = structure_of(files.valid["agent"])
    files.target.write_bytes(fc.pack_text(fc.json_text(obj), arrays, PIPELINE_FILE.name, 1))
    pipe = rc.load_pipeline(files.target, files.ctx)
    assert pipe.names == rc.load_pipeline(files.agent, files.ctx).names


# -- regressions: library bugs this suite found -------------------------------------------------
def test_regression_unhashable_dtype_or_kind_is_a_checkpoint_error(files: Files) -> None:
    """A tensor dtype or a pipeline kind given as a JSON list / object raised TypeError."""
    header, body = fc.split_container(files.valid["agent"])
    key = next(k for k in header if k != "__metadata__")
    header[key]["dtype"] = []
    files.target.write_bytes(fc.join_container(header, body))
    with pytest.raises(rc.CheckpointError, match="malformed entry or unsupported dtype"):
        rc.load_pipeline(files.target, files.ctx)
    files.target.write_bytes(pipeline_file(kind={"a": 1}))
    with pytest.raises(rc.CheckpointError, match="unknown pipeline kind"):
        rc.load_pipeline(files.target, files.ctx)


@pytest.mark.parametrize(
    ("context", "name", "params", "match"),
    [  # before the fix: 1.6 GB allocated; the process OOM-killed; 858 MB; a 1 GB matrix
        ("vector", "FrameStack", {"num_frames": 10**7}, "more than the limit"),
        ("vector", "FrameStack", {"num_frames": 2**31}, "more than the limit"),
        ("image", "Resize", {"height": 10**4, "width": 10**4}, "hold more than"),
        ("image", "Resize", {"height": 2**24, "width": 1}, r"must be an int in \[1, 16384\]"),
    ],
)
def test_regression_declared_output_sizes_are_checked_before_allocating(
    files: Files, context: str, name: str, params: dict[str, int], match: str
) -> None:
    ctx = CONTEXTS[context]
    files.target.write_bytes(pipeline_file(member(name, params)))
    guard = fc.Guard("pipeline:declared_sizes", ALLOWED, files.marker_dir)

    def load() -> Any:
        return rc.load_pipeline(files.target, ctx)

    assert guard.run(load, params, "declared_size") == "CheckpointError"
    assert guard.last_peak < 1 << 20  # checked before the Box allocates its bounds
    with pytest.raises(rc.CheckpointError, match=match):
        rc.load_pipeline(files.target, ctx)
    small = {"num_frames": 4} if name == "FrameStack" else {"height": 4, "width": 5}
    files.target.write_bytes(pipeline_file(member(name, small)))  # positive control
    want = (4, 4) if name == "FrameStack" else (4, 5, 3)
    assert rc.load_pipeline(files.target, ctx).output_space.shape == want
