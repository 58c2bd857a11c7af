"""``rlconnect sample``: collect, then print a summary table; write batches, a checkpoint,
run.json and a plot.

Every path the command writes is checked before sampling starts. Ctrl-C (SIGINT) stops
sampling once the batch in progress is sampled, written and counted, so the files and the
summary agree (a second Ctrl-C stops at once and drops that batch); the checkpoint and
``run.json`` (``"status": "interrupted"``) are written, the summary is printed, and the
exit code is 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlconnect.cli import outputs
from rlconnect.cli.build import build_runner
from rlconnect.cli.progress import MEAN_RETURN_LABEL, MEAN_RETURN_LAST, Progress, time_shares
from rlconnect.cli.settings import resolve_settings
from rlconnect.cli.steps import EpisodeClock, LiveSteps
from rlconnect.errors import LoggerError
from rlconnect.runner.metrics import merge_metrics


class _Run:
    """What one ``rlconnect sample`` collected."""

    def __init__(self, num_envs: int) -> None:
        self.clock = EpisodeClock(num_envs)
        self.steps = 0
        self.batches = 0
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.return_steps: list[int] = []
        #: returns per agent and per policy (multi-agent envs), in episode order
        self.agent_returns: dict[str, list[float]] = {}
        self.policy_returns: dict[str, list[float]] = {}
        self.elapsed = 0.0
        self.interrupted = False
        #: ``runner.metrics()`` of every batch (a logger of the run's own), for run.json
        self.windows: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.windows.append(dict(record))

    def flush(self) -> None:
        """Nothing to flush: the records stay in memory."""

    def close(self) -> None:
        """Nothing to close: the records stay in memory until the run ends."""

    def record(self, metric: dict[str, Any], before: int) -> None:
        """One episode's metric record, from the batch after ``before`` env steps."""
        step = self.clock.ended(int(metric["env_id"]), int(metric["episode_length"]))
        if metric.get("episode_faulty"):
            return
        self.returns.append(float(metric["episode_reward"]))
        self.lengths.append(int(metric["episode_length"]))
        self.return_steps.append(min(max(step, before + 1), self.steps))
        by_policy: dict[str, float] = {}
        for (agent, pid), ret in metric.get("agent_rewards", {}).items():
            self.agent_returns.setdefault(str(agent), []).append(float(ret))
            by_policy[str(pid)] = by_policy.get(str(pid), 0.0) + float(ret)
        for pid, ret in by_policy.items():
            self.policy_returns.setdefault(pid, []).append(ret)

    def mean_return(self, last: int | None = MEAN_RETURN_LAST) -> float:
        if not self.returns:
            return float("nan")
        return float(np.mean(self.returns[-last:] if last else self.returns))


class _CtrlC:
    """While entered, a first SIGINT only sets ``pending`` (the loop stops at its next
    check); a second one raises ``KeyboardInterrupt`` at once. Outside the main thread,
    where handlers cannot be set, SIGINT raises as usual."""

    def __init__(self) -> None:
        self.pending = False
        self._old: Any = None

    def __enter__(self) -> _CtrlC:
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _collect(
    runner: Any,
    total: int,
    result: _Run,
    progress: Progress,
    write: Callable[[Any], Any] | None,
    live: LiveSteps,
) -> None:
    """Sample until ``total`` env steps, passing each batch to ``write``; Ctrl-C ends the
    run after the batch in progress is written and counted (a second one at once) and
    marks it interrupted."""
    start = time.perf_counter()
    ctrl_c = _CtrlC()
    try:
        with ctrl_c:
            _sample_until(runner, total, result, progress, write, ctrl_c, live)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        result.interrupted = result.interrupted or (ctrl_c.pending and result.steps < total)
        progress.close()
        result.elapsed = time.perf_counter() - start


