"""``rlconnect sample``: collect, then print a summary table; write run.json and a plot."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.cli.errors import UsageError
from rlconnect.cli.progress import Progress, time_shares
from rlconnect.cli.settings import build_runner, resolve_settings


class _Run:
    """What one ``rlconnect sample`` collected."""

    def __init__(self) -> None:
        self.steps = 0
        self.batches = 0
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.return_steps: list[int] = []
        self.write_seconds = 0.0
        self.elapsed = 0.0

    def mean_return(self, last: int = 100) -> float:
        return float(np.mean(self.returns[-last:])) if self.returns else float("nan")


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before sampling if ``--out`` or ``--plot`` cannot be written."""
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(
                "--plot needs matplotlib: pip install 'rlconnect[plot]' (or matplotlib)"
            ) from None
        parent = Path(args.plot).resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--plot {args.plot!r}: folder {str(parent)!r} does not exist")
    if args.out:
        from rlconnect.offline import list_batch_files

        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {args.out!r} is a file, not a folder")
        if out.is_dir() and (list_batch_files(out) or (out / "checkpoint").exists()):
            raise UsageError(f"--out {args.out!r} already holds a run; choose a new folder")


def cmd_sample(args: argparse.Namespace) -> int:
    """Collect ``steps`` env steps; progress on stderr, a summary table on stdout."""
    from rlconnect.batches import MultiAgentBatch

    run, config = resolve_settings(args)
    _check_outputs(args)
    runner = build_runner(run, config)
    writer = None
    if args.out:
        from rlconnect.offline import BatchWriter

        writer = BatchWriter(args.out)
    total = run["steps"]
    progress = Progress(total, sys.stderr, enabled=not args.quiet)
    result = _Run()
    start = time.perf_counter()
    notes: list[str] = []
    try:
        try:
            while result.steps < total:
                batch = runner.sample()
                result.steps += (
                    batch.env_steps() if isinstance(batch, MultiAgentBatch) else len(batch)
                )
                result.batches += 1
                if writer is not None:
                    t0 = time.perf_counter()
                    writer.write(batch)
                    result.write_seconds += time.perf_counter() - t0
                for m in runner.get_metrics():
                    if m.get("episode_faulty"):
                        continue
                    result.returns.append(float(m["episode_reward"]))
                    result.lengths.append(int(m["episode_length"]))
                    result.return_steps.append(result.steps)
                progress.update(
                    result.steps, len(result.returns), result.mean_return(), runner.perf_stats()
                )
        finally:
            progress.close()
        result.elapsed = time.perf_counter() - start
        if args.out:
            notes.append(_save_checkpoint(runner, Path(args.out) / "checkpoint"))
    finally:
        perf = runner.perf_stats()
        runner.stop()
    if args.plot:
        _plot_returns(result, run, args.plot)
        notes.append(f"returns plot: {args.plot}")
    rows = _summary_rows(run, config, result, perf, writer)
    if args.out:
        _write_run_json(Path(args.out) / "run.json", run, config, result, perf)
    _print_table("rlconnect sample summary", rows + [("note", n) for n in notes])
    return 0


def _save_checkpoint(runner: Any, path: Path) -> str:
    if not hasattr(runner, "save_checkpoint"):
        return "checkpoint skipped: this EnvRunner has no save_checkpoint() yet"
    runner.save_checkpoint(str(path))
    return f"checkpoint: {path}"


def _summary_rows(
    run: dict[str, Any], config: Any, r: _Run, perf: dict[str, Any], writer: Any
) -> list[tuple[str, str]]:
    elapsed = max(r.elapsed, 1e-9)
    rows = [
        ("env", run["env"]),
        ("sub-envs", str(config.num_envs)),
        ("policy", run["policy"]),
        ("observation filter", config.observation_filter),
        ("seed", str(config.seed)),
        (
            "env steps",
            f"{r.steps:,}" + (f" (asked {run['steps']:,})" if r.steps != run["steps"] else ""),
        ),
        ("batches", f"{r.batches:,} x {config.rollout_fragment_length * config.num_envs:,} steps"),
        ("time", f"{r.elapsed:.2f} s"),
        ("steps/s", f"{r.steps / elapsed:,.0f}"),
        ("episodes", f"{len(r.returns):,}"),
        ("mean return", f"{np.mean(r.returns):.2f}" if r.returns else "n/a"),
        ("mean return (last 100)", f"{r.mean_return():.2f}" if r.returns else "n/a"),
        (
            "min / max return",
            f"{min(r.returns):.2f} / {max(r.returns):.2f}" if r.returns else "n/a",
        ),
        ("mean length", f"{np.mean(r.lengths):.1f}" if r.lengths else "n/a"),
    ]
    step_ms = sum(
        float(perf.get(k, 0.0))
        for k in (
            "mean_env_wait_ms",
            "mean_raw_obs_processing_ms",
            "mean_inference_ms",
            "mean_action_processing_ms",
        )
    )
    rows.append(("step time", f"{step_ms:.4f} ms per step of all {config.num_envs} sub-envs"))
    for name, share in time_shares(perf):
        label = name if name in ("env", "inference", "other") else f"connector {name}"
        rows.append((f"  {label}", f"{100 * share:5.1f} %"))
    if writer is not None:
        rows.append(
            (
                "batch files",
                f"{writer.num_written:,} in {writer.directory} ({r.write_seconds:.2f} s)",
            )
        )
    return rows


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(title)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def _write_run_json(
    path: Path, run: dict[str, Any], config: Any, r: _Run, perf: dict[str, Any]
) -> None:
    from rlconnect.checkpoints import atomic_write_bytes
    from rlconnect.offline.json_values import to_json_value

    doc = {
        "rlconnect": "sample",
        "settings": {**run, "runner_config": to_json_value(config.to_dict())},
        "summary": {
            "env_steps": r.steps,
            "batches": r.batches,
            "seconds": round(r.elapsed, 3),
            "steps_per_second": round(r.steps / max(r.elapsed, 1e-9), 1),
            "episodes": len(r.returns),
            "mean_return": float(np.mean(r.returns)) if r.returns else None,
            "mean_return_last_100": r.mean_return() if r.returns else None,
            "time_shares": {k: round(v, 4) for k, v in time_shares(perf)},
        },
    }
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def _plot_returns(r: _Run, run: dict[str, Any], path: str) -> None:
    """A PNG of episode returns over env steps, with a moving mean (Agg, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if r.returns:
        ax.plot(r.return_steps, r.returns, ".", ms=3, alpha=0.35, label="episode return")
        window = max(1, min(100, len(r.returns) // 10))
        mean = np.convolve(r.returns, np.ones(window) / window, mode="valid")
        ax.plot(r.return_steps[window - 1 :], mean, "-", lw=2, label=f"mean of last {window}")
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no finished episodes", ha="center", va="center")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(f"{run['env']}  ({run['policy']} policy)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
