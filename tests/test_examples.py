"""Every example in ``examples/`` runs in its ``--smoke`` mode and prints what it shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from machine_speed import scaled

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: example -> lines (substrings) its smoke run must print
EXPECTED = {
    "ppo_cartpole.py": [
        "PPO on CartPole-v1: 8 sub-envs x 128 steps per batch",
        "iter    2  env_steps    2048",
        "smoke run done: 2048 env steps",
        "restored AgentConnectorPipeline(MeanStdFilter) from checkpoint: filter mean",
        "restored LearnerConnectorPipeline(GAE -> NormalizeAdvantages)",
        "OK: the checkpoint (weights and filter statistics) reproduces the evaluation",
    ],
    "ppo_recurrent.py": [
        "PPO with LSTMPolicy on CartPole-v1 without velocities, seed 0",
        "iter    2  env_steps    1024",
        "restored AgentConnectorPipeline(HideVelocities -> MeanStdFilter -> ClipReward -> "
        "StateBuffer) and a LSTMPolicy from checkpoint",
        "OK: the checkpoint (policy, connectors, filter statistics) reproduces the evaluation",
    ],
    "pendulum_unsquash.py": [
        "action pipeline: ActionConnectorPipeline(ConvertToNumpy -> UnsquashActions)",
        "OK: every env action lies in [-2, 2] and equals unsquash(clip(action, -1, 1))",
        "action pipeline: ActionConnectorPipeline(ConvertToNumpy -> ClipActions)",
        "OK: env actions are the policy outputs clipped into [-2, 2]",
    ],
    "multi_agent.py": [
        "worker_policy: agent pipeline AgentConnectorPipeline(FlattenObservations)",
        "MultiAgentBatch(env_steps=24, agent_steps=32",
        "first episode, agent_index 2: t = [5, 7, 9, 11]",
        "(scout, scout_policy):",
        "(worker_0, worker_policy):",
        "(worker_1, worker_policy):",
        "OK: per-policy batches chain per agent; metrics keyed by (agent, policy)",
    ],
    "deploy.py": [
        "exported default_policy: policy file",
        "deployed: DeployedPolicy('default_policy', MLPPolicy",
        "ONNX in a fresh process (no torch) returns: [",
        "OK: the same returns from the runner, the policy file and the ONNX model",
    ],
    "custom_connector.py": [
        "AgentConnectorPipeline(MeanStdFilter -> RewardStdScale): passed output_in_space",
        "reloaded: AgentConnectorPipeline(MeanStdFilter -> RewardStdScale)",
        "OK: a fresh process gives identical outputs after load_pipeline",
        "UnknownConnectorError: no connector registered as 'RewardStdScale'",
        "OK: without the registration, loading fails with UnknownConnectorError",
    ],
    "torchrl_ppo.py": [
        "TorchRL PPO on CartPole-v1: 8 sub-envs x 64 rows per batch",
        "to_tensordict: batch_size=[8, 64], next reward [8, 64, 1]",
        "iter    2  env_steps    1024",
        "done: 1024 env steps through TorchRL's GAE and ClipPPOLoss",
    ],
    "ppo_tensor.py": [
        "PPO on BatchedCartPole: 512 sub-envs x 16 steps per batch",
        "iter    2  env_steps    16384",
        "done: 16,384 env steps",
    ],
    "sb3_dqn.py": [
        "SB3 DQN on CartPole-v1: 4 sub-envs x 128 steps per batch",
        "iter    2  buffer   1024",
        "OK: SB3's DQN trained on rows rlconnect put in its ReplayBuffer",
    ],
}


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_smoke(name: str, tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--smoke"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=tmp_path,  # examples must not depend on (or litter) the working directory
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    for line in EXPECTED[name]:
        assert line in done.stdout, f"{name} did not print {line!r}:\n{done.stdout}"


def test_ppo_cartpole_takes_another_env(tmp_path: Path) -> None:
    """``--env``: the same PPO on another gymnasium id (issue 55)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "ppo_cartpole.py"), "--smoke", "--env", "Acrobot-v1"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "PPO on Acrobot-v1: 8 sub-envs x 128 steps per batch" in done.stdout
    assert "OK: the checkpoint (weights and filter statistics) reproduces" in done.stdout


def _train_seed_0(example: str, cwd: Path, seed: int = 0) -> subprocess.CompletedProcess[str]:
    """Run a training example on ``seed`` with one math thread; it must exit 0."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example), "--seed", str(seed)],
        capture_output=True,
        text=True,
        timeout=scaled(480),
        cwd=cwd,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow
def test_ppo_cartpole_solves_seed_2(tmp_path: Path) -> None:
    """The example's claim: a seed reaches a mean return of 475 over the last 100 episodes
    (seed 2: 100k-105k env steps on the machines measured; about 30 s of CPU, minutes of
    wall time on a loaded 2-core machine). Seed 0 solved in 184k steps with one build of
    the dependencies and not within the 300k budget with another (the same steps with
    the code before and after this test changed): the env steps of a seed are a machine's
    and its packages', so the test trains the seed that solves on both."""
    done = _train_seed_0("ppo_cartpole.py", tmp_path, seed=2)
    solved = [line for line in done.stdout.splitlines() if line.startswith("solved:")]
    assert solved, done.stdout
    mean_return = float(solved[0].split("mean return ")[1].split()[0])
    assert mean_return >= 475.0
    assert "OK: the checkpoint (weights and filter statistics) reproduces" in done.stdout