def _sample_until(
    runner: Any,
    total: int,
    result: _Run,
    progress: Progress,
    write: Callable[[Any], Any] | None,
    ctrl_c: _CtrlC,
    live: LiveSteps,
) -> None:
    from rlconnect.batches import MultiAgentBatch

    while result.steps < total and not ctrl_c.pending:
        try:
            batch = runner.sample()
        except LoggerError as exc:  # the batch is built all the same; sampling goes on
            if exc.batch is None:
                raise
            batch = exc.batch
            print(f"rlconnect sample: warning: {exc}", file=sys.stderr)
        if write is not None:
            write(batch)
        before = result.steps
        result.steps += batch.env_steps() if isinstance(batch, MultiAgentBatch) else len(batch)
        result.batches += 1
        live.batch_done(result.steps)
        for m in runner.get_metrics():
            result.record(m, before)
        stats = runner.perf_stats()
        progress.update(result.steps, len(result.returns), result.mean_return(), stats)


def _prepare_outputs(args: argparse.Namespace, config: Any) -> tuple[Any, Any, Any, Any]:
    """Check every output path now: ``(config, out folder, batch format, plot format)``."""
    import attrs

    plot_format = outputs.check_plot(args.plot) if args.plot else None
    out = fmt = None
    if args.out:
        fmt = outputs.choose_format(args.format)
        out = outputs.check_out(args.out)
        if fmt == "parquet":  # the runner writes finished Parquet files as it samples
            config = attrs.evolve(config, output=str(out))
    return config, out, fmt, plot_format


def cmd_sample(args: argparse.Namespace) -> int:
    """Collect ``steps`` env steps; progress on stderr, a summary table on stdout."""
    run, config = resolve_settings(args)
    config, out, fmt, plot_format = _prepare_outputs(args, config)
    log_dir = outputs.check_log_dir(args.log_dir) if args.log_dir else None
    hints: list[str] = []
    runner = build_runner(run, config, hints)
    result = _Run(runner.num_envs)
    _add_loggers(runner, result, log_dir, hints)
    live = LiveSteps.of(runner)
    for hint in hints:
        print(f"rlconnect sample: hint: {hint}", file=sys.stderr)
    write = None
    if out is not None and fmt == "rlb":
        from rlconnect.offline import BatchWriter

        write = BatchWriter(out).write
    notes: list[tuple[str, str]] = []
    if log_dir is not None:
        notes.append(("metrics logs", f"{log_dir} (metrics.jsonl, metrics.csv, TensorBoard)"))
    progress = Progress(run["steps"], sys.stderr, enabled=not args.quiet, live_steps=live)
    try:
        _collect(runner, run["steps"], result, progress, write, live)
        if out is not None:
            runner.save_checkpoint(str(out / "checkpoint"))
            notes.append(("checkpoint", str(out / "checkpoint")))
    finally:
        perf = runner.perf_stats()
        runner.stop()
    if args.plot and plot_format:
        title = f"{run['env']}  ({run['policy']} policy)"
        try:
            outputs.plot_returns(result.returns, result.return_steps, title, args.plot, plot_format)
            notes.append(("returns plot", f"{args.plot} ({plot_format})"))
        except OSError as exc:  # checked before sampling, but a disk can fill up: keep the rest
            notes.append(("returns plot", f"FAILED: {args.plot}: {exc.strerror or exc}"))
    rows = _summary_rows(run, config, result, perf)
    rows[3:3] = _policy_rows(runner)
    if out is not None:
        rows.append(("batch files", f"{outputs.count_batch_files(out):,} {fmt} in {out}"))
        settings = {**run, "runner_config": _config_json(config)}
        outputs.write_run_json(out / "run.json", settings, _summary_json(result, run, perf))
    _print_table("rlconnect sample summary", rows + notes)
    if result.interrupted:
        print(
            f"rlconnect sample: interrupted after {result.steps:,} of {run['steps']:,} steps"
            + (f"; {out} holds what was collected" if out is not None else ""),
            file=sys.stderr,
        )
        return 130
    return 0


def _add_loggers(runner: Any, result: _Run, log_dir: Any, hints: list[str]) -> None:
    """The run's own record of every batch's metrics, and the loggers of ``--log-dir``."""
    try:
        runner.add_logger(result)
        for logger in outputs.make_loggers(log_dir, hints) if log_dir is not None else []:
            runner.add_logger(logger)
    except BaseException:
        runner.stop()
        raise


def _config_json(config: Any) -> Any:
    from rlconnect.offline.json_values import to_json_value

    return to_json_value(config.to_dict())


