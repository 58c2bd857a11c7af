"""Hostile exported policy files and observations: ``rc.load_policy``,
``read_policy_file``, ``describe_policy_file`` and ``rlconnect inspect`` raise only
documented errors, run no code, import nothing and stay within the memory bound; a loaded
policy answers hostile observations with ``EnvCheckError`` and keeps its sessions intact.

Each hypothesis example mutates a valid policy file (its bytes, its tensor table, or its
JSON structure re-packed with a valid checksum so the deeper checks are reached) and loads
it every way the library offers. ``tests/deploy/`` holds the hand-written cases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_common as fc
import gymnasium as gym
import numpy as np
import numpy.ma  # (np.unique imports it lazily; a session's later call uses it)
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

import rlconnect as rc
from rlconnect.checkpoints import POLICY_FILE
from rlconnect.cli.describe import describe_path, render
from rlconnect.cli.errors import UsageError
from rlconnect.deploy.policy_file import describe_policy_file, read_policy_file

pytestmark = pytest.mark.reliability

ALLOWED = (rc.CheckpointError, rc.UnknownConnectorError, rc.UnknownPolicyError)
LOADERS = ["load_policy", "read_policy_file", "describe_policy_file", "inspect"]


class Files:
    """A valid policy file (MLP, MeanStdFilter, FrameStack), the canary folder, the guards."""

    def __init__(self, root: Path) -> None:
        self.marker_dir = root / "canary"
        self.marker_dir.mkdir()
        env = gym.make("Pendulum-v1")
        space = gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32)
        policy = rc.MLPPolicy(space, env.action_space, hiddens=(8,), seed=0)
        config = rc.RunnerConfig(
            rollout_fragment_length=8, seed=0, observation_filter="MeanStdFilter", framestack=2
        )
        runner = rc.EnvRunner("Pendulum-v1", policy, config=config)
        runner.sample()
        self.path, self.target = root / "valid.policy", root / "hostile"
        rc.export_policy(runner, self.path)
        self.valid = self.path.read_bytes()
        pipeline = root / "pipeline"
        rc.save_pipeline(runner.agent_pipeline(), pipeline)
        self.others = {"pipeline": pipeline.read_bytes(), "weights": safetensors.numpy.save({})}
        self.load_all(self.path)  # warm-up: what a good load imports
        self.deployed = rc.load_policy(self.path)
        for warm in (np.zeros(3), np.full(3, np.nan), "abc"):  # lazy imports
            try:
                self.deployed.compute_action(warm, session="warm-up", reward=0.5)
            except rc.EnvCheckError:
                np.testing.assert_array_equal(warm, warm)
        self.deployed.end_session("warm-up")
        self.obs_guard = fc.Guard("policy_file:observations", (rc.EnvCheckError,), self.marker_dir)
        self.guards = {
            n: fc.Guard(f"policy_file:{n}", (*ALLOWED, UsageError), self.marker_dir)
            for n in LOADERS
        }

    def load_all(self, path: Path) -> None:
        rc.load_policy(path).compute_action(np.zeros(3, np.float32))
        read_policy_file(path)
        describe_policy_file(path)
        render(describe_path(str(path)))

    def check(self, data: bytes, what: object, kind: str | None = None) -> list[str]:
        self.target.write_bytes(data)
        path = self.target
        loads = {
            "load_policy": lambda: rc.load_policy(path).compute_action(np.zeros(3, np.float32)),
            "read_policy_file": lambda: read_policy_file(path),
            "describe_policy_file": lambda: describe_policy_file(path),
            "inspect": lambda: json.dumps(render(describe_path(str(path))), default=str),
        }
        return [self.guards[n].run(loads[n], what, kind) for n in LOADERS]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Iterator[Files]:
    yield Files(tmp_path_factory.mktemp("hostile_policy_files"))
    fc.publish([*(f"policy_file:{n}" for n in LOADERS), "policy_file:observations"])


def structure_of(data: bytes) -> tuple[Any, dict[str, np.ndarray]]:
    header, _ = fc.split_container(data)
    return json.loads(header["__metadata__"]["structure"]), safetensors.numpy.load(data)


@settings(fc.SETTINGS, max_examples=fc.examples(40))
@given(data=st.data())
def test_mutated_bytes(files: Files, data: st.DataObject) -> None:
    mutation = data.draw(fc.byte_mutations(files.others))
    outcomes = files.check(mutation.apply(files.valid), mutation)
    if mutation.apply(files.valid) != files.valid:
        assert "accepted" not in outcomes[:2], mutation  # the digest catches every change


@settings(fc.SETTINGS, max_examples=fc.examples(30))
@given(mutation=fc.tensor_mutations())
def test_mutated_tensor_table(files: Files, mutation: fc.Mutation) -> None:
    files.check(mutation.apply(files.valid), mutation)


@settings(fc.SETTINGS, max_examples=fc.examples(60))
@given(edits=fc.json_edits())
def test_mutated_structure_with_valid_checksum(files: Files, edits: list) -> None:
    obj, arrays = structure_of(files.valid)
    text = fc.json_text(fc.apply_edits(obj, edits))
    files.check(fc.pack_text(text, arrays, POLICY_FILE.name, 1), edits, kind="json_edit")


HOSTILE_OBS = st.one_of(
    st.builds(
        lambda shape, fill, dtype: np.full(shape, fill).astype(dtype),
        st.sampled_from([(3,), (2,), (4,), (1, 3), (), (3, 1), (0,)]),
        st.sampled_from([0.0, np.nan, np.inf, -np.inf, 1e300, -1.0]),
        st.sampled_from(["float32", "float64", "int64", "uint8", "bool", "float16"]),
    ),
    st.sampled_from(["abc", None, {"a": 1}, [1, 2, 3], [[1.0, 2.0, 3.0]], (1.0, 2.0, 3.0)]),
    st.sampled_from([np.array(["a", "b", "c"]), np.array([object(), 1, 2], dtype=object)]),
)


@settings(fc.SETTINGS, max_examples=fc.examples(60))
@given(obs=HOSTILE_OBS, reward=st.sampled_from([None, 0.5, float("nan"), "x", [1.0, 2.0]]))
def test_hostile_observations_leave_the_session_intact(files: Files, obs: Any, reward: Any) -> None:
    """Only EnvCheckError (or an action for a fitting observation); a rejected call leaves
    the session's state as it was: its next good step equals a twin session's."""
    deployed, good = files.deployed, np.array([0.1, -0.2, 0.3], np.float32)
    for s in ("probe", "twin"):
        deployed.end_session(s)
        deployed.compute_action(good, session=s)
    outcome = files.obs_guard.run(
        lambda: deployed.compute_action(obs, session="probe", reward=reward), repr(obs)[:60]
    )
    if outcome != "accepted":
        a = deployed.compute_action(good * 2, session="probe")
        b = deployed.compute_action(good * 2, session="twin")
        np.testing.assert_array_equal(a, b)
