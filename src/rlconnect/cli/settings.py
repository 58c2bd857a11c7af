"""Settings of ``rlconnect sample``: flags > ``--config`` TOML file > defaults; the env
and the EnvRunner they describe."""

from __future__ import annotations

import argparse
import inspect
import math
import sys
from collections.abc import Callable
from typing import Any

from rlconnect.checkpoints.files import read_regular_file
from rlconnect.cli.errors import UsageError
from rlconnect.cli.imports import import_module

DEFAULTS: dict[str, Any] = {
    "env": "CartPole-v1",
    "num_envs": 8,
    "steps": 20_000,
    "policy": "mlp",
    "seed": 0,
}
"""Defaults of ``rlconnect sample`` where they differ from ``RunnerConfig``'s."""

MAX_CONFIG_FILE_BYTES = 1 << 20
"""A ``--config`` file larger than this is refused unread (as is a folder, FIFO or device)."""
_RUN_KEYS = ("env", "steps", "policy")
_NOT_FROM_FILES = ("observation_fn",)


def _runner_fields() -> list[str]:
    """RunnerConfig's keywords: its fields and its sections' settings (``output``...)."""
    from rlconnect.runner.config import RunnerConfig

    return [k for k in RunnerConfig.keywords() if k not in _NOT_FROM_FILES]


def _config_error(path: str) -> Callable[[str], UsageError]:
    return lambda msg: UsageError(f"config file {path!r}: {msg}")


def _read_config_file(path: str) -> dict[str, Any]:
    """The settings of a TOML file: keys of RunnerConfig plus env, steps, policy."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        try:
            import tomli as tomllib
        except ImportError:
            raise UsageError("--config needs Python >= 3.11 or `pip install tomli`") from None
    try:
        raw = read_regular_file(path, max_bytes=MAX_CONFIG_FILE_BYTES, fail=_config_error(path))
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path!r} does not exist") from None
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
        "preset": getattr(args, "preset", None),
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


class ZeroArgCreator:
    """An env creator ``f(env_context)`` over a function that takes no argument."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self, ctx: Any = None) -> Any:
        """Build the env, ignoring the ``EnvContext`` the runner passes."""
        return self.fn()


def _as_creator(fn: Callable[..., Any], spec: str) -> Callable[..., Any]:
    """``fn`` if it takes the env context, a :class:`ZeroArgCreator` if it takes nothing."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: assume f(ctx)
        return fn
    for args in ((None,), ()):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return fn if args else ZeroArgCreator(fn)
    raise UsageError(
        f"env creator {spec!r} takes {sig}: it must take no argument or one (the env context)"
    )


def resolve_env(spec: str) -> Any:
    """A gymnasium id (checked now), or the env creator named by ``module:function``.

    The function takes no argument or one (the env context), and may return a gymnasium
    env, an ``rc.MultiAgentEnv`` or a PettingZoo Parallel or AEC env. ``module:EnvId``
    (gymnasium's form: importing the module registers the id) works too. Modules in the
    current folder are importable. Raises UsageError for anything that does not name an env.
    """
    import gymnasium as gym

    env_id = spec
    if spec.startswith("envpool:"):  # an EnvPool task: the runner builds the pool
        try:
            import envpool  # noqa: F401
        except ImportError:
            raise UsageError(
                f"env {spec!r} needs EnvPool: pip install 'rlconnect[envpool]'"
            ) from None
        return spec
    if ":" in spec:
        module, _, attr = spec.partition(":")
        mod = import_module(module, f"env {spec!r}")
        creator = getattr(mod, attr, None)
        if callable(creator):
            return _as_creator(creator, spec)
        env_id = attr
    if env_id.startswith("ALE/"):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise UsageError(f"env {spec!r} needs ale-py: pip install 'rlconnect[atari]'") from None
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        hint = " (module:function names an env creator)" if ":" in spec else ""
        raise UsageError(f"unknown env {spec!r}: {exc}{hint}") from None
    return spec
