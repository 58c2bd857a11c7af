"""Atari sampling speed with the preset vs a hand-written gymnasium loop, and batch memory.

Timed (env steps per second, each env step = 4 emulator frames, random actions):

- ``rlconnect preset``: ``rc.EnvRunner(game, rc.RandomPolicy, RunnerConfig(preset="atari",
  num_envs=N))``: env-side frame skip / max-pool / no-op and FIRE resets, then the batched
  connectors Grayscale -> Resize(84, 84) -> ClipReward -> FrameStack(4), storing every
  transition in the runner's batches (``obs`` and ``new_obs``).
- ``gymnasium loop``: N envs ``AtariPreprocessing(frame_skip=4, screen_size=84,
  noop_max=30)`` + ``FrameStackObservation(4)``, stepped one after another in a Python
  loop, the reward's sign taken, observations kept in a list (the same work, by hand).

Memory: bytes per stored transition of the preset's batches (``SampleBatch.nbytes``,
``obs`` + ``new_obs`` + the small columns) without and with
``RunnerConfig(compress_observations=True)``, scaled to 1M transitions. One transition
holds two (4, 84, 84) uint8 stacks, 56,448 bytes, uncompressed.

    python benchmarks/bench_pixels.py            # full (~1-2 min)
    python benchmarks/bench_pixels.py --quick    # smoke run (~10 s)
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import rlconnect as rc
from rlconnect.envs.atari import FireReset, make_atari_env

STACKED = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def _policy(game: str) -> rc.RandomPolicy:
    env = make_atari_env(game)
    policy = rc.RandomPolicy(STACKED, env.action_space)
    env.close()
    return policy


def bench_preset(game: str, num_envs: int, steps: int, compress: bool = False) -> dict:
    """Env steps/s of the preset runner and bytes per stored transition."""
    config = rc.RunnerConfig(
        preset="atari",
        num_envs=num_envs,
        rollout_fragment_length=max(steps // num_envs // 4, 8),
        seed=0,
        compress_observations=compress,
    )
    with rc.EnvRunner(game, _policy(game), config=config) as runner:
        runner.sample()  # warm up: env resets, torch kernels
        rows = nbytes = 0
        start = time.perf_counter()
        while rows < steps:
            batch = runner.sample()
            rows += len(batch)
            nbytes += batch.nbytes
        elapsed = time.perf_counter() - start
    return {"steps_per_s": rows / elapsed, "bytes_per_transition": nbytes / rows}


def _reference_env(game: str) -> gym.Env:
    env = gym.make(game, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(FireReset(env), 4)


def bench_gymnasium(game: str, num_envs: int, steps: int) -> dict:
    """Env steps/s of the hand-written loop over gymnasium's own wrappers."""
    envs = [_reference_env(game) for _ in range(num_envs)]
    rng = np.random.default_rng(0)
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    n_actions = envs[0].action_space.n
    for _ in range(8):  # warm up like the preset
        for env in envs:
            env.step(0)
    kept: list[np.ndarray] = []
    done = 0
    start = time.perf_counter()
    while done < steps:
        actions = rng.integers(n_actions, size=num_envs)
        for i, env in enumerate(envs):
            new, reward, terminated, truncated, _ = env.step(int(actions[i]))
            kept.append(np.sign(reward))
            kept.append(obs[i])
            obs[i] = env.reset()[0] if terminated or truncated else new
        done += num_envs
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return {"steps_per_s": done / elapsed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small step counts (smoke test)")
    parser.add_argument("--game", default="ALE/Pong-v5")
    args = parser.parse_args(argv)
    steps = 128 if args.quick else 4000

    print(f"{args.game}, {steps} env steps per measurement (4 frames each), random actions")
    print(f"{'N':>3} {'rlconnect preset':>18} {'gymnasium loop':>16} {'ratio':>7}")
    for n in (1, 8):
        ours = bench_preset(args.game, n, steps)["steps_per_s"]
        ref = bench_gymnasium(args.game, n, steps)["steps_per_s"]
        print(f"{n:>3} {ours:>12.0f} st/s {ref:>10.0f} st/s {ours / ref:>6.2f}x")

    print("\nmemory of stored batches (preset, N=8): bytes per transition -> per 1M transitions")
    for compress in (False, True):
        per = bench_preset(args.game, 8, steps, compress=compress)["bytes_per_transition"]
        label = "compress_observations=True " if compress else "compress_observations=False"
        print(f"  {label}: {per:>9.0f} B -> {per * 1e6 / 2**30:8.2f} GiB per 1M transitions")


if __name__ == "__main__":
    main()
