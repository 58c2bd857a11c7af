"""``rlconnect export`` and ``rlconnect inspect`` on exported files."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rlconnect as rc
from rlconnect.cli import main


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    args = ["sample", "--steps", "400", "--num-envs", "2", "--fragment", "50", "--quiet"]
    args += ["--observation-filter", "MeanStdFilter", "--seed", "0", "--out", str(out)]
    assert main(args) == 0
    return out


def test_export_writes_both_forms_and_inspect_reads_them(run_folder, tmp_path, capsys):
    capsys.readouterr()
    policy, model = tmp_path / "cartpole.policy", tmp_path / "cartpole.onnx"
    assert main(["export", str(run_folder), "--out", str(policy), "--onnx", str(model)]) == 0
    out = capsys.readouterr().out
    assert "cartpole.policy" in out and "cartpole.onnx" in out
    deployed = rc.load_policy(policy)
    runner = rc.EnvRunner.from_checkpoint(run_folder / "checkpoint", env="CartPole-v1")
    obs = np.random.default_rng(0).normal(0, 0.3, (50, 4)).astype(np.float32)
    assert deployed.compute_actions(obs) == [runner.compute_single_action(o) for o in obs]

    assert main(["inspect", str(policy), "--json"]) == 0
    desc = json.loads(capsys.readouterr().out)["policy"]
    assert desc["policy_id"] == "default_policy" and desc["policy"]["kind"] == "MLPPolicy"
    assert [m["name"] for m in desc["agent_pipeline"]] == ["MeanStdFilter"]
    assert len(desc["sha256"]) == 64 and desc["size_bytes"] == policy.stat().st_size
    assert desc["agent_pipeline"][0]["update"] == "frozen"  # a loaded policy never updates
    weights = desc["policy"]["weights"]
    assert weights["arrays"] == 6 and weights["bytes"] == 4 * weights["values"] > 4000
    assert desc["observation_space"].startswith("Box(")
    assert main(["inspect", str(model)]) == 0
    text = capsys.readouterr().out
    assert "inputs" in text and "actions" in text and "MeanStdFilter" in text
    assert main(["inspect", str(tmp_path), "--json"]) == 0  # a folder of exported files
    assert set(json.loads(capsys.readouterr().out)) == {"cartpole.policy", "cartpole.onnx"}


def test_usage_errors_exit_2_with_one_line(run_folder, tmp_path, capsys):
    capsys.readouterr()
    cases = [
        (["export", str(tmp_path), "--out", str(tmp_path / "p")], "neither a runner checkpoint"),
        (["export", str(run_folder), "--out", str(tmp_path / "p"), "--policy", "nope"], "nope"),
        (["export", str(run_folder), "--out", str(tmp_path / "no" / "p")], "does not exist"),
    ]
    for args, words in cases:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    assert main(["export", str(run_folder), "--out", str(tmp_path / "p"), "--policy", "x"]) == 2
    assert "['default_policy']" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_inspect_a_damaged_policy_file_fails_with_one_line(run_folder, tmp_path, capsys):
    policy = tmp_path / "p"
    assert main(["export", str(run_folder), "--out", str(policy)]) == 0
    data = bytearray(policy.read_bytes())
    data[-3] ^= 0xFF
    policy.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["inspect", str(policy)]) == 1
    assert "digest mismatch" in capsys.readouterr().err


def _texts(value):
    """Every string in a JSON value."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)
    elif isinstance(value, str):
        yield value


def test_inspect_json_gives_numbers_as_numbers(run_folder, tmp_path, capsys):
    """Sizes and counts are JSON numbers, never text like "20,344 bytes"."""
    import re

    policy = tmp_path / "p.policy"
    assert main(["export", str(run_folder), "--out", str(policy)]) == 0
    for path in (run_folder, policy):
        capsys.readouterr()
        assert main(["inspect", str(path), "--json"]) == 0
        desc = json.loads(capsys.readouterr().out)
        texts = [t for t in _texts(desc) if re.search(r"\d,\d{3}|\d bytes|\d values", t)]
        assert texts == [], texts
    files = json.loads(_inspect_json(run_folder, capsys))["checkpoint"]["files"]
    weights = next(v for k, v in files.items() if k.endswith("weights.safetensors"))
    assert isinstance(weights["values"], int) and isinstance(weights["arrays"], int), files


def _inspect_json(path, capsys) -> str:
    capsys.readouterr()
    assert main(["inspect", str(path), "--json"]) == 0
    return capsys.readouterr().out


def _dict_checkpoint(tmp_path, *agent_members):
    """A checkpoint of a runner on a Dict-observation env (its FlattenObservations
    flattens the observations), with ``agent_members`` (each ``ctx -> connector``) after it."""
    import gymnasium as gym

    space = gym.spaces.Dict(
        {"mode": gym.spaces.Discrete(3), "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
    )

    class DictEnv(gym.Env):
        observation_space = space
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 1.0, False, False, {}

    def agent_pipeline(ctx):
        first = rc.FlattenObservations(ctx)
        return rc.AgentConnectorPipeline(ctx, [first, *(m(ctx) for m in agent_members)])

    policy = rc.MLPPolicy(gym.spaces.Box(-1.0, 1.0, (5,), np.float32), DictEnv.action_space)
    runner = rc.EnvRunner(
        lambda ctx: gym.wrappers.TimeLimit(DictEnv(), 5),
        policy,
        config=rc.RunnerConfig(rollout_fragment_length=5, seed=0),
        agent_pipelines={"default_policy": agent_pipeline},
    )
    runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    return tmp_path / "ck"


rc.register_lambda("halve_for_cli_test", lambda x: x / 2)


def _halve(ctx):
    """An AgentLambda member (a Python function: no ONNX form)."""
    return rc.AgentLambda(ctx, fn="halve_for_cli_test", column="obs")


def test_a_dict_observation_exports_to_onnx_with_one_input_per_key(tmp_path, capsys):
    checkpoint = _dict_checkpoint(tmp_path)
    policy, model = tmp_path / "d.policy", tmp_path / "d.onnx"
    assert main(["export", str(checkpoint), "--out", str(policy), "--onnx", str(model)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(model), "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["onnx"]["inputs"]
    assert [(i["name"], i["path"]) for i in inputs] == [
        ("obs.mode", ["mode"]),
        ("obs.pos", ["pos"]),
    ]


def test_a_failed_onnx_export_leaves_neither_file(tmp_path, capsys):
    """Before: ``--onnx`` refusing a member without an ONNX form left the ``.policy``
    written."""
    checkpoint = _dict_checkpoint(tmp_path, _halve)
    policy, model = tmp_path / "d.policy", tmp_path / "d.onnx"
    assert main(["export", str(checkpoint), "--out", str(policy), "--onnx", str(model)]) != 0
    err = capsys.readouterr().err
    assert "ExportError" in err and "has no ONNX form" in err and "rc.export_policy" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # nothing written, no temp
    policy.write_bytes(b"an older export")  # a file there before is left as it was
    assert main(["export", str(checkpoint), "--out", str(policy), "--onnx", str(model)]) != 0
    assert policy.read_bytes() == b"an older export" and not model.exists()
    assert main(["export", str(checkpoint), "--out", str(policy)]) == 0  # the policy alone
    deployed = rc.load_policy(policy)
    assert deployed.compute_action({"mode": 1, "pos": np.zeros(2, np.float32)}) in (0, 1)
