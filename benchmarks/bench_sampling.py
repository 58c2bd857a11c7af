"""How close is the runner to a hand-written loop running the same network on the same envs?

Workload: CartPole-v1, a 64x64 tanh MLP with categorical sampling on CPU, one torch
thread, N = 1, 8, 64 sub-envs. For each N the script takes turns, in one process, between

- ``hand-torch``: N gymnasium envs (SyncVectorEnv, SAME_STEP), one torch forward pass per
  step, ``torch.multinomial`` sampling, obs/action/reward/terminated/truncated/new_obs
  written into preallocated numpy arrays;
- ``runner-torch``: ``rc.EnvRunner`` with a ``TorchPolicy`` and the default pipelines;
- ``hand-numpy``: the same loop with a numpy forward pass of the same weights;
- ``runner-mlp``: ``rc.EnvRunner`` with ``MLPPolicy`` (numpy fast path at small batch),

and prints env steps/s (median of the rounds) and the ratios runner / hand loop (median
[range] of the per-round ratios). It also prints what ``check_finite=True`` costs, and
``LSTMPolicy`` next to ``MLPPolicy`` at N = 64 (the recurrent state kept and recorded for
every row).
Machines are noisy (5-15 % between runs on a 2-core VM): read ratios, not absolutes.

    python benchmarks/bench_sampling.py            # full (~2 min on an idle machine)
    python benchmarks/bench_sampling.py --rounds 3 --steps 5000    # shorter
    python benchmarks/bench_sampling.py --quick    # smoke run (~10 s)
    python benchmarks/bench_sampling.py --memory   # bytes per 1M CartPole steps
    python benchmarks/bench_sampling.py --peers    # SB3, Tianshou, TorchRL, RLlib if installed
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from _common import machine, median_range, print_table, ratios, take_turns
from torch import nn

import rlconnect as rc

torch.set_num_threads(1)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)
    )


def hand_loop(n: int, steps: int, act: Callable[[np.ndarray], np.ndarray]) -> tuple[float, float]:
    """The reference loop: N CartPole envs (SyncVectorEnv, SAME_STEP), ``act(obs)`` once
    per step, obs/action/reward/terminated/truncated/new_obs into preallocated arrays."""
    venv = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(n)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    t_len = max(steps // n, 1)
    obs_buf = np.zeros((t_len, n, 4), np.float32)
    new_buf = np.zeros((t_len, n, 4), np.float32)
    act_buf = np.zeros((t_len, n), np.int64)
    rew_buf = np.zeros((t_len, n), np.float32)
    flags = np.zeros((2, t_len, n), bool)
    obs, _ = venv.reset(seed=0)
    start, cpu = time.perf_counter(), time.thread_time()
    for t in range(t_len):
        action = act(obs)
        nxt, rew, term, trunc, info = venv.step(action)
        obs_buf[t], act_buf[t], rew_buf[t] = obs, action, rew
        flags[0, t], flags[1, t] = term, trunc
        new_buf[t] = nxt
        done = term | trunc
        if done.any():
            new_buf[t][done] = np.stack(info["final_obs"][done])
        obs = nxt
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    venv.close()
    return t_len * n / elapsed, t_len * n / cpu


def hand_loop_torch(n: int, steps: int, model: nn.Module) -> tuple[float, float]:
    """Loop (d'): torch MLP + ``torch.multinomial`` sampling."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = model(torch.from_numpy(obs))
            return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1).numpy()

    return hand_loop(n, steps, act)


def hand_loop_numpy(n: int, steps: int, model: nn.Module) -> tuple[float, float]:
    """Loop (e): the same weights as a numpy MLP, Gumbel-max sampling."""
    w = [p.detach().numpy().copy() for p in model.parameters()]
    rng = np.random.default_rng(0)

    def act(obs: np.ndarray) -> np.ndarray:
        h = np.tanh(obs @ w[0].T + w[1])
        h = np.tanh(h @ w[2].T + w[3])
        logits = h @ w[4].T + w[5]
        return np.argmax(logits - np.log(-np.log(rng.random(logits.shape))), axis=-1)

    return hand_loop(n, steps, act)


def runner_rate(n: int, steps: int, policy: rc.Policy, **config: Any) -> tuple[float, float]:
    """Env steps per second of wall time and of this thread's CPU time."""
    frag = max(steps // n, 1)
    cfg = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=0, **config)
    runner = rc.EnvRunner("CartPole-v1", policy, config=cfg)
    runner.sample()  # warm-up (first polls check the env)
    start, cpu = time.perf_counter(), time.thread_time()
    batch = runner.sample()
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    runner.stop()
    return batch.count / elapsed, batch.count / cpu


