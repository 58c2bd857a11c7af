"""Collection from batched torch simulators (issue 53, docs/gpu.md): rlconnect's
tensor path against a hand-written torch loop and TorchRL's ``Collector``.

Workload: ``rc.envs.BatchedCartPole`` (gymnasium's CartPole-v1 dynamics as whole-tensor
ops), N = 4,096 sub-envs, a 64x64 tanh MLP with categorical sampling, one CPU thread,
T = 64 steps per fragment. Contenders, alternated round by round:

- ``hand loop``: the simulator in SAME_STEP mode, one forward pass and one sample per step,
  the rows rlconnect records (obs, actions, rewards, terminateds, truncateds, new_obs with
  the final obs of ended sub-envs, action_logp, action_dist_inputs, eps_id, t) written into
  preallocated [T, N] tensors, with the episode ids, lengths and returns a loop needs for
  its metrics kept as tensors and read once per fragment;
- ``TorchRL Collector``: torchrl's ``Collector`` over a torchrl ``EnvBase`` stepping the same
  simulator (DISABLED mode, torchrl resets through its ``_reset`` mask), the same network
  in a ``ProbabilisticActor``; skipped with a message if torchrl is not installed (it is
  not an rlconnect dependency);
- ``rlconnect``: ``rc.EnvRunner`` over the simulator (SAME_STEP) with ``rc.MLPPolicy``;
  printed as "not available (...)" if the runner cannot take the env yet.

Then VMAS ``balance`` (3 agents, N = 4,096, ~0.26 s per step on CPU, so few steps): a hand
loop (one forward pass for the three agents, ended sub-envs reset with ``reset_at``)
against ``rc.EnvRunner`` over the VMAS env.

It prints env steps/s (median [range] of the rounds) and the per-round ratio to the hand
loop. Targets (issue 53): rlconnect >= 0.9x the hand loop and >= TorchRL's Collector;
VMAS >= 0.9x its hand loop. Machines are noisy: read ratios, not absolutes.

    python benchmarks/bench_tensor.py              # full (~1-2 min on an idle machine)
    python benchmarks/bench_tensor.py --rounds 9   # more rounds
    python benchmarks/bench_tensor.py --no-vmas    # CartPole only
    python benchmarks/bench_tensor.py --quick      # smoke run (small N, seconds)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from _common import machine, median_range, print_table, ratios, take_turns
from torch import nn

import rlconnect as rc
from rlconnect.envs import BatchedCartPole

torch.set_num_threads(1)

HAND = "hand loop"
Fragment = Callable[[], int]  # collects one fragment, returns its env steps


def make_model(in_dim: int = 4, out_dim: int = 2, seed: int = 0) -> nn.Module:
    """The 64x64 tanh MLP every contender uses (same weights for the hand loop and TorchRL)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(in_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out_dim)
    )


def rate(fragment: Fragment, fragments: int) -> Callable[[], float]:
    """A contender's round: ``fragments`` fragments, as env steps per second of wall time."""

    def run() -> float:
        steps, t0 = 0, time.perf_counter()
        for _ in range(fragments):
            steps += fragment()
        return steps / (time.perf_counter() - t0)

    return run


