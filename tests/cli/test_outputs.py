"""What ``rlconnect sample --out / --plot`` writes, and what an interrupted run leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.cli.conftest import run_cli, user_env

import rlconnect as rc
from machine_speed import scaled

SMALL = ["--steps", "200", "--num-envs", "2", "--quiet"]


def test_out_writes_parquet_by_default_and_rlb_on_request(tmp_path: Path) -> None:
    done = run_cli("sample", *SMALL, "--out", str(tmp_path / "pq"))
    assert done.returncode == 0, done.stderr
    assert "parquet in" in done.stdout
    assert list((tmp_path / "pq").glob("*.parquet")) and not list((tmp_path / "pq").glob("*.rlb"))
    done = run_cli("sample", *SMALL, "--out", str(tmp_path / "rlb"), "--format", "rlb")
    assert done.returncode == 0, done.stderr
    assert "rlb in" in done.stdout and list((tmp_path / "rlb").glob("*.rlb"))
    # the same rows either way
    a = rc.concat_samples(list(rc.read_batches(tmp_path / "pq")))
    b = rc.concat_samples(list(rc.read_batches(tmp_path / "rlb")))
    assert len(a) == len(b) == 200
    for column in ("obs", "actions", "rewards", "eps_id"):
        assert (a[column] == b[column]).all()


WITHOUT_PYARROW = """
import sys
sys.modules["pyarrow"] = None  # as if the offline extra were not installed
from rlconnect.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_without_pyarrow_rlb_is_used_and_parquet_names_the_extra(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", WITHOUT_PYARROW, "sample", *SMALL, *args]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=scaled(120), env=user_env(), check=False
        )

    done = run("--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert "rlb in" in done.stdout and list((tmp_path / "a").glob("*.rlb"))
    done = run("--out", str(tmp_path / "b"), "--format", "parquet")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "pip install 'rlconnect[offline]'" in done.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("suffix", "magic"), [("svg", b"<?xml"), ("pdf", b"%PDF"), ("png", b"\x89PNG")]
)
def test_plot_format_follows_the_suffix(tmp_path: Path, suffix: str, magic: bytes) -> None:
    plot = tmp_path / f"returns.{suffix}"
    done = run_cli("sample", *SMALL, "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert plot.read_bytes().startswith(magic)
    assert f"({suffix})" in done.stdout


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-env-workers"])
def test_an_interrupted_run_leaves_a_folder_inspect_reads(tmp_path: Path, workers: int) -> None:
    """Ctrl-C in a terminal (SIGINT to the whole process group, env workers included):
    the batch in progress is finished, so the files hold exactly the counted steps."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlconnect", "sample", "--steps", "50000000", "--num-envs", "2"]
    env_workers = ["--env-workers", str(workers)] if workers else []
    proc = subprocess.Popen(
        [*cmd, "--fragment", "100", "--quiet", "--out", str(out), *env_workers],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=user_env(),
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(out.glob("*.parquet")), "no batch written within 120 s"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        stdout, stderr = proc.communicate(timeout=scaled(120))
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted (Ctrl-C)" in stdout and "Traceback" not in stderr
    assert "interrupted after" in stderr and stderr.count("\n") == 1
    run = json.loads((out / "run.json").read_text())
    assert run["summary"]["status"] == "interrupted"
    rows = sum(len(b) for b in rc.read_batches(out))
    assert rows == run["summary"]["env_steps"] > 0  # every counted step is in finished files
    assert (out / "checkpoint" / "manifest.json").is_file()
    shown = run_cli("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "status: interrupted" in shown.stdout and "sha256 ok" in shown.stdout


def test_a_second_ctrl_c_interrupts_at_once() -> None:
    from rlconnect.cli.sample import _CtrlC

    before = signal.getsignal(signal.SIGINT)  # SIG_IGN under a shell's background job
    with _CtrlC() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 10  # the handler runs at a bytecode boundary
        while not ctrl_c.pending and time.monotonic() < deadline:
            time.sleep(0.001)
        assert ctrl_c.pending  # the first one only asks the loop to stop
        with pytest.raises(KeyboardInterrupt):  # the second one, as its handler gets it
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) is before  # given back
