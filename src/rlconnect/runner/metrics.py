"""Cheap per-step timers behind ``runner.perf_stats()``."""

from __future__ import annotations

__all__ = ["STAGES", "PerfTimers"]

STAGES = (
    "mean_env_wait_ms",
    "mean_raw_obs_processing_ms",
    "mean_inference_ms",
    "mean_action_processing_ms",
)


class PerfTimers:
    """Seconds accumulated per stage and the number of runner steps they cover."""

    __slots__ = ("seconds", "steps")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.steps = 0

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage``."""
        self.seconds[stage] += seconds

    def means(self) -> dict[str, float]:
        """Mean milliseconds per step of every stage."""
        n = max(self.steps, 1)
        return {k: 1000.0 * v / n for k, v in self.seconds.items()}