def hand_cartpole(n: int, t_len: int) -> Fragment:
    """The reference: SAME_STEP simulator, sample, the rows rlconnect records into
    preallocated [T, N] tensors (``eps_id`` and ``t`` included), and the episode
    bookkeeping a user's loop needs for its metrics (ids, lengths, returns of ended
    episodes, read back once per fragment)."""
    env = BatchedCartPole(n, autoreset_mode="same_step")
    model = make_model()
    bufs = {
        "obs": torch.zeros(t_len, n, 4),
        "new_obs": torch.zeros(t_len, n, 4),
        "actions": torch.zeros(t_len, n, dtype=torch.int64),
        "rewards": torch.zeros(t_len, n),
        "terminateds": torch.zeros(t_len, n, dtype=torch.bool),
        "truncateds": torch.zeros(t_len, n, dtype=torch.bool),
        "action_logp": torch.zeros(t_len, n),
        "action_dist_inputs": torch.zeros(t_len, n, 2),
        "eps_id": torch.zeros(t_len, n, dtype=torch.int64),
        "t": torch.zeros(t_len, n, dtype=torch.int64),
    }
    ended_len = torch.zeros(t_len, n, dtype=torch.int64)
    ended_ret = torch.zeros(t_len, n)
    state = {
        "obs": env.reset(seed=0)[0],
        "eps": torch.arange(n),
        "next": torch.tensor(n),
        "len": torch.zeros(n, dtype=torch.int64),
        "ret": torch.zeros(n),
    }

    @torch.inference_mode()
    def fragment() -> int:
        obs, eps, length, ret = state["obs"], state["eps"], state["len"], state["ret"]
        for t in range(t_len):
            logits = model(obs)
            logp_all = torch.log_softmax(logits, -1)
            action = torch.multinomial(logp_all.exp(), 1)
            nxt, rew, term, trunc, info = env.step(action.squeeze(-1))
            bufs["obs"][t] = obs
            bufs["actions"][t] = action.squeeze(-1)
            bufs["action_logp"][t] = logp_all.gather(-1, action).squeeze(-1)
            bufs["action_dist_inputs"][t] = logits
            bufs["rewards"][t], bufs["terminateds"][t], bufs["truncateds"][t] = rew, term, trunc
            bufs["eps_id"][t], bufs["t"][t] = eps, length
            done = term | trunc
            torch.where(done[:, None], info["final_obs"], nxt, out=bufs["new_obs"][t])
            length += 1
            ret += rew
            ended_len[t], ended_ret[t] = length * done, ret * done
            eps = torch.where(done, state["next"] + torch.cumsum(done, 0) - 1, eps)
            state["next"] += done.sum()
            length.masked_fill_(done, 0)
            ret.masked_fill_(done, 0.0)
            obs = nxt
        state["obs"], state["eps"] = obs, eps
        ended_len.cpu().numpy()  # the episodes' metrics: one read per fragment
        return t_len * n

    fragment()  # warm-up
    return fragment