def _summary_rows(
    run: dict[str, Any], config: Any, r: _Run, perf: dict[str, Any]
) -> list[tuple[str, str]]:
    elapsed = max(r.elapsed, 1e-9)
    asked = f" (asked {run['steps']:,})" if r.steps != run["steps"] else ""
    rows = [
        ("env", run["env"]),
        ("sub-envs", str(config.num_envs)),
        ("policy", run["policy"]),
        ("observation filter", config.observation_filter),
        ("seed", str(config.seed)),
        ("status", "interrupted (Ctrl-C)" if r.interrupted else "complete"),
        ("env steps", f"{r.steps:,}{asked}"),
        ("batches", f"{r.batches:,} x {config.rollout_fragment_length * config.num_envs:,} steps"),
        ("time", f"{r.elapsed:.2f} s"),
        ("steps/s", f"{r.steps / elapsed:,.0f}"),
        ("episodes", f"{len(r.returns):,}"),
        (f"mean return (all {len(r.returns):,} episodes)", _fmt(r.mean_return(None))),
        (MEAN_RETURN_LABEL, _fmt(r.mean_return())),
        ("min / max return", _min_max(r.returns)),
        *_split_returns("agent", r.agent_returns),
        *_split_returns("policy", r.policy_returns),
        ("mean length", f"{np.mean(r.lengths):.1f}" if r.lengths else "n/a"),
    ]
    if len(r.returns) <= MEAN_RETURN_LAST:  # the mean over all of them says it already
        rows.remove((MEAN_RETURN_LABEL, _fmt(r.mean_return())))
    if config.preset:
        rows.insert(4, ("preset", config.preset))
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
    return rows


def _policy_rows(runner: Any) -> list[tuple[str, str]]:
    """Which agents each policy serves (multi-agent envs only)."""
    from rlconnect.cli.build import SharedPolicies

    mapping = runner.policy_mapping_fn
    if not isinstance(mapping, SharedPolicies):
        return []
    by_policy: dict[str, list[str]] = {}
    for agent, pid in mapping.policy_of_agent.items():
        by_policy.setdefault(pid, []).append(str(agent))
    return [(f"  {pid}", ", ".join(agents)) for pid, agents in by_policy.items()]


def _fmt(value: float) -> str:
    return f"{value:.2f}" if np.isfinite(value) else "n/a"


def _min_max(returns: list[float]) -> str:
    return f"{min(returns):.2f} / {max(returns):.2f}" if returns else "n/a"


def _split_returns(what: str, returns: dict[str, list[float]]) -> list[tuple[str, str]]:
    """``mean return of agent X`` rows (mean, min / max), when there is more than one
    agent or policy: a sum over agents (a zero-sum game's zeros) hides what each got."""
    if len(returns) < 2:
        return []
    return [
        (f"  {what} {key}", f"mean {_fmt(float(np.mean(v)))}  min / max {_min_max(v)}")
        for key, v in returns.items()
    ]


def _mean_by(returns: dict[str, list[float]]) -> dict[str, float] | None:
    if len(returns) < 2:
        return None
    return {k: float(np.mean(v)) for k, v in returns.items()}


def _summary_json(r: _Run, run: dict[str, Any], perf: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": "interrupted" if r.interrupted else "complete",
        "env_steps": r.steps,
        "env_steps_asked": run["steps"],
        "batches": r.batches,
        "seconds": round(r.elapsed, 3),
        "steps_per_second": round(r.steps / max(r.elapsed, 1e-9), 1),
        "episodes": len(r.returns),
        "mean_return": r.mean_return(None) if r.returns else None,
        f"mean_return_last_{MEAN_RETURN_LAST}": r.mean_return() if r.returns else None,
        **{
            f"mean_return_by_{what}": by
            for what, by in (
                ("agent", _mean_by(r.agent_returns)),
                ("policy", _mean_by(r.policy_returns)),
            )
            if by is not None
        },
        "time_shares": {k: round(v, 4) for k, v in time_shares(perf)},
        "metrics": merge_metrics(r.windows, parallel=False),
    }


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(title)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
