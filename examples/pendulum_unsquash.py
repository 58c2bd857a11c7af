"""A continuous-action env (Pendulum-v1) through the default action pipeline.

Pendulum's action space is ``Box(-2, 2, (1,))``. A Gaussian policy (``rc.MLPPolicy``) outputs
unbounded samples meant to live in ``[-1, 1]``; the default action pipeline
(``normalize_actions=True``) ends with ``UnsquashActions``, which clips each output to
``[-1, 1]`` and maps it linearly onto the Box bounds, so the env always receives a valid
torque in ``[-2, 2]``.

With ``RunnerConfig(record_env_actions=True)`` a batch holds both columns:

- ``actions``: the policy's own output (what ``action_logp`` refers to, what a learner
  trains on), which may lie outside ``[-1, 1]``;
- ``env_actions``: what the env received, after the action connectors.

For comparison the script also runs ``normalize_actions=False, clip_actions=True``: then the
policy's outputs are read in env units and ``ClipActions`` only clips them into ``[-2, 2]``.

Run::

    python examples/pendulum_unsquash.py            # 4 sub-envs x 1,000 steps per pipeline
    python examples/pendulum_unsquash.py --smoke    # 4 sub-envs x 50 steps
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc

ENV_ID = "Pendulum-v1"


def collect(config_kwargs: dict, steps_per_env: int, seed: int) -> rc.SampleBatch:
    """Sample ``steps_per_env`` steps from each of 4 sub-envs with a fresh MLP policy."""
    env = gym.make(ENV_ID)
    policy = rc.MLPPolicy(env.observation_space, env.action_space, seed=seed)
    config = rc.RunnerConfig(
        num_envs=4,
        rollout_fragment_length=min(steps_per_env, 200),
        seed=seed,
        record_env_actions=True,
        **config_kwargs,
    )
    with rc.EnvRunner(ENV_ID, policy, config=config) as runner:
        print(f"  action pipeline: {runner.action_pipeline()}")
        batches = []
        for _ in range(max(1, steps_per_env // 200)):
            batch = runner.sample()
            assert isinstance(batch, rc.SampleBatch)  # one policy, single-agent env
            batches.append(batch)
        episodes = runner.get_metrics()
    batch = rc.concat_samples(batches)
    if episodes:
        mean = np.mean([e["episode_reward"] for e in episodes])
        print(f"  {len(batch)} env steps, {len(episodes)} episodes, mean return {mean:.1f}")
    else:
        print(f"  {len(batch)} env steps (no episode finished yet: Pendulum runs 200 steps)")
    return batch


def show_rows(batch: rc.SampleBatch, n: int = 6) -> None:
    """Print the first ``n`` rows of ``actions`` next to ``env_actions``."""
    print("    row   actions  env_actions")
    for i in range(n):
        print(f"    {i:3d}  {batch['actions'][i, 0]:8.3f}  {batch['env_actions'][i, 0]:11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = 50 if args.smoke else 1000
    space = gym.make(ENV_ID).action_space
    assert isinstance(space, gym.spaces.Box)
    low, high = space.low, space.high
    print(f"{ENV_ID}: action space {space}")

    print("default pipeline (normalize_actions=True):")
    batch = collect({}, steps, args.seed)
    actions, env_actions = batch["actions"], batch["env_actions"]
    show_rows(batch)
    # What the env received always lies in the bounds ...
    assert env_actions.shape == actions.shape == (len(batch), 1)
    assert np.all((env_actions >= low) & (env_actions <= high)), "env action out of bounds"
    # ... and is exactly the clipped policy output mapped from [-1, 1] onto [-2, 2].
    expected = low + (np.clip(actions, -1.0, 1.0) + 1.0) * (high - low) / 2.0
    np.testing.assert_allclose(env_actions, expected, atol=1e-6)  # float32 rounding
    outside = float(np.mean(np.abs(actions) > 1.0))
    print(
        f"  policy outputs outside [-1, 1]: {outside:.1%}; "
        f"env_actions range [{env_actions.min():.3f}, {env_actions.max():.3f}]"
    )
    print("  OK: every env action lies in [-2, 2] and equals unsquash(clip(action, -1, 1))")

    print("clip only (normalize_actions=False, clip_actions=True):")
    batch = collect({"normalize_actions": False, "clip_actions": True}, steps, args.seed)
    show_rows(batch)
    actions, env_actions = batch["actions"], batch["env_actions"]
    assert np.all((env_actions >= low) & (env_actions <= high)), "env action out of bounds"
    np.testing.assert_allclose(env_actions, np.clip(actions, low, high))
    print("  OK: env actions are the policy outputs clipped into [-2, 2] (no rescaling)")


if __name__ == "__main__":
    main()
