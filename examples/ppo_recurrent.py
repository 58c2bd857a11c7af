"""PPO with ``rc.LSTMPolicy`` on CartPole-v1 without velocities: memory solves it.

What it shows:

- ``HideVelocities``, an agent connector registered by name (with an ONNX form, so the run
  exports to ONNX too), drops the cart and pole velocities: the policy sees the cart
  position and the pole angle only (through a ``MeanStdFilter``), so it must infer the
  velocities from what it saw before. The runner takes the pipeline
  ``HideVelocities -> MeanStdFilter -> ClipReward -> StateBuffer``; ``StateBuffer`` keeps
  each sub-env's LSTM state ``[h, c]`` between steps and the batch records it as
  ``state_in_0/1`` (what the policy was called with) and ``state_out_0/1``. CartPole's
  rewards are all 1, so ``ClipReward(limit=0.05)`` scales them by 0.05 in the batch (the
  episode returns reported stay the env's own).
- ``EnvRunner`` collects 8 x 64 env steps per batch; episodes go on across batches, and
  their LSTM state with them.
- Advantages come from the runner's learner pipeline ``GAE -> NormalizeAdvantages``
  (``learner_pipelines=``): a trajectory piece that did not end with the pole falling is
  bootstrapped with the value of its last ``new_obs`` *from its last state_out*, all pieces
  of the batch in one ``compute_values`` call. The policies are the built-in
  ``rc.LSTMPolicy`` / ``rc.MLPPolicy`` with ``vf_head=True``: nothing custom to rebuild.
- The update cuts the batch with ``rc.chop_into_sequences`` into padded pieces of up to 32
  steps of one episode, each with the LSTM state recorded at its first row, and recomputes
  the log-probabilities and values with ``policy.model.forward_sequences`` (masked steps
  are padding and count nowhere).
- ``--no-memory`` trains an ``MLPPolicy`` on the same masked observation with the same
  loop: without memory the task is not solvable, which shows the LSTM is what solves it.
- The run is saved and rebuilt with ``rc.EnvRunner.from_checkpoint`` (policy, connector and
  filter statistics by name, no pickle); the rebuilt runner's greedy evaluation equals the
  trained one's.

Hyper-parameters: 8 x 64 env steps per batch, pieces of up to 32 steps, up to 10 epochs
over minibatches of 16 pieces with advantages normalized per batch, stopped early once
the approximate KL exceeds 0.02; Adam, lr 1e-3 decaying linearly to 0 over ``--max-steps``
(150k), clip 0.2, gamma 0.99, GAE lambda 0.95, rewards scaled by 0.05 (so that in the
shared LSTM the value loss, weighted 0.5, does not drown the policy loss),
gradient norm 0.5; ``LSTMPolicy(hiddens=(64,), cell_size=64, vf_head=True)``. Training
stops once the mean return of the last 20 training episodes (the exploring policy) reaches
475.

Measured (``python examples/ppo_recurrent.py --seed S``, one torch thread, the three seeds
one after the other on a shared 2-core machine at a load average of 9-13). The env steps
a seed takes are the same on every run on one machine, but not across machines (another
CPU, BLAS or torch build rounds training's float sums differently and the runs drift
apart), so read them as samples of a range: 62,976-68,608 over these seeds. The training
loop's wall seconds say more about the machine's load than about the code; "CPU s" is
the process's user CPU time (imports and evaluation included):

====  =========  ========  ================  ======  =====
seed  env steps  episodes  return (last 20)  wall s  CPU s
====  =========  ========  ================  ======  =====
0        65,536       394             496.1   379.5   35.8
1        68,608       447             475.0   322.9   41.5
2        62,976       396             479.4   189.2   34.9
====  =========  ========  ================  ======  =====

Each solved run's greedy evaluation (10 episodes) scores 500.0, before and after the
checkpoint round trip. With ``--no-memory`` the same seeds use the whole 150,016-step
budget and end at a mean return (last 20) of 43.4, 47.1 and 48.5 (the best logged: 58.5,
54.8, 56.6; greedy evaluation 42.5, 41.7, 43.4): without memory the task stays unsolved.

Run::

    python examples/ppo_recurrent.py               # train until the mean return >= 475
    python examples/ppo_recurrent.py --no-memory   # the same with an MLP: stays far below
    python examples/ppo_recurrent.py --checkpoint ckpt  # keep the checkpoint
    python examples/ppo_recurrent.py --smoke       # two iterations, a few seconds
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import rlconnect as rc
from rlconnect.deploy.onnx_forms import ConnectorForm

ENV_ID = "CartPole-v1"
TARGET_RETURN = 475.0


@rc.register_connector("HideVelocities")
class HideVelocities(rc.ObservationConnector):
    """Keeps CartPole's cart position and pole angle (elements 0 and 2) of each row."""

    def output_space(self, input_space: gym.Space) -> gym.Space:
        assert isinstance(input_space, gym.spaces.Box) and input_space.shape == (4,)
        return gym.spaces.Box(input_space.low[::2], input_space.high[::2], dtype=np.float32)

    def transform(self, value: Any) -> np.ndarray:
        return np.asarray(value, dtype=np.float32)[:, ::2]

    def onnx_form(self) -> ConnectorForm:
        """The same selection inside the graph ``rc.export_onnx`` writes."""
        return HideVelocitiesForm()


