"""A damaged, altered or hostile policy file gets a named error and builds nothing."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import safetensors.numpy

import rlconnect as rc
from rlconnect.checkpoints import POLICY_FILE
from rlconnect.checkpoints.container import _digest


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    env = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(env.observation_space, env.action_space, seed=0, hiddens=(8,))
    config = rc.RunnerConfig(num_envs=1, seed=0, observation_filter="MeanStdFilter")
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    path = tmp_path_factory.mktemp("valid") / "p"
    rc.export_policy(runner, path)
    return path.read_bytes()


def repack(data: bytes, edit) -> bytes:
    """The file with its JSON structure edited and a valid digest (the checks behind it)."""
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    structure = json.loads(meta["structure"])
    edit(structure)
    text = json.dumps(structure)
    arrays = safetensors.numpy.load(data)
    metadata = {**meta, "structure": text, "sha256": _digest(POLICY_FILE.name, 1, text, arrays)}
    return safetensors.numpy.save(arrays, metadata=metadata)


def load(tmp_path, data: bytes) -> rc.DeployedPolicy:
    (tmp_path / "p").write_bytes(data)
    return rc.load_policy(tmp_path / "p")


def test_the_valid_file_loads(valid, tmp_path):
    assert load(tmp_path, valid).compute_action(np.zeros(4, np.float32)) in (0, 1)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "digest mismatch"),
        (lambda d: d[:-10], r"truncated: [\d,]+ of its [\d,]+ bytes are there"),
        (lambda d: d[:12], r"not a complete rlconnect file \(truncated"),
        (lambda d: d + b"\0", "bytes appended: 1 more than it should hold"),
        (lambda d: b"", "empty"),
        (lambda d: d[:100] + b"x" + d[101:], "not valid JSON|digest mismatch|structure"),
    ],
)
def test_changed_missing_or_appended_bytes(valid, tmp_path, change, words):
    with pytest.raises(rc.CheckpointError, match=words):
        load(tmp_path, change(valid))


def test_a_huge_declared_array_allocates_nothing(valid, tmp_path):
    n = int.from_bytes(valid[:8], "little")
    header = json.loads(valid[8 : 8 + n])
    key = next(k for k in header if k != "__metadata__")
    header[key]["shape"] = [10**12]
    text = json.dumps(header).encode()
    with pytest.raises(rc.CheckpointError):
        load(tmp_path, len(text).to_bytes(8, "little") + text + valid[8 + n :])


def test_an_unregistered_kind_names_the_kind_and_the_registered_ones(valid, tmp_path):
    data = repack(valid, lambda s: s["policy"].__setitem__("kind", "EvilPolicy"))
    with pytest.raises(rc.UnknownPolicyError, match=r"'EvilPolicy'.*MLPPolicy") as info:
        load(tmp_path, data)
    assert isinstance(info.value, KeyError)


def test_an_unregistered_connector(valid, tmp_path):
    def rename(s):
        s["agent_pipeline"]["members"][0]["connector"] = "os:system"

    with pytest.raises(rc.UnknownConnectorError, match="os:system"):
        load(tmp_path, repack(valid, rename))


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda s: s.pop("policy"), "never referenced"),
        (lambda s: s["policy"].__setitem__("kind", 5), "'kind' must be a str"),
        (lambda s: s["policy"]["config"].__setitem__("hiddens", [9]), "cannot rebuild"),
        (lambda s: s.__setitem__("observation_space", {"type": "Nope"}), "observation_space"),
        (
            lambda s: s["agent_pipeline"].__setitem__("kind", "ActionConnectorPipeline"),
            "valid pipeline",
        ),
        (lambda s: s["agent_pipeline"]["members"][0]["params"].__setitem__("clip", -1), "clip"),
        (lambda s: s.__setitem__("policy_id", ["x"]), "'policy_id' must be a str"),
    ],
)
def test_structures_that_do_not_fit(valid, tmp_path, edit, words):
    with pytest.raises(rc.CheckpointError, match=words):
        load(tmp_path, repack(valid, edit))


def test_another_rlconnect_file_is_not_a_policy_file(tmp_path):
    ctx = rc.ConnectorContext(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2))
    rc.save_pipeline(rc.AgentConnectorPipeline(ctx, []), tmp_path / "pipe")
    with pytest.raises(rc.CheckpointError, match=r"expected 'rlconnect\.policy'"):
        rc.load_policy(tmp_path / "pipe")
    with pytest.raises(FileNotFoundError):
        rc.load_policy(tmp_path / "missing")
