"""How much faster is the built-in GAE than the per-trajectory Python loop it replaces?

The batch: trajectories of mixed lengths (log-uniformly 1 to 500 rows, as CartPole's
episodes are from an untrained to a solved policy), ending by termination (70 %),
truncation (10 %) or a fragment cut (20 %), one after the other until ``--rows`` rows
(1M by default), with ``vf_preds`` recorded and an ``MLPPolicy`` with a value head for
the bootstrap values.

The contenders, alternating round by round (``_common.take_turns``), each timed for the
whole batch in the process's CPU seconds (all its threads; what a busy machine disturbs
least) and in wall seconds:

- ``rc.GAE``: ``rc.GAE(ctx, gamma=0.99, lambda_=0.95)(batch, policy)``, everything from
  finding the trajectories to the float32 columns (one ``compute_values`` call for all
  bootstrap values). Its passes over the rows are compiled (numba) on the first call of a
  process, which is made once before the rounds and not timed.
- ``per-trajectory loop``: what ``examples/ppo_cartpole.py`` did in
  ``postprocess_trajectory`` before learner connectors (copied here): for each
  trajectory, a one-row torch forward of the value head for its bootstrap, then a reverse
  Python loop over its rows, and its two columns set. The trajectories are sliced out
  before the clock starts (the runner handed them over one by one), and each is given to
  the loop as it is (no copy inside the clock: the loop pays only for its own work).

Both run with one thread per numeric library (``OPENBLAS_NUM_THREADS=1`` and one torch
thread unless the variable is already set), as in a sampling process and as the PPO
example runs: otherwise OpenBLAS's worker threads, woken by the one batched bootstrap
call, spin-wait and bill several milliseconds of CPU time to ``rc.GAE`` on a small machine.
Set ``OPENBLAS_NUM_THREADS`` yourself to measure with more.

It prints both times (median [min-max] over rounds), the ratio loop / ``rc.GAE`` per round
(how many times faster ``rc.GAE`` is), and the largest difference between the two results
(float32 rounding).

    python benchmarks/bench_learner.py            # 1M rows, 5 rounds (~1 min)
    python benchmarks/bench_learner.py --quick    # 20k rows, 3 rounds (a few seconds)

``--tensors`` measures instead ``rc.GAE`` on the tensor path's batch: ``N = 4096`` sub-envs
of ``T = 64`` rows (``meta["rows_per_env"]``), as numpy columns (the compiled pass), as
torch tensors on ``--device`` with the layout (the ``T``-step loop) and without it (the
recursive-doubling scan), each with a linear value of ``obs`` as the policy (numpy in,
numpy out; tensors in, tensors out; on tensors its one call covers every row's
``new_obs``, on numpy only the bootstrap rows'), milliseconds per call, median [min-max]:

    python benchmarks/bench_learner.py --tensors [--device cuda] [--rounds 5]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when numpy loads: see above

import argparse
import itertools
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from _common import machine, median_range, print_table, ratios, take_turns

import rlconnect as rc
from rlconnect.policy import MLPPolicy

torch.set_num_threads(1)

GAMMA, LAMBDA = 0.99, 0.95
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def mixed_batch(rows: int, seed: int = 0) -> rc.SampleBatch:
    """Trajectories of log-uniform lengths (1-500 rows) and mixed ends, ``rows`` rows."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(0, np.log(500), rows)).astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), rows)) + 1]
    lengths[-1] -= int(lengths.sum()) - rows
    lengths = lengths[lengths > 0]
    ends = np.cumsum(lengths) - 1
    kind = rng.choice(3, size=len(lengths), p=[0.7, 0.1, 0.2])  # term, trunc, cut
    terminateds = np.zeros(rows, bool)
    truncateds = np.zeros(rows, bool)
    terminateds[ends[kind == 0]] = True
    truncateds[ends[kind == 1]] = True
    starts = ends - lengths + 1
    return rc.SampleBatch(
        {
            "eps_id": np.repeat(np.arange(len(lengths)), lengths),
            "t": np.arange(rows) - np.repeat(starts, lengths),
            "obs": rng.normal(size=(rows, 4)).astype(np.float32),
            "new_obs": rng.normal(size=(rows, 4)).astype(np.float32),
            "rewards": np.ones(rows, np.float32),
            "terminateds": terminateds,
            "truncateds": truncateds,
            "vf_preds": rng.normal(size=rows).astype(np.float32),
        }
    )