class HideVelocitiesForm(ConnectorForm):
    """The ONNX form of ``HideVelocities``: columns 0 and 2 of the ``obs`` rows."""

    def forward(
        self, cols: dict[str, torch.Tensor], states: list[torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        return {**cols, "obs": cols["obs"].to(torch.float32)[:, ::2]}, states


def masked_cartpole_pipeline(ctx: rc.ConnectorContext) -> rc.AgentConnectorPipeline:
    """The agent pipeline: hide the velocities, normalize, scale the rewards (all 1) by
    0.05, keep the RNN state."""
    members = [HideVelocities(ctx), rc.MeanStdFilter(ctx), rc.ClipReward(ctx, limit=0.05)]
    return rc.AgentConnectorPipeline(ctx, [*members, rc.StateBuffer(ctx)])


def learner_pipeline(ctx: rc.ConnectorContext) -> rc.LearnerConnectorPipeline:
    """GAE advantages and value targets, then advantages standardised over the batch."""
    return rc.LearnerConnectorPipeline(
        ctx, [rc.GAE(ctx, gamma=0.99, lambda_=0.95), rc.NormalizeAdvantages(ctx)]
    )


def replay(policy: rc.TorchPolicy, seq: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Distribution inputs (B, T, w) and values (B, T) of padded sequences, with gradient."""
    obs = seq["obs"]
    if isinstance(policy, rc.LSTMPolicy):
        states = [seq["state_in_0"], seq["state_in_1"]]
        dist_inputs, _, values = policy.model.forward_sequences(obs, states, seq["mask"])
        return dist_inputs, values
    b, t = obs.shape[:2]
    dist_inputs, values = policy.model(obs.reshape(b * t, -1))
    return dist_inputs.reshape(b, t, -1), values.reshape(b, t)


def ppo_update(
    policy: rc.TorchPolicy,
    optimizer: torch.optim.Optimizer,
    batch: rc.SampleBatch,
    *,
    epochs: int,
    minibatch_seqs: int,
    max_seq_len: int,
    rng: np.random.Generator,
    clip: float = 0.2,
    vf_coeff: float = 0.5,
    max_grad_norm: float = 0.5,
    target_kl: float = 0.02,
) -> dict[str, float]:
    """Clipped-surrogate PPO epochs over the batch's padded sequences (in place)."""
    seq = rc.chop_into_sequences(batch, max_seq_len)
    names = ["obs", "actions", "action_logp", "advantages", "value_targets", "mask"]
    names += [k for k in seq if k.startswith("state_in_")]
    columns = {k: torch.as_tensor(seq[k]) for k in names}
    stats: dict[str, list[float]] = collections.defaultdict(list)
    epochs_done = 0
    for _ in range(epochs):
        kls = []
        minibatches = max(1, seq.num_seqs // minibatch_seqs)
        for idx in np.array_split(rng.permutation(seq.num_seqs), minibatches):
            mb = {k: v[torch.as_tensor(idx)] for k, v in columns.items()}
            dist_inputs, values = replay(policy, mb)
            m = mb["mask"]  # only the real steps, never the padding
            logp = policy.dist.logp_torch(dist_inputs[m], mb["actions"][m])
            adv = mb["advantages"][m]
            log_ratio = logp - mb["action_logp"][m]
            ratio = log_ratio.exp()
            surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
            policy_loss = -surrogate.mean()
            value_loss = 0.5 * (values[m] - mb["value_targets"][m]).square().mean()
            optimizer.zero_grad()
            (policy_loss + vf_coeff * value_loss).backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_grad_norm)
            optimizer.step()  # in place: the numpy fast path re-syncs on its next call
            with torch.no_grad():  # the "k3" estimator: unbiased, always >= 0
                kls.append(((ratio - 1) - log_ratio).mean().item())
            stats["value_loss"].append(value_loss.item())
        epochs_done += 1
        if float(np.mean(kls)) > target_kl:
            break
    return {"value_loss": float(np.mean(stats["value_loss"])), "epochs": epochs_done}


def train(args: argparse.Namespace) -> tuple[rc.EnvRunner, dict[str, float]]:
    """Train until the last 20 episodes average ``TARGET_RETURN`` (or the budget ends)."""
    num_envs, fragment = (8, 64)
    env_obs_space, action_space = _spaces()
    ctx = rc.ConnectorContext(env_obs_space, action_space)
    masked = HideVelocities(ctx).output_space(env_obs_space)  # what the policy sees
    cls = rc.MLPPolicy if args.no_memory else rc.LSTMPolicy
    policy = cls(masked, action_space, vf_head=True, seed=args.seed)
    config = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=fragment, seed=args.seed)
    runner = rc.EnvRunner(
        ENV_ID,
        policy,
        config=config,
        agent_pipelines={"default_policy": masked_cartpole_pipeline},
        learner_pipelines={"default_policy": learner_pipeline},
    )
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=args.lr, eps=1e-5)
    rng = np.random.default_rng(args.seed)
    returns: collections.deque[float] = collections.deque(maxlen=20)
    episodes = env_steps = 0
    start = time.perf_counter()
    print(f"PPO with {type(policy).__name__} on {ENV_ID} without velocities, seed {args.seed}")
    for it in range(1, (2 if args.smoke else 10**9) + 1):
        batch = runner.sample()
        assert isinstance(batch, rc.SampleBatch) and len(batch) == num_envs * fragment
        env_steps += len(batch)
        records = runner.get_metrics()
        episodes += len(records)
        returns.extend(r["episode_reward"] for r in records)
        for group in optimizer.param_groups:  # linear decay to 0 over the budget
            group["lr"] = args.lr * max(0.0, 1.0 - env_steps / args.max_steps)
        stats = ppo_update(
            policy, optimizer, batch, epochs=10, minibatch_seqs=16, max_seq_len=32, rng=rng
        )
        mean_return = float(np.mean(returns)) if returns else float("nan")
        if args.smoke or it % 10 == 0:
            print(
                f"iter {it:4d}  env_steps {env_steps:7d}  episodes {episodes:5d}  "
                f"mean_return(last 20) {mean_return:6.1f}  "
                f"value_loss {stats['value_loss']:8.3f}  epochs {stats['epochs']:.0f}"
            )
        if len(returns) == returns.maxlen and mean_return >= TARGET_RETURN:
            break
        if env_steps >= args.max_steps:
            break
    seconds = time.perf_counter() - start
    return runner, {
        "env_steps": env_steps,
        "episodes": episodes,
        "seconds": seconds,
        "mean_return": float(np.mean(returns)) if returns else float("nan"),
    }


def _spaces() -> tuple[gym.Space, gym.Space]:
    env = gym.make(ENV_ID)
    env.close()
    return env.observation_space, env.action_space


def evaluate_restored(runner: rc.EnvRunner, checkpoint: Path, num_episodes: int) -> None:
    """Save, rebuild with ``from_checkpoint`` and check both runners score the same."""
    runner.save_checkpoint(checkpoint)
    trained = [r["episode_reward"] for r in runner.evaluate(num_episodes)]
    runner.stop()
    restored = rc.EnvRunner.from_checkpoint(checkpoint, env=ENV_ID)
    again = [r["episode_reward"] for r in restored.evaluate(num_episodes)]
    kind = type(restored.policies["default_policy"]).__name__
    print(f"restored {restored.agent_pipeline()} and a {kind} from {checkpoint.name}")
    restored.stop()
    print(
        f"greedy evaluation over {num_episodes} episodes: trained runner "
        f"{np.mean(trained):.1f}, restored runner {np.mean(again):.1f}"
    )
    if sorted(trained) != sorted(again):
        raise SystemExit("the restored runner does not reproduce the trained one")
    print("OK: the checkpoint (policy, connectors, filter statistics) reproduces the evaluation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two iterations, no target")
    parser.add_argument("--no-memory", action="store_true", help="an MLP instead of the LSTM")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-steps", type=int, default=150_000, help="budget; the lr decays to 0 over it"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="initial learning rate")
    parser.add_argument("--checkpoint", type=Path, help="keep the checkpoint in this folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    runner, result = train(args)
    print(
        f"mean return {result['mean_return']:.1f} over the last 20 episodes after "
        f"{result['env_steps']} env steps ({result['episodes']} episodes) "
        f"in {result['seconds']:.1f} s"
    )
    if not (args.smoke or args.no_memory) and result["mean_return"] < TARGET_RETURN:
        runner.stop()
        raise SystemExit(f"did not reach {TARGET_RETURN} within {result['env_steps']} env steps")
    num_episodes = 2 if args.smoke else 10
    if args.checkpoint is not None:
        evaluate_restored(runner, args.checkpoint, num_episodes)
        return
    with tempfile.TemporaryDirectory() as tmp:
        evaluate_restored(runner, Path(tmp) / "checkpoint", num_episodes)


if __name__ == "__main__":
    main()
