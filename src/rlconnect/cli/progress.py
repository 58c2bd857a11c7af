"""The progress display of ``rlconnect sample`` (drawn with rich) and the time shares it shows.

Two lines: the progress (share done, ETA as a time, steps/s, episodes, the mean return of
the last 100 episodes, a bar) and where a step's time goes (the env, each connector by name,
inference). Each line is fitted to the terminal's width by dropping its least important
fields whole, so nothing is ever cut mid-word. On a terminal the lines are redrawn in place
(rich ``Live``, 10 times a second, from its own thread) and, given ``live_steps``, the step
count moves within a batch too, so a slow env never looks hung; otherwise (a log file, a
pipe) one line is printed at every further 10% of the steps.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

MEAN_RETURN_LAST = 100
"""The bar's mean return is over the last this many episodes (the summary says so too)."""
MEAN_RETURN_LABEL = f"mean return (last {MEAN_RETURN_LAST})"


def mean_return_label(episodes: int) -> str:
    """``mean return (last 100)`` once there are more episodes than that, else ``mean
    return`` (it is then over all of them)."""
    return MEAN_RETURN_LABEL if episodes > MEAN_RETURN_LAST else "mean return"


_SEP = "  "
_BAR_MIN, _BAR_MAX = 10, 30
_BAR_DONE, _BAR_LEFT = "━", "─"
_TIME_LABEL = "time: "


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


def format_eta(seconds: float) -> str:
    """``h:mm:ss`` of a time left (``--:--:--`` while unknown)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "--:--:--"
    return str(datetime.timedelta(seconds=round(seconds)))


def fit_fields(fields: list[tuple[int, str]], width: int) -> list[str]:
    """The fields that fit ``width`` when joined, in their order; the highest ``rank``
    (least important) goes first. Fields are dropped whole, never cut."""
    kept = list(fields)
    while kept and len(_SEP.join(text for _, text in kept)) > width:
        kept.remove(max(kept, key=lambda f: f[0]))
    return [text for _, text in kept]


class _Lines:
    """A renderable that fits the progress lines to the width rich gives it."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.progress.render(options.max_width)


class Progress:
    """The progress display on ``stream`` (see the module docstring).

    Args:
        total: env steps to collect.
        stream: where to draw (stderr).
        enabled: False draws nothing (``--quiet``).
        console: a rich Console to draw on instead of one over ``stream`` (tests).
        clock: seconds since some start (tests pass a fixed one).
        live_steps: env steps collected so far, read at every redraw (from rich's thread),
            so the display moves while a batch is being sampled; ``update`` still sets the
            exact count after each batch.
    """

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        enabled: bool = True,
        console: Console | None = None,
        clock: Callable[[], float] = time.perf_counter,
        live_steps: Callable[[], int] | None = None,
    ) -> None:
        self.clock = clock
        self.live_steps = live_steps
        self.total = total
        self.enabled = enabled
        self.console = console or Console(file=stream, highlight=False, soft_wrap=False)
        self.start = clock()
        self.state: tuple[int, int, float, dict[str, Any]] = (0, 0, math.nan, {})
        self._last_decile = -1
        self._live: Live | None = None
        if enabled and self.console.is_terminal:
            self._live = Live(
                _Lines(self),
                console=self.console,
                refresh_per_second=10,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def fields(self, width: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """``(progress fields, time-share fields)`` as ``(rank, text)``; lower ranks stay
        longer when the width is short. The bar fills the room the other fields leave."""
        steps, episodes, mean_return, perf = self.state
        if self.live_steps is not None:
            steps = max(steps, self.live_steps())
        elapsed = self.clock() - self.start
        rate = steps / elapsed if elapsed > 0 else 0.0
        frac = min(steps / self.total, 1.0)
        left = max(self.total - steps, 0)
        eta = left / rate if rate > 0 else (0.0 if not left else math.inf)
        ret = f"{mean_return:,.2f}" if math.isfinite(mean_return) else "n/a"
        main = [
            (1, f"{100 * frac:.0f}%"),
            (6, f"{min(steps, self.total):,}/{self.total:,} steps"),
            (3, f"{rate:,.0f} steps/s"),
            (2, f"ETA {format_eta(eta)}"),
            (5, f"episodes {episodes:,}"),
            (4, f"{mean_return_label(episodes)} {ret}"),
        ]
        room = width - len(_SEP.join(t for _, t in main)) - len(_SEP)
        if room >= _BAR_MIN:
            n = min(room, _BAR_MAX)
            main.insert(0, (7, _BAR_DONE * round(n * frac) + _BAR_LEFT * (n - round(n * frac))))
        # dropped from the end: "other", inference, then the connectors; the env stays
        timing = [
            (i, f"{name} {100 * share:.0f}%") for i, (name, share) in enumerate(time_shares(perf))
        ]
        return main, timing

    def render(self, width: int) -> Text:
        """The lines for the current state, fitted to ``width`` columns."""
        main, timing = self.fields(width)
        text = Text(no_wrap=True, overflow="ignore")
        for i, field in enumerate(fit_fields(main, width)):
            text.append(_SEP if i else "")
            if field.strip(_BAR_DONE + _BAR_LEFT):
                text.append(field)
            else:  # the bar
                done = len(field.rstrip(_BAR_LEFT))
                text.append(field[:done], "bar.complete").append(field[done:], "bar.back")
        shown = fit_fields(timing, width - len(_TIME_LABEL))
        if shown:
            text.append("\n" + _TIME_LABEL + _SEP.join(shown))
        return text

    def update(self, steps: int, episodes: int, mean_return: float, perf: dict[str, Any]) -> None:
        """Show the state after a batch (throttled as described in the module docstring)."""
        if not self.enabled:
            return
        self.state = (steps, episodes, mean_return, perf)
        if self._live is not None:  # rich redraws from ``self.state`` on its own thread
            return
        decile = min(int(10 * steps / self.total), 10)
        if decile > self._last_decile:
            self._last_decile = decile
            self.console.print(self.render(self.console.width))

    def close(self) -> None:
        """Leave the last state on screen (terminal) and stop redrawing."""
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