def trajectories(batch: rc.SampleBatch) -> list[rc.SampleBatch]:
    """Each trajectory as its own batch, as a runner hands them to ``postprocess_trajectory``."""
    eps = batch["eps_id"]
    edges = [0, *(np.flatnonzero(eps[1:] != eps[:-1]) + 1).tolist(), len(eps)]
    cols = ("rewards", "vf_preds", "terminateds", "new_obs")
    part = rc.SampleBatch({c: batch[c] for c in cols})
    return [part[a:b] for a, b in itertools.pairwise(edges)]


def example_postprocess(batch: rc.SampleBatch, policy: MLPPolicy) -> rc.SampleBatch:
    """``PPOPolicy.postprocess_trajectory`` of examples/ppo_cartpole.py before learner
    connectors: the bootstrap from the value head in torch, then a reverse loop."""
    rewards = batch["rewards"].astype(np.float32)
    values = batch["vf_preds"].astype(np.float32)
    if batch["terminateds"][-1]:
        last_value = 0.0
    else:
        with torch.no_grad():
            _, value = policy.model(torch.as_tensor(batch["new_obs"][-1:], dtype=torch.float32))
        last_value = float(value.numpy()[0])
    next_values = np.append(values[1:], np.float32(last_value))
    deltas = rewards + GAMMA * next_values - values
    advantages = np.zeros_like(deltas)
    running = 0.0
    for t in range(len(deltas) - 1, -1, -1):  # a recurrence over one short trajectory
        running = deltas[t] + GAMMA * LAMBDA * running
        advantages[t] = running
    batch["advantages"] = advantages
    batch["value_targets"] = advantages + values
    return batch


def loop_gae(trajs: list[rc.SampleBatch], policy: MLPPolicy) -> np.ndarray:
    """The example's GAE over every trajectory, one at a time."""
    return np.concatenate([example_postprocess(t, policy)["advantages"] for t in trajs])


class LinearValues(rc.Policy):
    """V(obs) = obs @ w: torch tensors in, a float32 tensor out on their device; numpy in,
    numpy out."""

    def __init__(self) -> None:
        super().__init__(OBS, gym.spaces.Discrete(2), seed=0)
        self.w = np.asarray([0.5, -0.25, 1.0, 0.125], np.float32)

    def compute_actions(self, input_batch: Any, explore: bool = True) -> Any:
        raise NotImplementedError

    def compute_values(self, input_batch: Any) -> Any:
        obs = input_batch["obs"]
        if isinstance(obs, torch.Tensor):
            return obs @ torch.as_tensor(self.w, device=obs.device)
        return np.asarray(obs) @ self.w


