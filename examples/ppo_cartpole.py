"""A compact PPO on CartPole-v1, built on ``rc.EnvRunner``.

What it shows:

- ``EnvRunner`` collects exact-size batches from 8 CartPole sub-envs
  (``batch_mode="truncate_episodes"``: always 8 x 128 = 1024 rows). Episodes that go on are
  cut at the batch boundary and continued by the next ``sample()``.
- Observations go through a ``MeanStdFilter`` (``observation_filter="MeanStdFilter"``); the
  batch holds what the policy saw, so the PPO update trains on exactly those inputs.
- Advantages come from the runner's *learner pipeline* ``GAE -> NormalizeAdvantages``
  (``learner_pipelines=``): every batch ``sample()`` returns already holds ``advantages``
  (standardised over the batch) and ``value_targets``. ``GAE`` does not bootstrap a
  trajectory that ended because the pole fell (``terminateds``), and bootstraps one that
  was cut (batch boundary) or truncated by the 500-step time limit (``truncateds``) with
  the value of its last ``new_obs``, over the whole batch at once.
- The policy is the built-in ``rc.MLPPolicy`` with a value head (``vf_head=True``), so the
  checkpoint rebuilds it by name and exports from the command line
  (``rlconnect export ckpt --out cartpole.policy --onnx cartpole.onnx``). Training
  updates ``policy.model`` in place; the policy's numpy fast path notices by itself.
- After training, ``runner.save_checkpoint`` writes the weights *and* the filter's
  statistics; ``rc.EnvRunner.from_checkpoint`` rebuilds the runner in one call, and
  ``evaluate`` runs greedy episodes through the same pipelines (filter frozen): the
  restored runner scores exactly what the trained one scores.

Hyper-parameters (standard PPO choices, not tuned to one seed): 8 x 128 env steps per batch,
up to 10 epochs over minibatches of 256 with advantages normalized per batch, an epoch
loop that stops early once the approximate KL to the sampling policy exceeds 0.02, Adam with
lr 3e-4 decaying linearly to 0 over ``--max-steps`` (300k), clip 0.2, gamma 0.99, GAE lambda
0.95, value-loss coefficient 0.5, gradient norm clipped at 0.5. Training stops when the mean
return of the last 100 training episodes (``runner.get_metrics()``, the env's own rewards,
exploring policy) reaches 475, CartPole-v1's "solved" threshold.

Measured (``python examples/ppo_cartpole.py --seed S``, one torch thread, the three seeds
one after the other on a shared 2-core machine at a load average of 9-13). The env steps
a seed takes are the same on every run on one machine, but not across machines (another
CPU, BLAS or torch build rounds training's float sums differently and the runs drift
apart), so read them as samples of a range: 105,472-184,320 over these seeds. Seconds
depend on the machine's load; "CPU s" is the process's user CPU time, imports and
evaluation included:

====  ==========  ========  ===========  =====
seed  env steps   episodes  loop wall s  CPU s
====  ==========  ========  ===========  =====
0        184,320       970        354.2   41.3
1        109,568       561        316.7   33.2
2        105,472       533        157.3   29.0
====  ==========  ========  ===========  =====

Measured again on 2026-12-02 on a machine of the same kind with a fresh install of the
dependencies (one torch thread, load below 2): seed 0 did not reach 475 within the
300,000-step budget (the mean return peaked at 448.5), seed 1 solved in 128,000 env steps
(670 episodes, 38.2 s) and seed 2 in 100,352 (500 episodes, 27.8 s); the code before this
session's changes takes exactly the same steps there. The test suite trains seed 2.

Run::

    python examples/ppo_cartpole.py            # train until the mean return >= 475
    python examples/ppo_cartpole.py --seed 1 --checkpoint ckpt   # keep the checkpoint
    python examples/ppo_cartpole.py --smoke    # two iterations, a few seconds
    python examples/ppo_cartpole.py --env Acrobot-v1 --target-return -100   # another env

``--env`` takes any gymnasium id (``module:EnvId`` too) with a Discrete or Box action
space; ``--target-return`` is the mean return that ends training (475 for CartPole-v1;
without it another env trains for the whole ``--max-steps`` budget).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0
"""CartPole-v1's "solved" threshold: the default ``--target-return`` on that env."""


