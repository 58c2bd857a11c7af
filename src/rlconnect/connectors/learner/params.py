"""Checks of learner connector parameters: plain JSON numbers in range, named when wrong."""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_fraction", "check_positive", "check_steps"]


def _number(who: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{who}: {name} must be a number, got {value!r}")
    return float(value)


def check_fraction(who: str, name: str, value: Any) -> float:
    """``value`` as a float in [0, 1] (a discount or lambda)."""
    x = _number(who, name, value)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{who}: {name} must be in [0, 1], got {value!r}")
    return x


def check_positive(who: str, name: str, value: Any) -> float:
    """``value`` as a float > 0 (a clipping threshold)."""
    x = _number(who, name, value)
    if not x > 0.0:
        raise ValueError(f"{who}: {name} must be > 0, got {value!r}")
    return x


def check_steps(who: str, name: str, value: Any) -> int:
    """``value`` as an int >= 1 (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{who}: {name} must be an int >= 1, got {value!r}")
    return int(value)
