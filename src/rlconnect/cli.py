"""The ``rlconnect`` command: collect experience from an env and report what happened.

rlconnect sample --env CartPole-v1 --num-envs 8 --steps 20000
rlconnect inspect PIPELINE_FILE
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["main"]


def _load_env(spec: str) -> Any:
    """A gymnasium id, or ``module:function`` naming an env creator."""
    if ":" in spec and not spec.startswith("ale_py"):
        module, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise SystemExit(f"rlconnect: cannot load env creator {spec!r}: {exc}") from None
    return spec


def _spaces_of(runner_env: Any) -> tuple[Any, Any]:
    from rlconnect.batches import DEFAULT_AGENT_ID

    return runner_env.observation_space(DEFAULT_AGENT_ID), runner_env.action_space(DEFAULT_AGENT_ID)


def _build_runner(args: argparse.Namespace) -> Any:
    import rlconnect as rc
    from rlconnect.envs import make_base_env

    config = rc.RunnerConfig(
        num_envs=args.num_envs,
        rollout_fragment_length=args.fragment,
        seed=args.seed,
        observation_filter=args.observation_filter,
    )
    env = make_base_env(_load_env(args.env), num_envs=args.num_envs, seed=args.seed)
    if env.is_multi_agent:
        raise SystemExit("rlconnect sample: multi-agent envs need a policy mapping; use the API")
    obs_space, act_space = _spaces_of(env)
    probe = rc.default_agent_pipeline(
        rc.ConnectorContext(obs_space, act_space, config.connector_config())
    )
    policy_space = probe.output_space
    if args.policy == "random":
        policy: rc.Policy = rc.RandomPolicy(policy_space, act_space, seed=args.seed)
    else:
        policy = rc.MLPPolicy(policy_space, act_space, seed=args.seed)
    return rc.EnvRunner(env, policy, config=config)


def _progress(done: int, total: int, start: float, episodes: int, mean_return: float) -> None:
    elapsed = time.perf_counter() - start
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else float("inf")
    width = 30
    filled = int(width * done / total)
    bar = "#" * filled + "-" * (width - filled)
    sys.stderr.write(
        f"\r[{bar}] {done:>9,}/{total:,} steps  {rate:>9,.0f} steps/s  "
        f"{episodes:>6,} episodes  mean return {mean_return:>8.2f}  ETA {eta:>5.1f}s"
    )
    sys.stderr.flush()


def cmd_sample(args: argparse.Namespace) -> int:
    """Collect ``--steps`` env steps and print a summary."""
    runner = _build_runner(args)
    start = time.perf_counter()
    steps, returns, lengths = 0, [], []
    try:
        while steps < args.steps:
            batch = runner.sample()
            steps += batch.env_steps() if hasattr(batch, "env_steps") else len(batch)
            for m in runner.get_metrics():
                returns.append(m["episode_reward"])
                lengths.append(m["episode_length"])
            recent = float(np.mean(returns[-100:])) if returns else float("nan")
            if not args.quiet:
                _progress(min(steps, args.steps), args.steps, start, len(returns), recent)
    finally:
        runner.stop()
    elapsed = time.perf_counter() - start
    if not args.quiet:
        sys.stderr.write("\n")
    perf = runner.perf_stats()
    rows = [
        ("env", args.env),
        ("sub-envs", str(args.num_envs)),
        ("policy", args.policy),
        ("env steps", f"{steps:,}"),
        ("time", f"{elapsed:.2f} s"),
        ("steps/s", f"{steps / elapsed:,.0f}"),
        ("episodes", f"{len(returns):,}"),
        ("mean return", f"{np.mean(returns):.2f}" if returns else "n/a"),
        ("mean length", f"{np.mean(lengths):.1f}" if lengths else "n/a"),
    ]
    rows += [
        (k.replace("mean_", "").replace("_ms", " (ms/step)"), f"{v:.4f}")
        for k, v in perf.items()
        if k != "connectors"
    ]
    width = max(len(k) for k, _ in rows)
    print("rlconnect sample summary")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a saved pipeline in human-readable form."""
    import json

    from rlconnect.checkpoints.pipelines import describe_pipeline_file

    try:
        print(json.dumps(describe_pipeline_file(args.path), indent=2, sort_keys=False))
    except FileNotFoundError:
        print(f"rlconnect inspect: no such file: {args.path}", file=sys.stderr)
        return 2
    except Exception as exc:  # a damaged file: report, don't trace back
        print(f"rlconnect inspect: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    parser = argparse.ArgumentParser(prog="rlconnect", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample", help="collect experience and print a summary")
    s.add_argument("--env", default="CartPole-v1", help="gymnasium id or module:function")
    s.add_argument("--num-envs", type=int, default=8)
    s.add_argument("--steps", type=int, default=20_000, help="env steps to collect")
    s.add_argument("--fragment", type=int, default=200, help="rollout_fragment_length")
    s.add_argument("--policy", choices=("random", "mlp"), default="mlp")
    s.add_argument(
        "--observation-filter", choices=("NoFilter", "MeanStdFilter"), default="NoFilter"
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sample)
    i = sub.add_parser("inspect", help="print a saved pipeline")
    i.add_argument("path")
    i.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlconnect`` console script."""
    args = build_parser().parse_args(argv)
    if getattr(args, "num_envs", 1) < 1 or getattr(args, "steps", 1) < 1:
        print("rlconnect: --num-envs and --steps must be >= 1", file=sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