@pytest.mark.slow
def test_ppo_recurrent_solves_seed_0(tmp_path: Path) -> None:
    """The example's claim: with an LSTM, seed 0 reaches a mean return of 475 over the last
    20 episodes of CartPole without velocities (63k-69k env steps over seeds 0-2 on one
    machine, other counts elsewhere; about 40 s of CPU)."""
    done = _train_seed_0("ppo_recurrent.py", tmp_path)
    solved = [line for line in done.stdout.splitlines() if line.startswith("mean return ")]
    assert solved, done.stdout
    assert float(solved[0].split()[2]) >= 475.0
    assert "OK: the checkpoint (policy, connectors, filter statistics) reproduces" in done.stdout


#: a fresh process in examples/ that imports the example (registering its connectors; "-":
#: nothing to import) and plays one episode with both exported forms
_PLAY = """
import importlib, json, sys
import gymnasium as gym, numpy as np, onnxruntime as ort
import rlconnect as rc
if sys.argv[1] != "-":
    importlib.import_module(sys.argv[1])
out = sys.argv[2]
policy = rc.load_policy(out + ".policy")
session = ort.InferenceSession(out + ".onnx", providers=["CPUExecutionProvider"])
inputs = json.loads(session.get_modelmeta().custom_metadata_map["rlconnect"])["inputs"]
states = [np.asarray(i["initial"], i["dtype"])[None] for i in inputs[1:]]
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=5)
steps = mismatches = 0
done = False
while not done:
    feeds = dict(zip([i["name"] for i in inputs], [obs[None], *states]))
    onnx_action, *states = session.run(None, feeds)
    action = policy.compute_action(obs, session=0)
    mismatches += int(onnx_action[0]) != int(action)
    obs, _, terminated, truncated, _ = env.step(action)
    steps, done = steps + 1, terminated or truncated
print(json.dumps({"pipeline": policy.agent_pipeline.names, "steps": steps,
                  "mismatches": mismatches}))
"""


@pytest.mark.parametrize(
    ("example", "pipeline"),
    [
        ("ppo_cartpole", ["MeanStdFilter"]),
        ("ppo_recurrent", ["HideVelocities", "MeanStdFilter", "ClipReward", "StateBuffer"]),
    ],
)
def test_training_example_checkpoint_exports(
    example: str, pipeline: list[str], tmp_path: Path
) -> None:
    """``--checkpoint DIR`` keeps the run; ``rlconnect export`` exports it to a policy file
    and to ONNX, and both act alike over a whole episode. ``ppo_cartpole`` holds nothing
    custom (a built-in policy, built-in connectors): it exports and plays without importing
    the example; ``ppo_recurrent`` needs ``--import`` for its ``HideVelocities``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    trained = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{example}.py"), "--smoke", "--checkpoint", "ckpt"],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert trained.returncode == 0, f"{trained.stdout}\n{trained.stderr}"
    assert (tmp_path / "ckpt" / "manifest.json").is_file()
    out = tmp_path / "p"
    custom = example != "ppo_cartpole"
    export = [sys.executable, "-m", "rlconnect", "export", str(tmp_path / "ckpt")]
    export += ["--import", example] if custom else []
    export += ["--out", f"{out}.policy", "--onnx", f"{out}.onnx"]
    where = EXAMPLES if custom else tmp_path  # (the example itself is importable or not)
    exported = subprocess.run(
        export, capture_output=True, text=True, timeout=scaled(120), cwd=where, env=env, check=False
    )
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout.count("wrote ") == 2
    played = subprocess.run(
        [sys.executable, "-c", _PLAY, example if custom else "-", str(out)],
        capture_output=True,
        text=True,
        timeout=scaled(120),
        cwd=where,
        env=env,
        check=False,
    )
    assert played.returncode == 0, played.stderr
    result = json.loads(played.stdout.splitlines()[-1])
    assert result["pipeline"] == pipeline
    assert result["steps"] >= 8 and result["mismatches"] == 0


def test_the_recurrent_figures_in_the_docs_are_the_examples() -> None:
    """docs/recurrent.md shows the env steps and CPU seconds of the example's own table."""
    import re

    table = re.findall(
        r"^(\d)\s+([\d,]+)\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)$",
        (EXAMPLES / "ppo_recurrent.py").read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    assert [seed for seed, _, _ in table] == ["0", "1", "2"]
    page = (EXAMPLES.parent / "docs" / "recurrent.md").read_text(encoding="utf-8")

    def row(label: str) -> list[str]:
        line = next(x for x in page.splitlines() if x.startswith(f"| {label}"))
        return [cell.strip() for cell in line.strip("|").split("|")[1:]]

    assert row("env steps to a mean return") == [steps for _, steps, _ in table]
    assert row("whole process, user CPU seconds") == [cpu for _, _, cpu in table]