def learner_pipeline(ctx: rc.ConnectorContext) -> rc.LearnerConnectorPipeline:
    """GAE advantages and value targets, then advantages standardised over the batch."""
    return rc.LearnerConnectorPipeline(
        ctx, [rc.GAE(ctx, gamma=0.99, lambda_=0.95), rc.NormalizeAdvantages(ctx)]
    )


def ppo_update(
    policy: rc.MLPPolicy,
    optimizer: torch.optim.Optimizer,
    batch: rc.SampleBatch,
    *,
    epochs: int,
    minibatch_size: int,
    rng: np.random.Generator,
    clip: float = 0.2,
    vf_coeff: float = 0.5,
    max_grad_norm: float = 0.5,
    target_kl: float = 0.02,
) -> dict[str, float]:
    """Clipped-surrogate PPO epochs over one batch; updates ``policy.model`` in place.

    The epoch loop stops early once the mean approximate KL divergence between the policy
    that sampled the batch and the updated one exceeds ``target_kl``.
    """
    obs = torch.as_tensor(batch["obs"], dtype=torch.float32)
    actions = torch.as_tensor(batch["actions"])
    old_logp = torch.as_tensor(batch["action_logp"], dtype=torch.float32)
    advantages = torch.as_tensor(batch["advantages"], dtype=torch.float32)
    targets = torch.as_tensor(batch["value_targets"], dtype=torch.float32)
    n = len(batch)
    stats: dict[str, list[float]] = collections.defaultdict(list)
    epochs_done = 0
    for _ in range(epochs):
        kls = []
        for idx in np.array_split(rng.permutation(n), max(1, n // minibatch_size)):
            i = torch.as_tensor(idx)
            logits, values = policy.model(obs[i])
            logp = policy.dist.logp_torch(logits, actions[i])
            adv = advantages[i]
            log_ratio = logp - old_logp[i]
            ratio = log_ratio.exp()
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
            policy_loss = -surrogate.mean()
            value_loss = 0.5 * (values - targets[i]).square().mean()
            loss = policy_loss + vf_coeff * value_loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_grad_norm)
            optimizer.step()  # in place: the numpy fast path re-syncs on its next call
            with torch.no_grad():  # the "k3" estimator: unbiased, always >= 0
                kls.append(((ratio - 1) - log_ratio).mean().item())
            stats["policy_loss"].append(policy_loss.item())
            stats["value_loss"].append(value_loss.item())
        epochs_done += 1
        if float(np.mean(kls)) > target_kl:
            break
    return {**{k: float(np.mean(v)) for k, v in stats.items()}, "epochs": epochs_done}


def train(args: argparse.Namespace) -> tuple[rc.EnvRunner, dict[str, float]]:
    """Train until the last 100 episodes average ``args.target_return`` (or the budget
    ends)."""
    num_envs, fragment = (8, 128)
    env = gym.make(args.env)
    policy = rc.MLPPolicy(env.observation_space, env.action_space, vf_head=True, seed=args.seed)
    env.close()
    config = rc.RunnerConfig(
        num_envs=num_envs,
        rollout_fragment_length=fragment,
        batch_mode="truncate_episodes",
        observation_filter="MeanStdFilter",
        seed=args.seed,
    )
    runner = rc.EnvRunner(
        args.env, policy, config=config, learner_pipelines={"default_policy": learner_pipeline}
    )
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=args.lr, eps=1e-5)
    rng = np.random.default_rng(args.seed)
    returns: collections.deque[float] = collections.deque(maxlen=100)
    episodes = env_steps = 0
    iterations = 2 if args.smoke else 10**9
    start = time.perf_counter()
    print(f"PPO on {args.env}: {num_envs} sub-envs x {fragment} steps per batch, seed {args.seed}")
    for it in range(1, iterations + 1):
        batch = runner.sample()
        assert isinstance(batch, rc.SampleBatch) and len(batch) == num_envs * fragment
        env_steps += len(batch)
        records = runner.get_metrics()
        episodes += len(records)
        returns.extend(r["episode_reward"] for r in records)
        for group in optimizer.param_groups:  # linear decay to 0 over the budget
            group["lr"] = args.lr * max(0.0, 1.0 - env_steps / args.max_steps)
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
                f"value_loss {stats['value_loss']:8.3f}  epochs {stats['epochs']:.0f}"
            )
        target = args.target_return
        if target is not None and len(returns) == returns.maxlen and mean_return >= target:
            break
        if env_steps >= args.max_steps:
            break
    result = {
        "env_steps": env_steps,
        "episodes": episodes,
        "seconds": time.perf_counter() - start,
        "mean_return": float(np.mean(returns)) if returns else float("nan"),
    }
    return runner, result


