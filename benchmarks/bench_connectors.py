"""What does a connector pipeline cost per call and per row, and what does batching save?

Pipelines timed (agent side, training mode, so MeanStdFilter updates its statistics):

- ``default Box(4)``: ``rc.default_agent_pipeline`` with ``observation_filter="MeanStdFilter"``
  and ``clip_rewards=True`` on a ``Box(4)`` observation space. Box observations are not
  flattened, so this chain is ``MeanStdFilter -> ClipReward``.
- ``Flatten+MeanStd+Clip Dict``: an explicit ``FlattenObservations -> MeanStdFilter ->
  ClipReward`` chain on a ``Dict(pos: Box(3), vel: Box(3), mode: Discrete(4))`` space.

For each pipeline and row count (1, 64, 1024 rows per call) the script times batches of
calls in this thread's CPU time (``time.thread_time``, which other processes disturb less
than wall time; the ``AgentData`` objects are built before the clock starts), takes the
median over repeats, and prints microseconds per call and per row, plus the batching
ratio: the time of 1024 one-row calls divided by the time of one 1024-row call (how much
a batched pipeline saves over calling it row by row).

    python benchmarks/bench_connectors.py            # full (~10 s)
    python benchmarks/bench_connectors.py --quick    # smoke run (~1 s)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from _common import machine

import rlconnect as rc
from rlconnect.spaces import stack_samples

ROWS = (1, 64, 1024)
DICT_SPACE = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        "vel": gym.spaces.Box(-5.0, 5.0, (3,), np.float32),
        "mode": gym.spaces.Discrete(4),
    }
)


def default_box_pipeline() -> rc.AgentConnectorPipeline:
    """The default agent pipeline on Box(4) with MeanStdFilter and sign-clipped rewards."""
    config = {"observation_filter": "MeanStdFilter", "clip_rewards": True}
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    ctx = rc.ConnectorContext(space, gym.spaces.Discrete(2), config=config)
    return rc.default_agent_pipeline(ctx)


def flatten_dict_pipeline() -> rc.AgentConnectorPipeline:
    """FlattenObservations -> MeanStdFilter -> ClipReward on a Dict observation space."""
    ctx = rc.ConnectorContext(DICT_SPACE, gym.spaces.Discrete(2))
    members = [rc.FlattenObservations(ctx), rc.MeanStdFilter(ctx), rc.ClipReward(ctx)]
    return rc.AgentConnectorPipeline(ctx, members)


PIPELINES: dict[str, Callable[[], rc.AgentConnectorPipeline]] = {
    "default Box(4)": default_box_pipeline,
    "Flatten+MeanStd+Clip Dict": flatten_dict_pipeline,
}


def _observations(space: gym.Space, n: int, seed: int = 0) -> Any:
    space.seed(seed)
    return stack_samples(space, [space.sample() for _ in range(n)])


def _batches(pipe: rc.AgentConnectorPipeline, rows: int, calls: int) -> list[rc.AgentData]:
    """``calls`` fresh AgentData objects of ``rows`` rows (connectors replace columns)."""
    obs = _observations(pipe.input_space, rows)
    if isinstance(pipe.input_space, gym.spaces.Box):
        obs = np.clip(obs, -10.0, 10.0)  # Box(-inf, inf) samples are normal; keep them tame
    env_ids = np.arange(rows, dtype=np.int64)
    agent_ids = ("agent0",) * rows
    rewards = np.random.default_rng(1).normal(size=rows).astype(np.float32)
    return [
        rc.AgentData.trusted(env_ids, agent_ids, {"obs": obs, "rewards": rewards})
        for _ in range(calls)
    ]


def time_per_call(
    make: Callable[[], rc.AgentConnectorPipeline], rows: int, *, repeats: int, budget_s: float
) -> float:
    """Median seconds per pipeline call on ``rows`` rows (each repeat runs ~``budget_s``)."""
    pipe = make()
    for data in _batches(pipe, rows, 20):  # warm up (and give MeanStdFilter statistics)
        pipe(data)
    t0 = time.thread_time()
    pipe(_batches(pipe, rows, 1)[0])
    one = max(time.thread_time() - t0, 1e-7)
    calls = int(min(max(budget_s / one, 5), 20_000))
    samples = []
    for _ in range(repeats):
        batch = _batches(pipe, rows, calls)
        start = time.thread_time()
        for data in batch:
            pipe(data)
        samples.append((time.thread_time() - start) / calls)
    return statistics.median(samples)


def run(quick: bool = False, rows: Sequence[int] = ROWS) -> list[dict[str, Any]]:
    """One result per (pipeline, rows): ``name, members, rows, us_per_call, us_per_row``."""
    repeats, budget = (3, 0.01) if quick else (7, 0.15)
    results = []
    for name, make in PIPELINES.items():
        members = " -> ".join(make().names)
        for n in rows:
            sec = time_per_call(make, n, repeats=repeats, budget_s=budget)
            results.append(
                {
                    "name": name,
                    "members": members,
                    "rows": n,
                    "us_per_call": sec * 1e6,
                    "us_per_row": sec * 1e6 / n,
                }
            )
    return results


def batching_ratio(results: list[dict[str, Any]], name: str, rows: int = 1024) -> float:
    """(``rows`` one-row calls) / (one ``rows``-row call) for pipeline ``name``."""
    by_rows = {r["rows"]: r["us_per_call"] for r in results if r["name"] == name}
    return rows * by_rows[1] / by_rows[rows]


def format_table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'pipeline':<28} {'rows':>5} {'µs/call':>10} {'µs/row':>9}",
        "-" * 55,
    ]
    for r in results:
        lines.append(
            f"{r['name']:<28} {r['rows']:>5} {r['us_per_call']:>10.1f} {r['us_per_row']:>9.3f}"
        )
    lines.append("")
    for name in PIPELINES:
        members = next(r["members"] for r in results if r["name"] == name)
        ratio = batching_ratio(results, name)
        lines.append(f"{name}: {members}")
        lines.append(f"  1024 one-row calls / one 1024-row call = {ratio:.1f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few, short repeats (smoke run)")
    args = parser.parse_args(argv)
    print(machine())
    results = run(quick=args.quick)
    print(format_table(results))
    print(
        "\nMedians of repeated timings in CPU time; shared or virtual machines vary "
        "5-15% between runs (more with --quick). Compare ratios, not absolute numbers."
    )


if __name__ == "__main__":
    main()
