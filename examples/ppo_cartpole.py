"""A compact PPO on CartPole-v1, built on ``rc.EnvRunner``.

What it shows:

- ``EnvRunner`` collects exact-size batches from 8 CartPole sub-envs
  (``batch_mode="truncate_episodes"``): episodes that go on are cut at the batch boundary
  and continued by the next ``sample()``.
- Advantages (GAE) are computed per agent trajectory in the policy's
  ``postprocess_trajectory``, which the runner calls once per trajectory piece (its rows are
  contiguous and in time order). A trajectory that ended because the pole fell
  (``terminateds``) is not bootstrapped; one that was cut (batch boundary) or truncated by
  the 500-step time limit (``truncateds``) is bootstrapped with the value of its last
  ``new_obs``.
- The policy is an ``rc.MLPPolicy`` with a value head (``vf_head=True``): the runner records
  ``action_logp`` and ``vf_preds`` with every step. Training updates ``policy.model`` in
  place with a torch optimizer; the policy's numpy fast path notices the changed
  parameters by itself (no ``set_weights`` needed).

Hyper-parameters: 8 x 128 env steps per batch, 10 epochs over minibatches of 256, Adam with
lr 3e-4 annealed linearly over the first 150k env steps, clip 0.2, gamma 0.99, GAE lambda
0.95, value-loss coefficient 0.5, gradient norm clipped at 0.5. Training stops when the mean
return of the last 100 episodes (``runner.get_metrics()``, the env's own rewards) reaches
475. With ``--seed 0`` that happens after 125,952 env steps (558 episodes), about 17 s
on one CPU thread (seeds 1 and 2: 321,536 and 182,272 env steps).

Run::

    python examples/ppo_cartpole.py            # train until the mean return >= 475
    python examples/ppo_cartpole.py --smoke    # two iterations, a few seconds
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0


class PPOPolicy(rc.MLPPolicy):
    """An MLPPolicy with a value head that adds GAE advantages to each trajectory.

    Args:
        gamma: discount factor.
        lambda_: GAE parameter.
        **kwargs: passed to :class:`rc.MLPPolicy` (``vf_head`` is always True).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        gamma: float = 0.99,
        lambda_: float = 0.95,
        **kwargs: Any,
    ) -> None:
        super().__init__(observation_space, action_space, vf_head=True, **kwargs)
        self.gamma = gamma
        self.lambda_ = lambda_

    def value(self, obs: np.ndarray) -> np.ndarray:
        """State values (B,) of a batch of observations (no gradient)."""
        with torch.no_grad():
            _, value = self.model(torch.as_tensor(obs, dtype=torch.float32))
        return value.numpy()

    def postprocess_trajectory(
        self,
        batch: rc.SampleBatch,
        other_agent_batches: Mapping[Any, Any] | None = None,
        episode: Any = None,
    ) -> rc.SampleBatch:
        """Add ``advantages`` and ``value_targets`` (GAE) to one agent trajectory."""
        rewards = batch["rewards"].astype(np.float32)
        values = batch["vf_preds"].astype(np.float32)
        # Bootstrap unless the env itself ended the episode: a trajectory cut by the batch
        # boundary or truncated by the time limit would have gone on.
        if batch["terminateds"][-1]:
            last_value = 0.0
        else:
            last_value = float(self.value(batch["new_obs"][-1:])[0])
        next_values = np.append(values[1:], np.float32(last_value))
        deltas = rewards + self.gamma * next_values - values
        advantages = np.zeros_like(deltas)
        running = 0.0
        for t in range(len(deltas) - 1, -1, -1):  # trajectories are short: a plain loop
            running = deltas[t] + self.gamma * self.lambda_ * running
            advantages[t] = running
        batch["advantages"] = advantages
        batch["value_targets"] = advantages + values
        return batch