def runner_columns(envs: int, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``envs`` sub-envs' ``steps`` rows each, sub-env major, episodes ending with
    probability 1/50 per step (a fifth of them by truncation), ``vf_preds`` recorded."""
    rng = np.random.default_rng(seed)
    ends = rng.random((envs, steps)) < 0.02
    trunc = ends & (rng.random((envs, steps)) < 0.2)
    new_ep = np.zeros((envs, steps), bool)
    new_ep[:, 1:] = ends[:, :-1]
    eps = np.arange(envs)[:, None] * steps + np.cumsum(new_ep, axis=1)
    start = np.maximum.accumulate(np.where(new_ep, np.arange(steps), 0), axis=1)
    rows = envs * steps
    return {
        "eps_id": eps.reshape(rows).astype(np.int64),
        "t": (np.arange(steps)[None] - start).reshape(rows).astype(np.int64),
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "new_obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "rewards": np.ones(rows, np.float32),
        "terminateds": (ends & ~trunc).reshape(rows),
        "truncateds": trunc.reshape(rows),
        "vf_preds": rng.normal(size=rows).astype(np.float32),
    }


def tensor_gae(device: str, rounds: int, envs: int = 4096, steps: int = 64) -> None:
    """``rc.GAE`` on one runner-layout batch: numpy, and torch with and without the layout."""
    cols = runner_columns(envs, steps)
    meta = {"rows_per_env": steps}
    tensors = rc.SampleBatch(
        {k: torch.as_tensor(v, device=device) for k, v in cols.items()}, meta=meta
    )
    if not isinstance(tensors["rewards"], torch.Tensor):
        print("skipped: this rc.SampleBatch turns torch tensors into numpy arrays")
        return
    general = tensors.copy()
    del general.meta["rows_per_env"]
    policy, gae = LinearValues(), rc.GAE(rc.ConnectorContext(OBS, gym.spaces.Discrete(2)))
    numpy_batch = rc.SampleBatch(cols, meta=meta)
    contenders = {
        "numpy (compiled pass)": lambda: gae(numpy_batch.copy(), policy),
        f"torch {device}, rows_per_env ({steps}-step loop)": lambda: gae(tensors.copy(), policy),
        f"torch {device}, general (doubling scan)": lambda: gae(general.copy(), policy),
    }
    for fn in contenders.values():  # compiles numba's pass, warms torch: not timed
        fn()

    def timed(fn: Any) -> Any:
        def run() -> float:
            t0 = time.perf_counter()
            torch.as_tensor(fn()["advantages"]).sum().item()  # waits for the device
            return 1000 * (time.perf_counter() - t0)

        return run

    turns = take_turns({name: timed(fn) for name, fn in contenders.items()}, rounds)
    print(f"GAE over {envs} sub-envs x {steps} rows, {rounds} rounds, {machine()}")
    print_table(
        ["contender", "ms per call, median [min-max]"],
        [[n, median_range(t, ".1f")] for n, t in turns.items()],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20k rows, 3 rounds")
    parser.add_argument("--tensors", action="store_true", help="GAE on [4096, 64] tensors")
    parser.add_argument("--device", default="cpu", help="the tensors' device (--tensors)")
    args = parser.parse_args(argv)
    if args.tensors:
        tensor_gae(args.device, args.rounds)
        return
    rows, rounds = (20_000, 3) if args.quick else (args.rows, args.rounds)
    policy = MLPPolicy(OBS, gym.spaces.Discrete(2), vf_head=True, seed=0)
    ctx = rc.ConnectorContext.from_policy(policy)
    gae = rc.GAE(ctx, gamma=GAMMA, lambda_=LAMBDA)
    batch = mixed_batch(rows)
    trajs = trajectories(batch)
    results: dict[str, Any] = {}
    gae(batch.copy(), policy)  # compiles rc.GAE's passes (once per process): not timed

    def timed(name: str, fn: Any) -> Any:
        def run() -> tuple[float, float]:
            w0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            return time.process_time() - c0, time.perf_counter() - w0

        return run

    turns = take_turns(
        {
            "rc.GAE": timed("rc.GAE", lambda: gae(batch.copy(), policy)["advantages"]),
            "per-trajectory loop": timed("loop", lambda: loop_gae(trajs, policy)),
        },
        rounds,
    )
    print(f"GAE over {rows:,} rows in {len(trajs):,} trajectories, {rounds} rounds")
    blas = os.environ["OPENBLAS_NUM_THREADS"]
    print(f"threads: OPENBLAS_NUM_THREADS={blas}, torch {torch.get_num_threads()}")
    print(machine())
    cpu = {name: [c for c, _ in t] for name, t in turns.items()}
    wall = {name: [w for _, w in t] for name, t in turns.items()}
    print_table(
        ["contender", "CPU s median [min-max]", "wall s median [min-max]", "rows/CPU s"],
        [
            [
                name,
                median_range(cpu[name], ".4f"),
                median_range(wall[name], ".4f"),
                f"{rows / statistics.median(cpu[name]):,.0f}",
            ]
            for name in turns
        ],
    )
    for label, times in (("CPU time", cpu), ("wall time", wall)):
        speedup = ratios(times["per-trajectory loop"], times["rc.GAE"])
        print(
            f"rc.GAE is {median_range(speedup, '.1f')} times faster than the loop "
            f"({label}, loop / rc.GAE per round: median [min-max])"
        )
    diff = np.abs(results["rc.GAE"].astype(np.float64) - results["loop"]).max()
    print(f"max |difference| of the advantages: {diff:.2e}")


if __name__ == "__main__":
    main()