def measure(n: int, steps: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each contender's (wall, CPU) env steps/s round by round, at ``n`` sub-envs."""
    env = gym.make("CartPole-v1")
    obs_space, act_space = env.observation_space, env.action_space
    model = make_model()
    torch_policy = rc.TorchPolicy(make_model(), obs_space, act_space)
    mlp_policy = rc.MLPPolicy(obs_space, act_space)
    contenders: dict[str, Callable[[], tuple[float, float]]] = {
        "hand-torch": lambda: hand_loop_torch(n, steps, model),
        "runner-torch": lambda: runner_rate(n, steps, torch_policy),
        "hand-numpy": lambda: hand_loop_numpy(n, steps, model),
        "runner-mlp": lambda: runner_rate(n, steps, mlp_policy),
    }
    return take_turns(contenders, rounds)


def report(ns: list[int], steps: int, rounds: int) -> None:
    print(f"\nenv steps/s, CartPole-v1, 64x64 tanh MLP, 1 torch thread, median of {rounds} rounds")
    rows = []
    for n in ns:
        runs = measure(n, steps, rounds)
        wall = {k: [w for w, _ in v] for k, v in runs.items()}
        cpu = {k: [c for _, c in v] for k, v in runs.items()}
        rows.append(
            (
                n,
                f"{statistics.median(wall['hand-torch']):,.0f}",
                f"{statistics.median(wall['runner-torch']):,.0f}",
                median_range(ratios(wall["runner-torch"], wall["hand-torch"]), ".2f"),
                f"{statistics.median(wall['hand-numpy']):,.0f}",
                f"{statistics.median(wall['runner-mlp']):,.0f}",
                median_range(ratios(wall["runner-mlp"], wall["hand-numpy"]), ".2f"),
                f"{statistics.median(ratios(cpu['runner-torch'], cpu['hand-torch'])):.2f}",
                f"{statistics.median(ratios(cpu['runner-mlp'], cpu['hand-numpy'])):.2f}",
                median_range(ratios(wall["runner-mlp"], wall["hand-torch"]), ".2f"),
            )
        )
    header = ("N", "hand-torch", "runner-torch", "ratio", "hand-numpy", "runner-mlp", "ratio")
    print_table((*header, "cpu torch", "cpu numpy", "mlp / hand-torch"), rows)
    print(
        "ratios: the median [range] of the runner's rate over the hand loop's, round by round.\n"
        "mlp / hand-torch: runner-mlp over the torch hand loop (the README's comparison).\n"
        "targets: runner-torch/hand-torch >= 0.8 (N=1), >= 0.95 (N=64); "
        "runner-mlp/hand-numpy >= 0.6 (N=1), >= 0.9 (N=64).\n"
        "cpu: the same ratios in this thread's CPU time, which other processes on a shared "
        "machine disturb less than wall time."
    )


def finite_check_cost(ns: list[int], steps: int, rounds: int) -> None:
    """What ``RunnerConfig(check_finite=True)`` (the default) costs: runner-mlp with the
    check on and off, alternated, as the fraction of CPU time per step it adds."""
    env = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(env.observation_space, env.action_space)
    print("\ncheck_finite cost (runner-mlp, CPU time per step, on vs off, median of rounds)")

    def cpu_rate(n: int, check: bool) -> Callable[[], float]:
        return lambda: runner_rate(n, steps, policy, check_finite=check)[1]

    for n in ns:
        runs = take_turns({"off": cpu_rate(n, False), "on": cpu_rate(n, True)}, rounds)
        on, off = runs["on"], runs["off"]
        cost = [b / a - 1 for a, b in zip(on, off)]  # extra time per step, as a fraction
        print(
            f"N={n:>3}: {statistics.median(off):>9,.0f} -> {statistics.median(on):>9,.0f} "
            f"steps/s, cost {100 * statistics.median(cost):+.1f} % "
            f"(range {100 * min(cost):+.1f} to {100 * max(cost):+.1f} %; target < 3 %)"
        )


def recurrent_cost(n: int, steps: int, rounds: int) -> None:
    """LSTMPolicy (64-unit tanh encoder, 64-unit LSTM; its numpy path) next to MLPPolicy
    (64x64) in the runner, taking turns: what keeping and recording the state ``[h, c]``
    costs (StateBuffer gathers and scatters all rows' states at once, no loop per row)."""
    env = gym.make("CartPole-v1")
    policies = {
        "runner-mlp": rc.MLPPolicy(env.observation_space, env.action_space, seed=0),
        "runner-lstm": rc.LSTMPolicy(env.observation_space, env.action_space, seed=0),
    }

    def rate(policy: rc.Policy) -> Callable[[], tuple[float, float]]:
        return lambda: runner_rate(n, steps, policy)

    runs = take_turns({k: rate(p) for k, p in policies.items()}, rounds)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = ratios([c for _, c in runs["runner-lstm"]], [c for _, c in runs["runner-mlp"]])
    print(
        f"\nrecurrent policy, N={n}: runner-mlp {wall['runner-mlp']:,.0f}, runner-lstm "
        f"{wall['runner-lstm']:,.0f} env steps/s; lstm/mlp CPU-time ratio "
        f"{median_range(cpu, '.2f')}"
    )


def _peer_sb3(n: int, steps: int) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env("CartPole-v1", n_envs=n, seed=0)
    n_steps = max(steps // n, 1)
    model = PPO(
        "MlpPolicy",
        venv,
        n_steps=n_steps,
        batch_size=n_steps * n,
        policy_kwargs={"net_arch": [64, 64], "activation_fn": nn.Tanh},
        device="cpu",
    )
    from stable_baselines3.common.callbacks import BaseCallback

    class Nop(BaseCallback):
        def _on_step(self) -> bool:
            return True

    model._setup_learn(n_steps * n, Nop())
    cb = Nop()
    cb.init_callback(model)
    start = time.perf_counter()
    model.collect_rollouts(venv, cb, model.rollout_buffer, n_rollout_steps=n_steps)
    return n_steps * n / (time.perf_counter() - start)


def _peer_tianshou(n: int, steps: int) -> float:
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.policy import DiscreteActorPolicy

    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n)])
    policy = DiscreteActorPolicy(actor=make_model(), action_space=gym.spaces.Discrete(2))
    collector = Collector(policy, envs, VectorReplayBuffer(steps, n))
    collector.reset()
    start = time.perf_counter()
    collector.collect(n_step=steps)
    return steps / (time.perf_counter() - start)


