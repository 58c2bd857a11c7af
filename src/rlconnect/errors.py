"""Named errors raised by rlconnect: each says what was wrong, where, and what to do."""

from __future__ import annotations

__all__ = ["CheckpointError", "EnvCheckError", "EnvError", "UnknownConnectorError"]


class CheckpointError(Exception):
    """A saved pipeline or checkpoint cannot be loaded (damaged, hostile, wrong version)."""


class UnknownConnectorError(KeyError):
    """A connector or lambda name is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class EnvError(RuntimeError):
    """An environment misbehaved (raised, returned bad data); the message names env and agent."""


class EnvCheckError(EnvError, ValueError):
    """An env returned data that does not fit its spaces (shape, dtype, bounds, NaN)."""
