"""What the benchmarks share: a runner built for a workload, a policy that costs nothing,
contenders taking turns over rounds, medians with their ranges, and a table.

Wall times on a shared machine drift with whatever else runs, so every comparison here
alternates its contenders round by round (the order reversed every other round) and
reports the median of per-round figures with their range: load that lasts a round or more
hits both sides of a ratio.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

import rlconnect as rc
from rlconnect.envs import make_base_env
from rlconnect.policy.base import batch_size

__all__ = [
    "ConstantPolicy",
    "build_runner",
    "machine",
    "median_range",
    "print_table",
    "ratios",
    "sample_for",
    "take_turns",
]

T = TypeVar("T")


class ConstantPolicy(rc.Policy):
    """Acts with the first action of a ``Discrete`` space in every row, at the cost of a
    slice: with it, a timing measures rlconnect and the envs, not a policy."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, **kw: Any) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"ConstantPolicy acts in Discrete spaces, not {action_space}")
        super().__init__(observation_space, action_space, **kw)
        self._actions = np.full(4096, action_space.start, dtype=action_space.dtype)

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> Any:
        n = batch_size(input_batch)
        if n > len(self._actions):
            self._actions = np.full(n, self._actions[0])
        return self._actions[:n], [], {}


def build_runner(
    env: Any,
    num_envs: int,
    policy: Callable[[gym.Space, gym.Space], rc.Policy] = ConstantPolicy,
    fragment: int = 50,
    **config: Any,
) -> rc.EnvRunner:
    """An ``EnvRunner`` on ``num_envs`` sub-envs of ``env`` with the default pipelines and
    ``policy(obs_space, action_space)`` built for what the agent pipeline outputs."""
    cfg = rc.RunnerConfig(
        num_envs=num_envs, rollout_fragment_length=fragment, seed=0, check_env=False, **config
    )
    base = make_base_env(
        env,
        num_envs=num_envs,
        seed=0,
        env_config=cfg.env_config,
        preset=cfg.preset,
        remote_envs=cfg.remote_envs,
        num_env_workers=cfg.num_env_workers,
        env_poll_size=cfg.env_poll_size,
    )
    obs_space = base.observation_space(rc.DEFAULT_AGENT_ID)
    act_space = base.action_space(rc.DEFAULT_AGENT_ID)
    ctx = rc.ConnectorContext(obs_space, act_space, cfg.connector_config())
    out_space = rc.default_agent_pipeline(ctx).output_space
    return rc.EnvRunner(base, policy(out_space, act_space), config=cfg)


def sample_for(runner: rc.EnvRunner, seconds: float) -> tuple[int, float]:
    """``runner.sample()`` for about ``seconds``: (env steps, seconds). Each batch's episode
    records are taken as a training loop does (records nobody takes pile up)."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        steps += runner.sample().count
        runner.get_metrics()
    return steps, time.perf_counter() - t0


def take_turns(contenders: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Call every contender once per round, in reverse order every other round; what each
    returned, round by round."""
    results: dict[str, list[T]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name].append(contenders[name]())
    return results


def ratios(values: Sequence[float], to: Sequence[float]) -> list[float]:
    """``values[i] / to[i]``: a ratio per round."""
    return [a / b for a, b in zip(values, to, strict=True)]


def median_range(values: Sequence[float], fmt: str = ",.0f") -> str:
    """``median [min-max]``."""
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:{fmt}} [{low:{fmt}}-{high:{fmt}}]"


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns as wide as their widest cell; the first aligned left, the others right."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    for row in cells:
        first, *rest = row
        line = [first.ljust(widths[0])] + [c.rjust(w) for c, w in zip(rest, widths[1:])]
        print("  ".join(line).rstrip())


def machine() -> str:
    """One line on where the figures come from: CPUs, load, Python, numpy, date."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        model = names[0] if names else model
    return (
        f"{os.cpu_count()} CPUs ({model}), load {load:.2f}, Python {platform.python_version()}, "
        f"numpy {np.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
