"""What a learner pipeline costs next to sampling: ``sample()`` with ``GAE ->
NormalizeAdvantages`` against the same runner without a learner pipeline.

Two runners on CartPole-v1, N = 64 sub-envs x 200 steps per batch (the default fragment),
``MLPPolicy(vf_head=True)`` (64x64, one torch thread), alike in every way but the learner
pipeline. Each round gives each runner the same CPU-time budget of whole ``sample()``
calls, in turns (reversed every other round), and counts env steps per CPU second of this
thread (other processes disturb CPU time less than wall time). The ratio is per round; its
median and range are printed: 1.0 means the learner pipeline costs nothing next to
sampling. On a loaded machine the rounds spread widely, so the pipeline's own CPU time per
batch (the same batches, called again) is printed too, as a share of a ``sample()``.

    python benchmarks/bench_learner_sampling.py            # 9 rounds of 3 s each (~1 min)
    python benchmarks/bench_learner_sampling.py --quick    # smoke run (N=8 x 50, seconds)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gymnasium as gym
import torch
from _common import machine, median_range, print_table, ratios, take_turns

import rlconnect as rc

NUM_ENVS, FRAGMENT = 64, 200
QUICK_NUM_ENVS, QUICK_FRAGMENT = 8, 50  # --quick: small batches, every figure printed


def learner_pipeline(ctx: rc.ConnectorContext) -> rc.LearnerConnectorPipeline:
    return rc.LearnerConnectorPipeline(ctx, [rc.GAE(ctx), rc.NormalizeAdvantages(ctx)])


def make_runner(with_learner: bool, num_envs: int, fragment: int) -> rc.EnvRunner:
    env = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(env.observation_space, env.action_space, vf_head=True, seed=0)
    config = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=fragment, seed=0)
    learners = {"default_policy": learner_pipeline} if with_learner else None
    return rc.EnvRunner("CartPole-v1", policy, config=config, learner_pipelines=learners)


def steps_per_cpu_second(runner: rc.EnvRunner, seconds: float) -> Callable[[], float]:
    def run() -> float:
        steps, t0 = 0, time.thread_time()
        while time.thread_time() - t0 < seconds:
            steps += runner.sample().count
            runner.get_metrics()
        return steps / (time.thread_time() - t0)

    return run


def pipeline_share(runner: rc.EnvRunner, batch: rc.SampleBatch) -> float:
    """The learner pipeline's CPU time on ``batch`` over that of one ``sample()``."""
    pipe, policy = runner.learner_pipeline(), runner.policies["default_policy"]
    raw = rc.SampleBatch({k: batch[k] for k in batch if k not in ("advantages", "value_targets")})
    t0 = time.thread_time()
    for _ in range(10):
        pipe(raw, policy)
    t1 = time.thread_time()
    for _ in range(3):
        runner.sample()
    return (t1 - t0) / 10 / ((time.thread_time() - t1) / 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per turn")
    args = parser.parse_args()
    rounds, seconds = (1, 0.05) if args.quick else (args.rounds, args.seconds)
    n, frag = (QUICK_NUM_ENVS, QUICK_FRAGMENT) if args.quick else (NUM_ENVS, FRAGMENT)
    torch.set_num_threads(1)
    runners = {
        "plain": make_runner(False, n, frag),
        "GAE + NormalizeAdvantages": make_runner(True, n, frag),
    }
    for r in runners.values():  # warm-up: the first polls check the env, torch warms up
        r.sample()
    batch = runners["GAE + NormalizeAdvantages"].sample()
    assert isinstance(batch, rc.SampleBatch) and "advantages" in batch
    results = take_turns(
        {name: steps_per_cpu_second(r, seconds) for name, r in runners.items()}, rounds
    )
    share = pipeline_share(runners["GAE + NormalizeAdvantages"], batch)
    for r in runners.values():
        r.stop()
    print(f"sample() of CartPole-v1, N={n} x {frag}, MLPPolicy(vf_head=True)")
    print(machine())
    plain = results["plain"]
    rows = [
        [name, median_range(v), median_range(ratios(v, plain), ".3f")]
        for name, v in results.items()
    ]
    print_table(["runner", "env steps / CPU s", "ratio to plain"], rows)
    print(f"GAE + NormalizeAdvantages alone: {share:.2%} of a sample()'s CPU time")


if __name__ == "__main__":
    main()
