"""The ``rlconnect`` command: collect experience from an env and show what happened.

rlconnect sample  [--env CartPole-v1] [--num-envs 8] [--steps 20000] [--policy random|mlp]
                  [--observation-filter MeanStdFilter] [--config run.toml] [--seed 0]
                  [--out DIR] [--plot returns.png]
rlconnect inspect PATH   (a saved pipeline, batch files or folder, a checkpoint, a run folder)

``sample`` collects with the default pipelines, draws a progress bar on stderr and prints a
summary table on stdout. Settings come from, highest first: the flags, the ``--config``
TOML file (keys of ``RunnerConfig`` plus ``env``, ``steps``, ``policy``), the defaults.
``--out DIR`` writes every batch to ``DIR/batch-NNNNNN.rlb`` (read them back with
``rc.read_batches(DIR)``), the runner's checkpoint to ``DIR/checkpoint`` and the run's
settings and summary to ``DIR/run.json``.

Exit codes: 0 done, 1 a failure while running (one line; ``--traceback`` shows it all),
2 bad arguments, config file, env id or path (one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np

__all__ = ["build_parser", "main"]

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
_MAX_MANIFEST_BYTES = 16 << 20


class UsageError(Exception):
    """Bad arguments, config file, env id or path: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (plus where to find help), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --------------------------------------------------------------------------------- settings
def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not >= 0")
    return value


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


# ------------------------------------------------------------------------------------- envs
def resolve_env(spec: str) -> Any:
    """A gymnasium id (checked now), or the env creator named by ``module:function``.

    ``module:EnvId`` (gymnasium's form: importing the module registers the id) works too.
    Raises UsageError for anything that does not name an env.
    """
    import gymnasium as gym

    env_id = spec
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


# --------------------------------------------------------------------------------- progress
def time_shares(perf: dict[str, Any]) -> list[tuple[str, float]]:
    """Shares of the mean step time: env, each connector by name, inference, other."""
    env = float(perf.get("mean_env_wait_ms", 0.0))
    inference = float(perf.get("mean_inference_ms", 0.0))
    processing = float(perf.get("mean_raw_obs_processing_ms", 0.0)) + float(
        perf.get("mean_action_processing_ms", 0.0)
    )
    connectors = {str(k): float(v) for k, v in perf.get("connectors", {}).items()}
    total = env + inference + processing
    if total <= 0:
        return []
    other = max(processing - sum(connectors.values()), 0.0)
    parts = [("env", env), *connectors.items(), ("inference", inference), ("other", other)]
    return [(name, ms / total) for name, ms in parts]


def _format_shares(shares: list[tuple[str, float]]) -> str:
    return " ".join(f"{name} {100 * s:.0f}%" for name, s in shares)


