"""The progress bar of ``rlconnect sample`` and the time shares it shows."""

from __future__ import annotations

import math
import shutil
import time
from typing import Any, TextIO


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
