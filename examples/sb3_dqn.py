"""Stable-Baselines3's DQN learning from experience collected by rlconnect.

What it shows:

- ``rc.EnvRunner`` samples CartPole-v1 from 4 sub-envs with an epsilon-greedy policy over
  SB3's own Q-network (``QNetPolicy`` below: a plain ``rc.Policy``).
- ``rc.interop.fill_sb3_buffer(batch, model.replay_buffer)`` writes each batch's rows into
  the DQN's ``ReplayBuffer`` as whole arrays, with SB3's time-limit convention: a step that
  CartPole's 500-step limit truncated is marked in ``timeouts``, so SB3 bootstraps it from
  its next observation instead of treating it as a termination.
- ``model.train(...)`` runs SB3's DQN gradient steps on that buffer (the target network is
  synced after each iteration); the TD loss on the first batch's transitions is printed
  before and after the first iteration's steps.

Run::

    python examples/sb3_dqn.py              # 30 iterations (about 15k env steps)
    python examples/sb3_dqn.py --smoke      # two iterations, a few seconds
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.logger import Logger

import rlconnect as rc

NUM_ENVS, FRAGMENT = 4, 128


class QNetPolicy(rc.Policy):
    """Epsilon-greedy over a DQN's Q-network; ``epsilon`` is set by the training loop."""

    def __init__(self, model: DQN, seed: int) -> None:
        super().__init__(model.observation_space, model.action_space, seed=seed)
        self.model = model
        self.epsilon = 1.0

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> Any:
        obs = torch.as_tensor(np.asarray(input_batch["obs"]), dtype=torch.float32)
        with torch.no_grad():
            greedy = self.model.q_net(obs).argmax(dim=1).numpy()
        if explore:
            n = len(greedy)
            random = self.np_random.integers(0, int(self.action_space.n), n)
            greedy = np.where(self.np_random.random(n) < self.epsilon, random, greedy)
        return greedy, [], {}


def td_loss(model: DQN, samples: Any) -> float:
    """The DQN's Huber TD loss on ``samples`` (against its target network)."""
    with torch.no_grad():
        nxt = model.q_net_target(samples.next_observations).max(dim=1, keepdim=True)[0]
        target = samples.rewards + (1 - samples.dones) * model.gamma * nxt
        q = model.q_net(samples.observations).gather(1, samples.actions.long())
        return float(torch.nn.functional.smooth_l1_loss(q, target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="two iterations")
    args = parser.parse_args()
    iterations = 2 if args.smoke else args.iterations
    torch.manual_seed(args.seed)
    model = DQN(
        "MlpPolicy", gym.make("CartPole-v1"), buffer_size=50_000, learning_starts=0,
        batch_size=64, learning_rate=1e-3, gamma=0.99, seed=args.seed, device="cpu",
    )  # fmt: skip
    model.set_logger(Logger(folder=None, output_formats=[]))
    policy = QNetPolicy(model, args.seed)
    config = rc.RunnerConfig(num_envs=NUM_ENVS, rollout_fragment_length=FRAGMENT, seed=args.seed)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    rows = NUM_ENVS * FRAGMENT
    print(f"SB3 DQN on CartPole-v1: {NUM_ENVS} sub-envs x {FRAGMENT} steps per batch")
    try:
        for it in range(1, iterations + 1):
            policy.epsilon = max(0.05, 1.0 - it / (0.5 * max(iterations, 2)))
            added = rc.interop.fill_sb3_buffer(runner.sample(), model.replay_buffer)
            if it == 1:  # the first batch's transitions, against the first target net
                fixed = model.replay_buffer._get_samples(np.arange(added))
                before = td_loss(model, fixed)
            model.train(gradient_steps=rows // 4, batch_size=64)
            if it == 1:
                after = td_loss(model, fixed)
            model.q_net_target.load_state_dict(model.q_net.state_dict())
            returns = [m["episode_reward"] for m in runner.get_metrics()]
            mean = f"{np.mean(returns):7.1f}" if returns else "      -"
            print(f"iter {it:4d}  buffer {model.replay_buffer.size():6d}  epsilon "
                  f"{policy.epsilon:.2f}  episode_return_mean {mean}")  # fmt: skip
    finally:
        runner.stop()
    print(f"TD loss on the first batch's transitions, before -> after the first "
          f"{rows // 4} gradient steps: {before:.4f} -> {after:.4f}")  # fmt: skip
    if not after < before:
        raise SystemExit("FAILED: the TD loss did not go down")
    print("OK: SB3's DQN trained on rows rlconnect put in its ReplayBuffer")


if __name__ == "__main__":
    main()
