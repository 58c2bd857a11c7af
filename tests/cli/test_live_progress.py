"""On a terminal the progress display moves while a batch is being sampled, so a slow env
never looks hung: the command runs as a user runs it, its stderr on a pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.cli.conftest import user_env

HERE = Path(__file__).resolve().parent
BATCH = 150  # one batch of 150 steps of 20 ms: 3 s


def _run_on_a_terminal(args: list[str], cwd: Path, deadline_s: float = 120) -> tuple[str, int]:
    """``python -m rlconnect *args`` with stderr on a 160-column pseudo-terminal; returns
    what the terminal received and the exit code."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlconnect", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        cwd=cwd,
        env=user_env(COLUMNS="160", TERM="xterm-256color"),
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal (EIO on Linux)
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return b"".join(chunks).decode("utf-8", "replace"), code


def test_a_slow_env_moves_the_display_several_times_within_one_batch(tmp_path: Path) -> None:
    shutil.copy(HERE / "user_envs.py", tmp_path / "my_envs.py")
    args = ["sample", "--env", "my_envs:slow", "--num-envs", "1"]
    text, code = _run_on_a_terminal(
        [*args, "--steps", str(BATCH), "--fragment", str(BATCH)], tmp_path
    )
    assert code == 0, text[-2000:]
    shown = [int(n.replace(",", "")) for n in re.findall(r"([\d,]+)/150 steps", text)]
    within = sorted({n for n in shown if 0 < n < BATCH})
    # 3 s of one batch, redrawn 10 times a second: many counts between 0 and the batch end
    assert len(within) >= 5, (within, text[-2000:])
    assert shown == sorted(shown)  # never backwards
    assert shown[-1] == BATCH