def torchrl_cartpole(n: int, t_len: int) -> Fragment:
    """TorchRL's ``Collector`` over an ``EnvBase`` of the same simulator and network."""
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.data import Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase
    from torchrl.modules import ProbabilisticActor

    class TorchRLCartPole(EnvBase):
        """The simulator as a torchrl env: torchrl resets ended sub-envs by a mask."""

        def __init__(self) -> None:
            super().__init__(batch_size=torch.Size([n]), device="cpu")
            self.sim = BatchedCartPole(n, autoreset_mode="disabled")
            self.observation_spec = Composite(
                observation=Unbounded(shape=(n, 4), dtype=torch.float32), shape=(n,)
            )
            self.action_spec = Categorical(2, shape=(n,), dtype=torch.int64)
            self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32)
            flag = Categorical(2, shape=(n, 1), dtype=torch.bool)
            self.full_done_spec = Composite(
                done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,)
            )

        def _reset(self, td: Any = None, **kwargs: Any) -> Any:
            mask = None if td is None else td.get("_reset", None)
            options = None if mask is None else {"reset_mask": mask.reshape(n)}
            obs, _ = self.sim.reset(options=options)
            flag = torch.zeros(n, 1, dtype=torch.bool)
            return TensorDict(
                {"observation": obs, "done": flag, "terminated": flag, "truncated": flag},
                batch_size=self.batch_size,
            )

        def _step(self, td: Any) -> Any:
            obs, rew, term, trunc, _ = self.sim.step(td["action"])
            out = {"observation": obs, "reward": rew[:, None], "terminated": term[:, None]}
            out.update(truncated=trunc[:, None], done=(term | trunc)[:, None])
            return TensorDict(out, batch_size=self.batch_size)

        def _set_seed(self, seed: int | None) -> None:
            self.sim.reset(seed=seed)

    env = TorchRLCartPole()
    env.set_seed(0)
    logits = TensorDictModule(make_model(), in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(
        logits,
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        distribution_kwargs={"validate_args": False},
        return_log_prob=True,
        spec=env.action_spec,
    )
    collector = Collector(
        env,
        actor,
        frames_per_batch=t_len * n,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    batches = iter(collector)
    next(batches)  # warm-up

    def fragment() -> int:
        return int(next(batches).numel())

    return fragment


def mlp_policy(obs_space: Any, act_space: Any) -> rc.Policy:
    """``rc.MLPPolicy`` (64x64 tanh) on the tensor path's device (docs/gpu.md)."""
    options: dict[str, Any] = {"seed": 0, "device": "cpu"}
    return rc.MLPPolicy(obs_space, act_space, **options)


def rlconnect_runner(env: Any, policy: rc.Policy, t_len: int, n: int) -> Fragment:
    """``rc.EnvRunner`` on the tensor path: ``sample()`` is one fragment of every sub-env."""
    cfg = rc.RunnerConfig(num_envs=n, rollout_fragment_length=t_len, seed=0)
    runner = rc.EnvRunner(env, policy, config=cfg)

    def fragment() -> int:
        count = runner.sample().count
        runner.metrics()  # the episodes' figures, as the hand loop reads its own
        return int(count)

    fragment()  # warm-up (first polls check the env)
    return fragment


def rlconnect_cartpole(n: int, t_len: int) -> Fragment:
    env = BatchedCartPole(n, autoreset_mode="same_step")
    policy = mlp_policy(env.single_observation_space, env.single_action_space)
    return rlconnect_runner(env, policy, t_len, n)


def make_vmas(n: int) -> Any:
    """VMAS ``balance`` with 3 agents on CPU (actions clamped to their range)."""
    import vmas

    return vmas.make_env(
        "balance",
        num_envs=n,
        device="cpu",
        continuous_actions=True,
        seed=0,
        max_steps=200,
        clamp_actions=True,
        n_agents=3,
    )


def hand_vmas(n: int, t_len: int) -> Fragment:
    """One forward pass for the three agents' rows (agent-major), a diagonal Gaussian sample,
    the rows into preallocated [T, A*N] tensors, ended sub-envs reset with ``reset_at``."""
    env = make_vmas(n)
    obs = env.reset()
    a, d = len(obs), obs[0].shape[-1]
    act_dim = env.action_space[0].shape[0]
    model = make_model(d, 2 * act_dim)
    rows = a * n
    bufs = {
        "obs": torch.zeros(t_len, rows, d),
        "new_obs": torch.zeros(t_len, rows, d),
        "actions": torch.zeros(t_len, rows, act_dim),
        "rewards": torch.zeros(t_len, rows),
        "terminateds": torch.zeros(t_len, rows, dtype=torch.bool),
        "action_logp": torch.zeros(t_len, rows),
        "action_dist_inputs": torch.zeros(t_len, rows, 2 * act_dim),
    }
    state = {"obs": torch.cat(obs)}

    @torch.inference_mode()
    def fragment() -> int:
        x = state["obs"]
        for t in range(t_len):
            out = model(x)
            mean, log_std = out.chunk(2, -1)
            noise = torch.randn_like(mean)
            action = mean + log_std.exp() * noise
            logp = (-0.5 * noise.square() - log_std - 0.9189385332046727).sum(-1)
            nxt, rew, done, _ = env.step(list(action.split(n)))
            new = torch.cat(nxt)
            bufs["obs"][t], bufs["new_obs"][t], bufs["actions"][t] = x, new, action
            bufs["rewards"][t], bufs["terminateds"][t] = torch.cat(rew), done.repeat(a)
            bufs["action_logp"][t], bufs["action_dist_inputs"][t] = logp, out
            if done.any():  # VMAS resets one sub-env per call, by a Python int
                ended = done.nonzero().flatten().tolist()
                for i in ended[:-1]:
                    env.reset_at(i, return_observations=False)
                new = torch.cat(env.reset_at(ended[-1]))
            x = new
        state["obs"] = x
        return t_len * n

    fragment()  # warm-up
    return fragment


def gymnasium_box(space: Any) -> gym.spaces.Box:
    """VMAS's old-gym Box as a gymnasium Box (what rlconnect's policies take)."""
    low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
    return gym.spaces.Box(low, high, dtype=np.float32)


def rlconnect_vmas(n: int, t_len: int) -> Fragment:
    env = make_vmas(n)
    obs_space, act_space = gymnasium_box(env.observation_space[0]), env.action_space[0]
    policy = mlp_policy(obs_space, gymnasium_box(act_space))
    return rlconnect_runner(env, policy, t_len, n)


def build(name: str, make: Callable[[int, int], Fragment], n: int, t_len: int) -> Fragment | None:
    """A contender's fragment, or None (with the reason printed) if it cannot be built."""
    try:
        return make(n, t_len)
    except ImportError as e:
        print(f"{name}: skipped ({e.name or e} is not installed)")
    except Exception as e:  # the tensor path is being built: report, keep the harness going
        print(f"{name}: not available ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    return None


def compare(
    title: str,
    makers: Mapping[str, Callable[[int, int], Fragment]],
    n: int,
    t_len: int,
    fragments: int,
    rounds: int,
) -> None:
    """Build every contender, alternate them for ``rounds`` rounds, print the table."""
    print(f"\n{title}: N={n}, T={t_len}, {fragments} fragment(s) per round, {rounds} rounds")
    built = {name: build(name, make, n, t_len) for name, make in makers.items()}
    contenders = {name: rate(f, fragments) for name, f in built.items() if f is not None}
    if HAND not in contenders:
        print("hand loop could not run: no table")
        return
    runs = take_turns(contenders, rounds)
    rows = [
        (
            name,
            median_range(runs[name]),
            "1" if name == HAND else median_range(ratios(runs[name], runs[HAND]), ".2f"),
        )
        for name in runs
    ]
    for name, fragment in built.items():
        if fragment is None:
            rows.append((name, "not available", "-"))
    print_table(("collector", "env steps/s median [range]", "ratio to hand loop"), rows)
    if "TorchRL Collector" in runs and "rlconnect" in runs:
        rel = ratios(runs["rlconnect"], runs["TorchRL Collector"])
        print(f"rlconnect / TorchRL Collector per round: {median_range(rel, '.2f')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small N, few steps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--fragments", type=int, default=4, help="T=64 fragments per round")
    parser.add_argument("--vmas-steps", type=int, default=8, help="VMAS steps per round")
    parser.add_argument("--no-vmas", action="store_true")
    args = parser.parse_args()
    n, t_len, fragments, rounds = args.num_envs, 64, args.fragments, args.rounds
    vmas_n, vmas_t = n, args.vmas_steps
    if args.quick:
        n, t_len, fragments, rounds, vmas_n, vmas_t = 256, 16, 1, 2, 64, 4
    print(machine())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, device cpu")
    cartpole = {
        HAND: hand_cartpole,
        "TorchRL Collector": torchrl_cartpole,
        "rlconnect": rlconnect_cartpole,
    }
    compare("BatchedCartPole, 64x64 tanh MLP", cartpole, n, t_len, fragments, rounds)
    if not args.no_vmas:
        vm = {HAND: hand_vmas, "rlconnect": rlconnect_vmas}
        compare("VMAS balance, 3 agents", vm, vmas_n, vmas_t, 1, max(rounds // 2, 2))
    print(
        "\nratios: the median [range] of the per-round ratios to the hand loop. Targets "
        "(issue 53): rlconnect >= 0.9 and >= TorchRL's Collector; VMAS >= 0.9."
    )


if __name__ == "__main__":
    main()
