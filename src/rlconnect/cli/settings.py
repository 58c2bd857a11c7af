"""Settings of ``rlconnect sample``: flags > ``--config`` TOML file > defaults; the env
and the EnvRunner they describe."""

from __future__ import annotations

import argparse
import importlib
import math
from typing import Any

from rlconnect.cli.errors import UsageError

DEFAULTS: dict[str, Any] = {
    "env": "CartPole-v1",
    "num_envs": 8,
    "steps": 20_000,
    "policy": "mlp",
    "seed": 0,
}
"""Defaults of ``rlconnect sample`` where they differ from ``RunnerConfig``'s."""

_RUN_KEYS = ("env", "steps", "policy")
_NOT_FROM_FILES = ("observation_fn",)


def _runner_fields() -> list[str]:
    import attrs

    from rlconnect.runner.config import RunnerConfig

    return [f.name for f in attrs.fields(RunnerConfig) if f.name not in _NOT_FROM_FILES]


def _read_config_file(path: str) -> dict[str, Any]:
    """The settings of a TOML file: keys of RunnerConfig plus env, steps, policy."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise UsageError("--config needs Python >= 3.11 or `pip install tomli`") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"config file {path!r} does not exist") from None
    except IsADirectoryError:
        raise UsageError(f"config file {path!r} is a folder") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path!r} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config file {path!r}: {exc}") from None
    allowed = [*_RUN_KEYS, *_runner_fields()]
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise UsageError(
            f"config file {path!r}: unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
        )
    return data


def resolve_settings(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """``(run settings, RunnerConfig)`` from flags > config file > defaults.

    Raises UsageError for a bad config file or setting.
    """
    from rlconnect.runner.config import RunnerConfig

    file_values = _read_config_file(args.config) if args.config else {}
    where = f" (in {args.config!r})" if args.config else ""
    flags = {
        "env": args.env,
        "steps": args.steps,
        "policy": args.policy,
        "num_envs": args.num_envs,
        "num_env_workers": getattr(args, "env_workers", None),
        "seed": args.seed,
        "observation_filter": args.observation_filter,
        "rollout_fragment_length": args.fragment,
    }
    merged = {**DEFAULTS, **file_values, **{k: v for k, v in flags.items() if v is not None}}
    run = {k: merged.pop(k) for k in _RUN_KEYS}
    if not isinstance(run["env"], str) or not run["env"]:
        raise UsageError(f"env must be a gymnasium id or module:function{where}")
    steps = run["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(f"steps={steps!r}: must be an integer >= 1{where}")
    if run["policy"] not in ("random", "mlp"):
        raise UsageError(f"policy={run['policy']!r}: allowed are 'random', 'mlp'{where}")
    if "rollout_fragment_length" not in merged:
        # at most 200 steps per sub-env and batch, sized to overshoot ``steps`` little
        num_envs = merged.get("num_envs", 1)
        if isinstance(num_envs, int) and not isinstance(num_envs, bool) and num_envs >= 1:
            per_env = math.ceil(steps / num_envs)
            merged["rollout_fragment_length"] = math.ceil(per_env / math.ceil(per_env / 200))
    try:
        config = RunnerConfig(**merged)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{exc}{where}") from None
    return run, config


def resolve_env(spec: str) -> Any:
    """A gymnasium id (checked now), or the env creator named by ``module:function``.

    ``module:EnvId`` (gymnasium's form: importing the module registers the id) works too.
    Raises UsageError for anything that does not name an env.
    """
    import gymnasium as gym

    env_id = spec
    if spec.startswith("envpool:"):  # an EnvPool task: the runner builds the pool
        return spec
    if ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # any error while importing the user's module
            raise UsageError(f"cannot import {module!r} for env {spec!r}: {exc}") from None
        creator = getattr(mod, attr, None)
        if callable(creator):
            return creator
        env_id = attr
    if env_id.startswith("ALE/"):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise UsageError(f"env {spec!r} needs ale-py: pip install ale-py") from None
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        hint = " (module:function names an env creator)" if ":" in spec else ""
        raise UsageError(f"unknown env {spec!r}: {exc}{hint}") from None
    return spec


def build_runner(run: dict[str, Any], config: Any) -> Any:
    """The EnvRunner for ``rlconnect sample``: default pipelines, one random or MLP policy."""
    import rlconnect as rc
    from rlconnect.envs import make_base_env

    env = make_base_env(
        resolve_env(run["env"]),
        num_envs=config.num_envs,
        seed=config.seed,
        env_config=config.env_config,
        worker_index=config.worker_index,
        remote_envs=config.remote_envs,
        num_env_workers=config.num_env_workers,
        env_poll_size=config.env_poll_size,
        horizon=config.horizon,
        soft_horizon=config.soft_horizon,
    )
    if env.is_multi_agent:
        env.close()
        raise UsageError(
            f"env {run['env']!r} is multi-agent: it needs a policy mapping, use the Python API"
        )
    obs_space = env.observation_space(rc.DEFAULT_AGENT_ID)
    act_space = env.action_space(rc.DEFAULT_AGENT_ID)
    ctx = rc.ConnectorContext(obs_space, act_space, config.connector_config())
    policy_space = rc.default_agent_pipeline(ctx).output_space
    policy_cls = rc.RandomPolicy if run["policy"] == "random" else rc.MLPPolicy
    policy = policy_cls(policy_space, act_space, seed=config.seed)
    return rc.EnvRunner(env, policy, config=config)