def _peer_torchrl(n: int, steps: int) -> float:
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import SyncDataCollector
    from torchrl.envs import GymEnv, SerialEnv
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    env = GymEnv("CartPole-v1") if n == 1 else SerialEnv(n, lambda: GymEnv("CartPole-v1"))
    module = TensorDictModule(make_model(), in_keys=["observation"], out_keys=["logits"])
    actor = ProbabilisticActor(
        module, in_keys=["logits"], distribution_class=OneHotCategorical, spec=env.action_spec
    )
    collector = SyncDataCollector(env, actor, frames_per_batch=steps, total_frames=steps)
    start = time.perf_counter()
    next(iter(collector))
    return steps / (time.perf_counter() - start)


def _peer_rllib(n: int, steps: int) -> float:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=n)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh"))
    )
    runner = SingleAgentEnvRunner(config=cfg)
    runner.sample(num_timesteps=min(steps, 1000))
    start = time.perf_counter()
    runner.sample(num_timesteps=steps)
    return steps / (time.perf_counter() - start)


PEERS = {
    "SB3": _peer_sb3,
    "Tianshou": _peer_tianshou,
    "TorchRL": _peer_torchrl,
    "RLlib": _peer_rllib,
}


def peers_report(ns: list[int], steps: int) -> None:
    """Time each installed peer on the same workload (not run in CI)."""
    env = gym.make("CartPole-v1")
    print("\nenv steps/s on the same workload (peer: not installed = skipped)")
    for name, fn in PEERS.items():
        cells = []
        for n in ns:
            try:
                cells.append(f"{fn(n, steps):>9,.0f}")
            except ImportError:
                cells = ["not installed"]
                break
            except Exception as exc:  # a peer's API moved: report, keep going
                cells.append(f"error: {type(exc).__name__}")
        print(f"{name:>10}: " + "  ".join(cells))
    mlp = rc.MLPPolicy(env.observation_space, env.action_space)
    print(f"{'rlconnect':>10}: " + "  ".join(f"{runner_rate(n, steps, mlp)[0]:>9,.0f}" for n in ns))


def memory_report(steps: int = 1_000_000) -> None:
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=64, rollout_fragment_length=steps // 64, seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1", rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    batch = runner.sample()
    assert isinstance(batch, rc.SampleBatch), "a single-agent env samples a SampleBatch"
    raw = sum(batch[k].nbytes for k in batch if batch[k].dtype != object)
    infos = len(batch) * 8
    print(
        f"batch of {len(batch):,} CartPole steps: {batch.nbytes / 1e6:.1f} MB "
        f"(columns {raw / 1e6:.1f} MB + infos pointers {infos / 1e6:.1f} MB); "
        f"collector store held {runner.collectors.nbytes() / 1e6:.1f} MB after sampling"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--memory", action="store_true", help="report bytes per 1M steps")
    parser.add_argument("--peers", action="store_true", help="also time installed peers")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per timing")
    args = parser.parse_args()
    if args.memory:
        memory_report()
        return
    if args.peers:
        peers_report([1, 8, 64], 2_000 if args.quick else args.steps)
        return
    steps, rounds = (512, 1) if args.quick else (args.steps, args.rounds)
    turns = rounds if args.quick else max(rounds, 3)  # quick: one turn of each, every table
    print(machine())
    report([1, 8, 64], steps, rounds)
    finite_check_cost([1, 64], steps, turns)
    recurrent_cost(64, steps, turns)


if __name__ == "__main__":
    main()
