"""The progress display fits the terminal: fields are dropped whole, never cut."""

from __future__ import annotations

import io

from rich.console import Console
from tests.cli.conftest import run_cli

from rlconnect.cli.progress import MEAN_RETURN_LABEL, Progress, fit_fields, format_eta

PERF = {
    "mean_env_wait_ms": 2.0,
    "mean_raw_obs_processing_ms": 1.0,
    "mean_inference_ms": 1.0,
    "mean_action_processing_ms": 0.0,
    "connectors": {"MeanStdFilter": 0.5, "ConvertToNumpy": 0.25},
}


def _progress(width: int) -> tuple[Progress, io.StringIO]:
    stream = io.StringIO()
    clock = iter([0.0] + [10.0] * 10).__next__  # 10 s in
    p = Progress(200_000, stream, console=Console(file=stream, width=width), clock=clock)
    p.update(84_000, 4_120, 21.345, PERF)
    return p, stream


def test_at_80_columns_nothing_is_cut_mid_word() -> None:
    wide = _progress(300)[0].render(300).plain
    _, stream = _progress(80)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines)
    words = set(wide.split())
    assert all(w in words for line in lines for w in line.split())
    text = "\n".join(lines)
    # the ETA is a time (116,000 steps left at 8,400 steps/s: 14 s), labelled return
    assert "ETA 0:00:14" in text and "8,400 steps/s" in text
    assert f"{MEAN_RETURN_LABEL} 21.34" in text and "42%" in text and "episodes 4,120" in text
    assert "time: env 50%  MeanStdFilter 12%  ConvertToNumpy 6%" in text  # per connector


def test_narrow_terminals_drop_the_least_important_fields_first() -> None:
    for width in (60, 40, 24):
        p, _ = _progress(width)
        lines = p.render(width).plain.splitlines()
        assert all(len(x) <= width for x in lines), (width, lines)
        assert lines[0].startswith("42%") and "ETA" in lines[0]
        assert lines[1].startswith("time: env 50%")
    assert fit_fields([(1, "a" * 5), (2, "b" * 5)], 4) == []


def test_eta_format() -> None:
    assert format_eta(5) == "0:00:05" and format_eta(3725) == "1:02:05"
    assert format_eta(float("inf")) == "--:--:--"


def test_the_command_fits_80_columns_in_a_log() -> None:
    done = run_cli("sample", "--steps", "2000", "--num-envs", "4", "--fragment", "50")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) >= 10 and all(len(x) <= 80 for x in lines)
    assert any("100%" in x and "mean return" in x for x in lines)
    # under 100 episodes both means are over all of them: one row, and the bar says no "last"
    episodes = int(done.stdout.split("episodes")[1].split()[0].replace(",", ""))
    assert episodes <= 100
    assert f"mean return (all {episodes} episodes)" in done.stdout
    assert MEAN_RETURN_LABEL not in done.stdout + done.stderr