def ppo_update(
    policy: PPOPolicy,
    optimizer: torch.optim.Optimizer,
    batch: rc.SampleBatch,
    *,
    epochs: int,
    minibatch_size: int,
    clip: float = 0.2,
    vf_coeff: float = 0.5,
    entropy_coeff: float = 0.0,
    max_grad_norm: float = 0.5,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Clipped-surrogate PPO epochs over one batch; updates ``policy.model`` in place."""
    obs = torch.as_tensor(batch["obs"], dtype=torch.float32)
    actions = torch.as_tensor(batch["actions"])
    old_logp = torch.as_tensor(batch["action_logp"], dtype=torch.float32)
    advantages = torch.as_tensor(batch["advantages"], dtype=torch.float32)
    targets = torch.as_tensor(batch["value_targets"], dtype=torch.float32)
    n = len(batch)
    stats: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(epochs):
        for idx in np.array_split(rng.permutation(n), max(1, n // minibatch_size)):
            i = torch.as_tensor(idx)
            logits, values = policy.model(obs[i])
            logp = policy.dist.logp_torch(logits, actions[i])
            adv = advantages[i]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(logp - old_logp[i])
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
            policy_loss = -surrogate.mean()
            value_loss = 0.5 * (values - targets[i]).square().mean()
            log_probs = torch.log_softmax(logits, dim=1)
            entropy = -(log_probs.exp() * log_probs).sum(dim=1).mean()
            loss = policy_loss + vf_coeff * value_loss - entropy_coeff * entropy
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_grad_norm)
            optimizer.step()  # in place: the numpy fast path re-syncs on its next call
            stats["policy_loss"].append(policy_loss.item())
            stats["value_loss"].append(value_loss.item())
            stats["entropy"].append(entropy.item())
    return {k: float(np.mean(v)) for k, v in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two iterations, no target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=500_000, help="give up after this")
    parser.add_argument("--lr", type=float, default=3e-4, help="initial learning rate")
    parser.add_argument("--epochs", type=int, default=10, help="passes over each batch")
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument(
        "--anneal-steps",
        type=int,
        default=150_000,
        help="lr decays linearly to 5%% of --lr over these",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    num_envs, fragment = (8, 128)
    env = gym.make(ENV_ID)
    policy = PPOPolicy(env.observation_space, env.action_space, seed=args.seed)
    config = rc.RunnerConfig(
        num_envs=num_envs,
        rollout_fragment_length=fragment,
        batch_mode="truncate_episodes",
        seed=args.seed,
    )
    runner = rc.EnvRunner(ENV_ID, policy, config=config)
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=args.lr, eps=1e-5)
    rng = np.random.default_rng(args.seed)
    returns: collections.deque[float] = collections.deque(maxlen=100)
    episodes = 0
    env_steps = 0
    iterations = 2 if args.smoke else 10**9
    start = time.perf_counter()
    print(f"PPO on {ENV_ID}: {num_envs} sub-envs x {fragment} steps per batch, seed {args.seed}")

    for it in range(1, iterations + 1):
        batch = runner.sample()
        assert isinstance(batch, rc.SampleBatch)  # one policy, single-agent env
        env_steps += len(batch)
        records = runner.get_metrics()
        episodes += len(records)
        returns.extend(r["episode_reward"] for r in records)
        for group in optimizer.param_groups:  # linear learning-rate annealing
            group["lr"] = args.lr * max(0.05, 1.0 - env_steps / args.anneal_steps)
        stats = ppo_update(
            policy,
            optimizer,
            batch,
            epochs=args.epochs,
            minibatch_size=args.minibatch_size,
            rng=rng,
        )
        mean_return = float(np.mean(returns)) if returns else float("nan")
        if args.smoke or it % 10 == 0:
            print(
                f"iter {it:4d}  env_steps {env_steps:7d}  episodes {episodes:5d}  "
                f"mean_return(last 100) {mean_return:6.1f}  "
                f"value_loss {stats['value_loss']:8.3f}  entropy {stats['entropy']:.3f}"
            )
        if len(returns) == returns.maxlen and mean_return >= TARGET_RETURN:
            break
        if env_steps >= args.max_steps:
            break
    seconds = time.perf_counter() - start
    runner.stop()

    if args.smoke:
        print(f"smoke run done: {env_steps} env steps in {seconds:.1f} s")
        return
    mean_return = float(np.mean(returns))
    if mean_return < TARGET_RETURN:
        raise SystemExit(f"did not reach {TARGET_RETURN} within {env_steps} env steps")
    print(
        f"solved: mean return {mean_return:.1f} over the last 100 episodes after "
        f"{env_steps} env steps ({episodes} episodes) in {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
