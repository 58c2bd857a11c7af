"""Deploy a trained CartPole policy: one policy file, one ONNX model, the same returns.

What it shows:

- ``rc.export_policy`` writes ONE file from a runner checkpoint: the policy's kind, config
  and weights, its agent pipeline with the ``MeanStdFilter`` statistics learned in training
  (frozen), its action pipeline and the env's spaces; ``rc.load_policy`` acts from it in a
  process with no env and no runner.
- ``rc.export_onnx`` writes one ONNX model from the raw observation to the env action,
  the filter baked in; its interface (inputs, outputs, states) is JSON in its metadata.
- A fresh process that imports only numpy, onnxruntime and gymnasium (for the env; no
  rlconnect, no torch) plays the same evaluation episodes and gets the same returns as
  ``runner.evaluate``: evaluation sub-env 0 is seeded ``seed + 10_000`` at its first reset.

Give it the checkpoint the PPO example keeps (``python examples/ppo_cartpole.py
--checkpoint DIR``, then ``python examples/deploy.py --checkpoint DIR``); without one it
makes a short run (an untrained MLP policy, filter statistics from two batches). Nothing is
trained here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_ID = "CartPole-v1"
EVAL_SEED_OFFSET = 10_000  # rlconnect.runner.evaluation.EVAL_SEED_OFFSET


def play_onnx(model_path: str, seed: int, episodes: int) -> list[float]:
    """Whole episodes with the ONNX model: numpy, onnxruntime and the env, nothing else."""
    import gymnasium as gym
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map["rlconnect"]
    inputs = json.loads(meta)["inputs"]
    env = gym.make(ENV_ID)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        states = [np.asarray(i["initial"], i["dtype"])[None] for i in inputs[1:]]
        total, done = 0.0, False
        while not done:
            feeds = dict(zip([i["name"] for i in inputs], [obs[None], *states]))
            action, *states = session.run(None, feeds)
            obs, reward, terminated, truncated, _ = env.step(int(action[0]))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    assert "torch" not in sys.modules and "rlconnect" not in sys.modules
    return returns


def play_deployed(policy_path: Path, seed: int, episodes: int) -> list[float]:
    """The same episodes with ``rc.load_policy`` (one session per episode)."""
    import gymnasium as gym

    import rlconnect as rc

    policy = rc.load_policy(policy_path)
    env = gym.make(ENV_ID)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        total, done = 0.0, False
        while not done:
            action = policy.compute_action(obs, session=episode)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        policy.end_session(episode)
        returns.append(total)
    return returns


def short_run(folder: Path) -> Path:
    """A runner checkpoint without training: filter statistics from two batches."""
    import gymnasium as gym

    import rlconnect as rc

    env = gym.make(ENV_ID)
    policy = rc.MLPPolicy(env.observation_space, env.action_space, seed=0)
    config = rc.RunnerConfig(num_envs=2, seed=0, observation_filter="MeanStdFilter")
    runner = rc.EnvRunner(ENV_ID, policy, config=config)
    runner.sample()
    runner.sample()
    runner.save_checkpoint(folder / "checkpoint")
    runner.stop()
    return folder / "checkpoint"


def deploy(checkpoint: Path, out: Path, episodes: int) -> None:
    import rlconnect as rc

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ppo_cartpole  # noqa: F401  (registers the PPO example's policy kind)

    policy_path, model_path = out / "cartpole.policy", out / "cartpole.onnx"
    rc.export_policy(checkpoint, policy_path)
    rc.export_onnx(checkpoint, model_path)
    print(
        f"exported default_policy: policy file {policy_path.stat().st_size:,} bytes, "
        f"ONNX model {model_path.stat().st_size:,} bytes"
    )
    print(f"deployed: {rc.load_policy(policy_path)}")
    runner = rc.EnvRunner.from_checkpoint(
        checkpoint, env=ENV_ID, config_overrides={"num_envs": 1, "num_env_workers": 0}
    )
    seed = runner.config.seed or 0
    evaluated = [r["episode_reward"] for r in runner.evaluate(episodes)]
    runner.stop()
    deployed = play_deployed(policy_path, seed + EVAL_SEED_OFFSET, episodes)
    play = ["--play", str(model_path), str(seed + EVAL_SEED_OFFSET), str(episodes)]
    child = subprocess.run(
        [sys.executable, __file__, *play],
        capture_output=True,
        text=True,
        check=True,
    )
    onnx_returns = json.loads(child.stdout)
    print(f"runner.evaluate returns:                    {evaluated}")
    print(f"rc.load_policy returns:                     {deployed}")
    print(f"ONNX in a fresh process (no torch) returns: {onnx_returns}")
    if not evaluated == deployed == onnx_returns:
        raise SystemExit("the deployed forms do not reproduce runner.evaluate")
    print("OK: the same returns from the runner, the policy file and the ONNX model")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a runner checkpoint (the PPO example's)")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a short run, three episodes")
    parser.add_argument("--play", nargs=3, metavar=("MODEL", "SEED", "EPISODES"), help="internal")
    args = parser.parse_args()
    if args.play:
        model, seed, episodes = args.play
        print(json.dumps(play_onnx(model, int(seed), int(episodes))))
        return
    episodes = 3 if args.smoke else args.episodes
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or short_run(Path(tmp))
        deploy(checkpoint, Path(tmp), episodes)


if __name__ == "__main__":
    main()