class Progress:
    """A progress bar on ``stream``: redrawn in place on a terminal (at most 10 times a
    second), else one line at every further 10% of the steps."""

    def __init__(self, total: int, stream: TextIO, *, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and _isatty(stream)
        self.start = time.perf_counter()
        self._last_draw = -math.inf
        self._last_decile = 0
        self._drawn = False
        self._rows = 1

    def line(self, steps: int, episodes: int, mean_return: float, perf: dict[str, Any]) -> str:
        """The text of the bar for the given state."""
        elapsed = time.perf_counter() - self.start
        rate = steps / elapsed if elapsed > 0 else 0.0
        frac = min(steps / self.total, 1.0)
        width = 20
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        left = max(self.total - steps, 0)
        eta = f"ETA {left:,} steps"
        if rate > 0 and left:
            secs = left / rate
            eta += f" (~{secs:.1f}s)" if secs < 10 else f" (~{secs:,.0f}s)"
        ret = f"{mean_return:.2f}" if not math.isnan(mean_return) else "n/a"
        shares = _format_shares(time_shares(perf))
        return (
            f"[{bar}] {100 * frac:3.0f}% {min(steps, self.total):,}/{self.total:,} steps "
            f"{rate:,.0f} steps/s  {eta}  episodes {episodes:,}  mean return {ret}"
            + (f"  | time: {shares}" if shares else "")
        )

    def update(self, steps: int, episodes: int, mean_return: float, perf: dict[str, Any]) -> None:
        """Show the state after a batch (throttled as described in the class docstring)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        done = steps >= self.total
        if self.tty:
            if now - self._last_draw < 0.1 and not done:
                return
            self._last_draw = now
            text = self.line(steps, episodes, mean_return, perf)
            width = shutil.get_terminal_size((120, 24)).columns - 1
            # too wide: the time shares go on a second line (redrawn in place too)
            head, sep, shares = text.partition("  | ")
            rows = [text] if len(text) <= width or not sep else [head, "  " + shares]
            up = f"\x1b[{self._rows - 1}A" if self._rows > 1 else ""
            self.stream.write(up + "\r" + "\n".join(r[:width] + "\x1b[K" for r in rows))
            if self._rows > len(rows):  # clear a second line left from the last draw
                self.stream.write("\n\x1b[K\x1b[1A")
            self._rows = max(len(rows), 1)
            self._drawn = True
        else:
            decile = min(int(10 * steps / self.total), 10)
            if decile <= self._last_decile and self._drawn:
                return
            self._drawn = True
            self._last_decile = decile
            self.stream.write(self.line(steps, episodes, mean_return, perf) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line (terminal only)."""
        if self.tty and self._drawn:
            self._drawn = False
            self.stream.write("\n")
            self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# ----------------------------------------------------------------------------------- sample
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
    from rlconnect.offline.batch_files import to_json_value

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


# ---------------------------------------------------------------------------------- inspect
def peek_format(path: str) -> tuple[str, str] | None:
    """``(format, version)`` from an rlconnect container file's header, or None if the
    file is not one (nothing but the header is read or parsed)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return None
        n = int.from_bytes(head, "little")
        if n > 100_000_000:
            return None
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        meta = header["__metadata__"]
        return str(meta["format"]), str(meta.get("format_version", "?"))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError):
        return None


def _describe_pipeline(path: str) -> dict[str, Any]:
    from rlconnect.checkpoints.pipelines import describe_pipeline_file

    return describe_pipeline_file(path)


def _describe_container(path: str, fmt: tuple[str, str]) -> dict[str, Any]:
    """Any other rlconnect container (e.g. policy weights), verified: its structure with
    arrays shown by dtype and shape, and the number of values it holds."""
    import tree

    from rlconnect.checkpoints import load_nest
    from rlconnect.errors import CheckpointError

    if not fmt[1].isdecimal() or len(fmt[1]) > 9:
        raise CheckpointError(f"cannot load {path!r}: malformed format version {fmt[1][:20]!r}")
    _, nest = load_nest(path, format_name=fmt[0], versions={int(fmt[1])})
    sizes: list[int] = []

    def show(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            sizes.append(int(leaf.size))
            return f"{leaf.dtype}{list(leaf.shape)}"
        return leaf

    content = tree.map_structure(show, nest)
    return {
        "file": path,
        "format": f"{fmt[0]} v{fmt[1]}",
        "values": f"{sum(sizes):,} in {len(sizes)} arrays",
        "content": content,
    }


def _add_std(desc: dict[str, Any]) -> dict[str, Any]:
    """Pipelines: next to running ``count`` / ``mean`` / ``m2`` statistics, show ``std``."""
    for member in desc.get("members", []):
        state = member.get("params", {}).get("__state__")
        if not isinstance(state, dict) or not {"count", "m2"} <= set(state):
            continue
        try:
            count = float(state["count"]["values"][0])
            m2 = state["m2"]["values"]
            std = [math.sqrt(v / count) if count > 0 else 0.0 for v in m2 if v != "..."]
            state["std"] = {"array": state["m2"]["array"], "values": std + m2[len(std) :]}
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return desc


def _verify_manifest_files(folder: Path, manifest: Any) -> dict[str, str]:
    """Every ``{"path": ..., "sha256": ...}`` entry of the manifest, checked on disk."""
    import hashlib

    out: dict[str, str] = {}
    stack = [manifest]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            path, digest = node.get("path"), node.get("sha256")
            if isinstance(path, str) and isinstance(digest, str):
                target = (folder / path).resolve()
                if folder.resolve() not in target.parents:
                    out[path] = "BAD PATH (outside the checkpoint)"
                elif not target.is_file():
                    out[path] = "MISSING"
                else:
                    h = hashlib.sha256(target.read_bytes()).hexdigest()
                    out[path] = "sha256 ok" if h == digest else "SHA-256 MISMATCH"
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return dict(sorted(out.items()))


def _describe_file(path: str) -> dict[str, Any]:
    from rlconnect.checkpoints.pipelines import PIPELINE_FORMAT
    from rlconnect.errors import CheckpointError
    from rlconnect.offline import BATCH_FORMAT, summarize_batches

    fmt = peek_format(path)
    if fmt is None:
        raise CheckpointError(
            f"cannot load {path!r}: not an rlconnect file (no rlconnect header; damaged?)"
        )
    if fmt[0] == PIPELINE_FORMAT:
        return {"pipeline": _add_std(_describe_pipeline(path))}
    if fmt[0] == BATCH_FORMAT:
        return {"batches": summarize_batches(path)}
    return {"file": _describe_container(path, fmt)}


def _describe_checkpoint(folder: Path) -> dict[str, Any]:
    """A checkpoint folder: its manifest and every file in it, pipelines in full."""
    from rlconnect.checkpoints.pipelines import PIPELINE_FORMAT
    from rlconnect.errors import CheckpointError, UnknownConnectorError

    manifest_path = folder / "manifest.json"
    if manifest_path.stat().st_size > _MAX_MANIFEST_BYTES:
        raise CheckpointError(f"cannot load {str(manifest_path)!r}: implausibly large")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(
            f"cannot load {str(manifest_path)!r}: not valid JSON ({exc})"
        ) from None
    shown = dict(manifest) if isinstance(manifest, dict) else manifest
    if isinstance(shown, dict) and isinstance(shown.get("config"), dict):
        shown["config"] = _non_default_config(shown["config"]) or "defaults"
    out: dict[str, Any] = {"folder": str(folder), "manifest": shown, "files": {}}
    out["integrity"] = _verify_manifest_files(folder, manifest) or "no checksums in the manifest"
    problems: list[str] = []
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name.startswith(".") or p == manifest_path:
            continue
        rel = str(p.relative_to(folder))
        fmt = peek_format(str(p))
        try:
            if fmt is None:
                out["files"][rel] = f"{p.stat().st_size:,} bytes"
                continue
            desc = (
                _add_std(_describe_pipeline(str(p)))
                if fmt[0] == PIPELINE_FORMAT
                else _describe_container(str(p), fmt)
            )
            desc.pop("file", None)
            out["files"][rel] = desc
        except (CheckpointError, UnknownConnectorError) as exc:
            out["files"][rel] = f"DAMAGED: {exc}"
            problems.append(f"{rel} ({exc})")
    integrity = out["integrity"]
    if isinstance(integrity, dict):
        problems.extend(f"{k}: {v}" for k, v in integrity.items() if v != "sha256 ok")
    if problems:
        out["problems"] = problems
    return out


def describe_path(path: str) -> dict[str, Any]:
    """What ``rlconnect inspect`` shows, as JSON values.

    Raises UsageError for a missing path or a folder holding nothing rlconnect wrote,
    CheckpointError for a damaged file.
    """
    from rlconnect.offline import list_batch_files, summarize_batches

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file or folder: {path!r}")
    if p.is_file():
        if p.name == "manifest.json":
            return {"checkpoint": _describe_checkpoint(p.parent)}
        return _describe_file(path)
    out: dict[str, Any] = {}
    if (p / "run.json").is_file():
        out["run"] = _describe_run(p / "run.json")
    if list_batch_files(p):
        out["batches"] = summarize_batches(p)
    for candidate in (p, p / "checkpoint"):
        if (candidate / "manifest.json").is_file():
            out["checkpoint"] = _describe_checkpoint(candidate)
            break
    if not out:
        pipelines = [f for f in sorted(p.iterdir()) if f.is_file() and peek_format(str(f))]
        for f in pipelines:
            out[f.name] = _describe_file(str(f))
    if not out:
        raise UsageError(f"{path!r} holds no batch files, checkpoint, or saved pipelines to show")
    return out


def _non_default_config(config: dict[str, Any]) -> dict[str, Any]:
    """The RunnerConfig values (as in ``to_dict()``) that differ from the defaults."""
    from rlconnect.runner.config import RunnerConfig

    defaults = RunnerConfig().to_dict()
    return {k: v for k, v in config.items() if k not in defaults or defaults[k] != v}


def _describe_run(path: Path) -> Any:
    """run.json of ``sample --out``: settings, non-default runner config, summary."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        settings = dict(doc["settings"])
        config = settings.pop("runner_config")
        return {"settings": {**settings, **_non_default_config(config)}, "summary": doc["summary"]}
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return f"{path.name} is damaged"


def _is_array_summary(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"array", "values"}


def render(value: Any, indent: int = 0) -> list[str]:
    """Nested JSON values as indented ``key: value`` lines; arrays on one line."""
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if _is_array_summary(v):
                lines.append(f"{pad}{k}: {v['array']} {_inline(v['values'])}")
            elif (isinstance(v, dict) and v) or (
                isinstance(v, list) and v and not all(_scalar(x) for x in v)
            ):
                lines.append(f"{pad}{k}:")
                lines.extend(render(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_inline(v)}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict | list) and v and not _is_array_summary(v):
                lines.append(f"{pad}- [{i}]")
                lines.extend(render(v, indent + 1))
            else:
                lines.append(f"{pad}- {_inline(v)}")
    else:
        lines.append(f"{pad}{_inline(value)}")
    return lines


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def _inline(v: Any) -> str:
    if _is_array_summary(v):
        return f"{v['array']} {_inline(v['values'])}"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{}" if not v else json.dumps(v)
    return str(v)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a saved pipeline, batch files, a checkpoint or a run folder."""
    from rlconnect.errors import CheckpointError, UnknownConnectorError

    try:
        desc = describe_path(args.path)
    except (CheckpointError, UnknownConnectorError) as exc:
        print(f"rlconnect inspect: {exc}", file=sys.stderr)
        return 1
    except PermissionError as exc:
        raise UsageError(f"cannot read {args.path!r}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(desc, indent=2, default=str))
    else:
        print("\n".join(render(desc)))
    problems = desc.get("checkpoint", {}).get("problems")
    if problems:
        print(f"rlconnect inspect: damaged checkpoint: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    parser = _Parser(
        prog="rlconnect",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser(
        "sample",
        help="collect experience, show progress and a summary",
        description="Collect experience with the default pipelines. Flags override the "
        "--config file, which overrides the defaults.",
    )
    s.add_argument("--env", help="gymnasium id or module:function env creator (CartPole-v1)")
    s.add_argument("--num-envs", type=_positive_int, help="sub-environments (8)")
    s.add_argument("--steps", type=_positive_int, help="env steps to collect (20000)")
    s.add_argument(
        "--fragment", type=_positive_int, help="rollout_fragment_length (200, less for short runs)"
    )
    s.add_argument("--policy", choices=("random", "mlp"), help="policy (mlp)")
    s.add_argument("--observation-filter", choices=("NoFilter", "MeanStdFilter"), help="(NoFilter)")
    s.add_argument("--config", metavar="TOML", help="file of RunnerConfig keys, env, steps, policy")
    s.add_argument("--seed", type=_seed, help="base seed (0)")
    s.add_argument("--out", metavar="DIR", help="write batch files and a checkpoint to DIR")
    s.add_argument("--plot", metavar="PNG", help="save a plot of episode returns (matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    s.set_defaults(func=cmd_sample)
    i = sub.add_parser(
        "inspect",
        help="show a saved pipeline, batch files, a checkpoint or a run folder",
    )
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="print JSON instead of text")
    i.add_argument("--traceback", action="store_true", help="show the traceback of a failure")
    i.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlconnect`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"rlconnect {args.command}"
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return int(func(args))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, not a traceback, unless asked for
        if args.traceback or os.environ.get("RLCONNECT_TRACEBACK"):
            traceback.print_exc()
        else:
            msg = str(exc).splitlines()[0] if str(exc) else ""
            print(
                f"{prog}: failed: {type(exc).__name__}: {msg} (--traceback shows where)",
                file=sys.stderr,
            )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
