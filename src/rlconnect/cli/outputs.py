"""What ``rlconnect sample`` writes: every path checked before sampling, the batch format,
the returns plot (format from its suffix) and ``run.json``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.cli.errors import UsageError

PLOT_FORMATS = ("png", "svg", "pdf")
FORMATS = ("parquet", "rlb")
PARQUET_HINT = "pip install 'rlconnect[offline]' (or pyarrow)"


def has_pyarrow() -> bool:
    """True if the offline extra (pyarrow) is installed."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def _check_writable(folder: Path, what: str) -> None:
    """Create and remove a file in ``folder``: the only check that sees every reason."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rlconnect-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{what}: cannot write in {str(folder)!r} ({reason})") from None


def check_plot(plot: str) -> str:
    """The plot's format (from its suffix); its folder must exist and be writable."""
    suffix = Path(plot).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise UsageError(
            f"--plot {plot!r}: the suffix says the format, one of "
            f"{', '.join('.' + f for f in PLOT_FORMATS)}"
        )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'rlconnect[plot]'") from None
    path = Path(plot)
    if path.is_dir():
        raise UsageError(f"--plot {plot!r} is a folder")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise UsageError(f"--plot {plot!r}: folder {str(parent)!r} does not exist")
    _check_writable(parent, f"--plot {plot!r}")
    return suffix


def choose_format(requested: str | None) -> str:
    """``parquet`` when pyarrow is installed, else ``rlb``; a requested format is checked."""
    if requested is None:
        return "parquet" if has_pyarrow() else "rlb"
    if requested == "parquet" and not has_pyarrow():
        raise UsageError(f"--format parquet needs pyarrow: {PARQUET_HINT}")
    return requested


def check_out(out: str) -> Path:
    """Create ``--out`` (and its parents) now; it must be a new or empty folder we can write."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out!r} is a file, not a folder")
    if path.is_dir() and any(path.iterdir()):
        held = "already holds a run" if (path / "run.json").exists() else "is not empty"
        raise UsageError(f"--out {out!r} {held}; choose a new or empty folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--out {out!r}: cannot create the folder ({reason})") from None
    _check_writable(path, f"--out {out!r}")
    return path


LOG_FILES = ("metrics.jsonl", "metrics.csv")
TB_HINT = "pip install 'rlconnect[tensorboard]'"


def check_log_dir(log_dir: str) -> Path:
    """Create ``--log-dir`` (and its parents) now; it must be a folder we can write that
    holds no metrics logs yet (TensorBoard's other runs may share it)."""
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--log-dir {log_dir!r} is a file, not a folder")
    held = [name for name in LOG_FILES if (path / name).exists()]
    if held:
        raise UsageError(
            f"--log-dir {log_dir!r} already holds {held[0]} of another run; choose a new folder"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"--log-dir {log_dir!r}: cannot create the folder ({reason})") from None
    _check_writable(path, f"--log-dir {log_dir!r}")
    return path


def make_loggers(log_dir: Path, hints: list[str]) -> list[Any]:
    """The loggers of ``--log-dir``: JSON lines, CSV and (with tensorboard installed)
    TensorBoard event files, all in ``log_dir``; a hint when tensorboard is missing."""
    from rlconnect.loggers import CsvLogger, JsonlLogger, TensorBoardLogger

    loggers: list[Any] = [JsonlLogger(log_dir / LOG_FILES[0]), CsvLogger(log_dir / LOG_FILES[1])]
    try:
        loggers.append(TensorBoardLogger(log_dir))
    except ImportError:
        hints.append(f"--log-dir: no TensorBoard event files: tensorboard is missing ({TB_HINT})")
    return loggers


def count_batch_files(out: Path) -> int:
    """Finished batch files in ``out`` (either format)."""
    from rlconnect.offline import list_batch_files

    return len(list_batch_files(out))


def write_run_json(path: Path, settings: dict[str, Any], summary: dict[str, Any]) -> None:
    """``run.json``: the settings and the summary of the run, written atomically."""
    from rlconnect.checkpoints import atomic_write_bytes

    doc = {"rlconnect": "sample", "settings": settings, "summary": summary}
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


def plot_returns(returns: list[float], steps: list[int], title: str, path: str, fmt: str) -> None:
    """A figure of episode returns over the env step each ended at (``steps``), with a
    moving mean (Agg, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if returns:
        order = np.argsort(steps, kind="stable")  # by the env step each episode ended
        steps, returns = list(np.asarray(steps)[order]), list(np.asarray(returns)[order])
        ax.plot(steps, returns, ".", ms=3, alpha=0.35, label="episode return")
        window = max(1, min(100, len(returns) // 10))
        mean = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], mean, "-", lw=2, label=f"mean of last {window}")
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no finished episodes", ha="center", va="center")
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fig.savefig(tmp, format=fmt)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
