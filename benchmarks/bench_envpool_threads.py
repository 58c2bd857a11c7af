"""How many EnvPool threads a synchronous runner wants: rlconnect's default against EnvPool's.

``EnvRunner.sample()`` (RandomPolicy, synchronous, ``rollout_fragment_length`` so a batch
holds about 3,200 env steps) on ``"envpool:CartPole-v1"`` at several sizes N and on
``"envpool:Pong-v5"`` (``preset="atari"``, N=8), each with the ``num_threads`` rlconnect
picks when ``env_config`` names none (``rlconnect.envs.envpool_env.default_threads``: one
thread for the light classic-control and toy-text tasks, EnvPool's own default for the
rest) and with the other choice: EnvPool's default (``num_threads=0``, a thread per CPU)
for CartPole, one thread for Pong. The contenders of a task take turns for ``--rounds``
rounds of ``--seconds``; the table gives the median env steps/s [min-max] and the median
over rounds of the ratio of rlconnect's default to the other choice.

    python benchmarks/bench_envpool_threads.py [--quick] [--rounds 5] [--seconds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from bench_envpool_pacer import envpool_missing, take_turns, timed_runner

import rlconnect as rc
from rlconnect.envs import make_base_env
from rlconnect.envs.envpool_env import EnvPoolEnv

#: (label, env, N, preset, the other choice's env_config)
CASES = [
    *(
        ("CartPole-v1", "envpool:CartPole-v1", n, None, {"num_threads": 0})
        for n in (16, 64, 256, 1024)
    ),
    ("Pong-v5", "envpool:Pong-v5", 8, "atari", {"num_threads": 1}),
]


def _runner(env: str, n: int, preset: str | None, env_config: dict[str, Any]) -> rc.EnvRunner:
    config = rc.RunnerConfig(
        num_envs=n,
        rollout_fragment_length=max(3200 // n, 1),
        seed=0,
        check_env=False,
        preset=preset,
        env_config=env_config,
    )
    base = make_base_env(env, num_envs=n, seed=0, env_config=env_config, preset=preset)
    ctx = rc.ConnectorContext(
        base.observation_space(rc.DEFAULT_AGENT_ID),
        base.action_space(rc.DEFAULT_AGENT_ID),
        config.connector_config(),
    )
    space = rc.default_agent_pipeline(ctx).output_space
    return rc.EnvRunner(base, rc.RandomPolicy(space, ctx.action_space, seed=0), config=config)


def _threads(runner: rc.EnvRunner) -> str:
    """The pool's ``num_threads`` as built (0: EnvPool picks, a thread per CPU)."""
    env = runner.env
    assert isinstance(env, EnvPoolEnv), f"an envpool: env builds an EnvPoolEnv, not {env!r}"
    threads = int(env.pool.config["num_threads"])
    return str(threads) if threads else f"0 ({os.cpu_count()} CPUs)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    rounds, seconds = (1, 0.3) if args.quick else (args.rounds, args.seconds)
    if envpool_missing():
        return
    print(f"env steps/s, synchronous, median [min-max] of {rounds} rounds; {os.cpu_count()} CPUs")
    print(f"{'task':<12} {'N':>5} {'contender':<26} {'threads':>12} {'median':>10} {'range':>21}")
    for label, env, n, preset, other in CASES:
        runners = {
            "rlconnect's default": _runner(env, n, preset, {}),
            "the other choice": _runner(env, n, preset, other),
        }
        try:
            runs = {name: timed_runner(r) for name, r in runners.items()}
            rates = take_turns(runs, rounds, seconds)
            for name, values in rates.items():
                span = f"{min(values):,.0f}-{max(values):,.0f}"
                print(
                    f"{label:<12} {n:>5} {name:<26} {_threads(runners[name]):>12} "
                    f"{statistics.median(values):>10,.0f} {span:>21}"
                )
            ratio = statistics.median(
                a / b for a, b in zip(rates["rlconnect's default"], rates["the other choice"])
            )
            print(f"{label:<12} {n:>5} default / other: {ratio:.2f}x")
        finally:
            for runner in runners.values():
                runner.stop()


if __name__ == "__main__":
    main()