def evaluate_restored(
    runner: rc.EnvRunner, checkpoint: Path, num_episodes: int, env_id: str = ENV_ID
) -> None:
    """Save, rebuild with ``from_checkpoint`` and check both runners score the same."""
    runner.save_checkpoint(checkpoint)
    trained = [r["episode_reward"] for r in runner.evaluate(num_episodes)]
    saved = runner.agent_pipeline()["MeanStdFilter"].get_statistics()
    runner.stop()
    restored = rc.EnvRunner.from_checkpoint(checkpoint, env=env_id)
    stats = restored.agent_pipeline()["MeanStdFilter"].get_statistics()
    print(
        f"restored {restored.agent_pipeline()} from {checkpoint.name}: filter mean "
        f"{np.round(stats['mean'], 2)} over {int(stats['count']):,} observations"
    )
    print(f"restored {restored.learner_pipeline()}")
    assert all(np.array_equal(saved[k], stats[k]) for k in saved)
    again = [r["episode_reward"] for r in restored.evaluate(num_episodes)]
    restored.stop()
    print(
        f"greedy evaluation over {num_episodes} episodes: trained runner "
        f"{np.mean(trained):.1f}, restored runner {np.mean(again):.1f}"
    )
    if sorted(trained) != sorted(again):
        raise SystemExit("the restored runner does not reproduce the trained one")
    print("OK: the checkpoint (weights and filter statistics) reproduces the evaluation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two iterations, no target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", default=ENV_ID, help="gymnasium id (default %(default)s)")
    parser.add_argument(
        "--target-return",
        type=float,
        help=f"mean return of the last 100 episodes that ends training ({TARGET_RETURN:g} on "
        f"{ENV_ID}; other envs: none, train for the whole budget)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=300_000, help="budget; the lr decays to 0 over it"
    )
    parser.add_argument("--lr", type=float, default=3e-4, help="initial learning rate")
    parser.add_argument("--epochs", type=int, default=10, help="most passes over each batch")
    parser.add_argument("--minibatch-size", type=int, default=256)
    parser.add_argument("--checkpoint", type=Path, help="keep the checkpoint in this folder")
    args = parser.parse_args()
    if args.target_return is None and args.env == ENV_ID:
        args.target_return = TARGET_RETURN
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    runner, result = train(args)
    if not args.smoke:
        target = args.target_return
        if target is not None and result["mean_return"] < target:
            runner.stop()
            raise SystemExit(f"did not reach {target} within {result['env_steps']} env steps")
        outcome = "solved" if target is not None else "budget spent"
        print(
            f"{outcome}: mean return {result['mean_return']:.1f} over the last 100 episodes after "
            f"{result['env_steps']} env steps ({result['episodes']} episodes) "
            f"in {result['seconds']:.1f} s"
        )
    else:
        print(f"smoke run done: {result['env_steps']} env steps in {result['seconds']:.1f} s")
    num_episodes = 2 if args.smoke else 20
    if args.checkpoint is not None:
        evaluate_restored(runner, args.checkpoint, num_episodes, args.env)
        return
    with tempfile.TemporaryDirectory() as tmp:
        evaluate_restored(runner, Path(tmp) / "checkpoint", num_episodes, args.env)


if __name__ == "__main__":
    main()
