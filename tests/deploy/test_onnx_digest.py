"""An exported ONNX model carries a digest over its graph, weights and interface, checked by
``rlconnect inspect`` (a fresh process, as a user runs it); docs/deploying.md's onnxruntime
loop runs as written in a process where onnx, torch and rlconnect cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import onnx
import pytest
from tests.cli.conftest import run_cli, user_env
from tests.test_docs import python_blocks

import rlconnect as rc
from rlconnect.deploy.onnx_file import DIGEST_KEY, METADATA_KEY, model_digest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=20, seed=0)
    config.observation_filter = "MeanStdFilter"
    runner = rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space, seed=0), config=config
    )
    runner.sample()
    path = tmp_path_factory.mktemp("onnx") / "cartpole.onnx"
    rc.export_onnx(runner, path)
    runner.stop()
    return path


def test_the_digest_covers_graph_weights_and_interface(model_path: Path) -> None:
    model = onnx.load(str(model_path))
    interface = json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])
    digest = interface[DIGEST_KEY]
    assert model_digest(model, interface) == digest and len(digest) == 64
    weights = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    weights.raw_data = bytes([weights.raw_data[0] ^ 1]) + weights.raw_data[1:]
    assert model_digest(model, interface) != digest
    model = onnx.load(str(model_path))
    interface["inputs"][0]["dtype"] = "float64"
    assert model_digest(model, interface) != digest


def _weight_offset(data: bytes) -> int:
    """Where the largest weight tensor's bytes lie in the file."""
    model = onnx.load_from_string(data)
    raw = max(model.graph.initializer, key=lambda t: len(t.raw_data)).raw_data
    assert len(raw) > 1000 and data.count(raw) == 1
    return data.index(raw)


def test_inspect_checks_the_digest(model_path: Path, tmp_path: Path) -> None:
    done = run_cli("inspect", str(model_path), "--json")
    assert done.returncode == 0, done.stderr
    desc = json.loads(done.stdout)["onnx"]
    assert desc["model_digest"].startswith("ok") and isinstance(desc["size_bytes"], int)

    data = bytearray(model_path.read_bytes())
    data[_weight_offset(bytes(data)) + 100] ^= 0x01  # one bit of one weight
    changed = tmp_path / "changed.onnx"
    changed.write_bytes(data)
    done = run_cli("inspect", str(changed))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert f"cannot load ONNX model {str(changed)!r}: digest mismatch" in done.stderr

    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model_path.read_bytes()[: len(data) // 2])
    done = run_cli("inspect", str(truncated))
    assert done.returncode == 1 and "truncated" in done.stderr, done.stderr


#: refuses onnx, torch and rlconnect (and any of their submodules) in this process
BLOCKER = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("onnx", "torch", "rlconnect"):
            raise ImportError(f"the deployment loop imported {name}")
        return None

sys.meta_path.insert(0, Blocked())
model_path = sys.argv[1]
"""


def test_the_docs_onnxruntime_loop_runs_as_written_without_onnx_torch_rlconnect(
    model_path: Path,
) -> None:
    page = (DOCS / "deploying.md").read_text(encoding="utf-8")
    loops = [code for _, code in python_blocks(page) if "custom_metadata_map" in code]
    assert len(loops) == 1
    check = '\nassert not {"onnx", "torch", "rlconnect"} & set(sys.modules)\nprint("clean")\n'
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + loops[0] + check, str(model_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=user_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["episode 0", "episode 1", "episode 2"]
    assert lines[-1] == "clean"


@pytest.mark.parametrize(
    "edit",
    [
        {"inputs": 5},
        {"inputs": [7]},
        {"outputs": [{"name": "actions", "shape": 3, "dtype": "int64"}]},
        {"observation_space": "Box"},
    ],
    ids=["inputs-int", "entry-int", "shape-int", "space-str"],
)
def test_inspect_of_a_malformed_interface_with_a_valid_digest_is_one_named_error(
    model_path: Path, tmp_path: Path, edit: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """The digest can be recomputed by anyone, so a well-signed interface of the wrong
    shape must still end in a named error (issue 55, item 14), not a bare TypeError."""
    from rlconnect.cli import main

    model = onnx.load(str(model_path))
    interface = json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])
    interface.update(edit)
    interface[DIGEST_KEY] = model_digest(model, interface)
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            p.value = json.dumps(interface)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "cannot load ONNX model" in err and "interface is malformed" in err, err
