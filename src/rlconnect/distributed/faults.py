"""What a RunnerGroup does when a remote runner fails: records, errors, options.

A remote runner *fails* when its actor dies (the process was killed, it crashed, its node
was lost), when ``sample()`` raises inside it (an env error beyond the sub-env restarts of
``RunnerConfig.restart_failed_sub_environments``), or when it gives no result within
``sample_timeout_s``. Every failure becomes one :class:`RunnerFailure` record; what happens
next is chosen by :class:`FaultTolerance`.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

__all__ = ["FaultTolerance", "RunnerFailedError", "RunnerFailure"]

#: restarts of one runner index are counted in 8 bits of its episode ids (see worker.py)
MAX_RESTARTS_LIMIT = 255


class RunnerFailedError(RuntimeError):
    """A remote runner failed and the group may not (or can no longer) work around it.

    The message names the runner index and the cause; ``failure`` holds the record and
    ``__cause__`` the original error (a ``ray.exceptions.RayError``).
    """

    def __init__(self, message: str, failure: RunnerFailure | None = None) -> None:
        super().__init__(message)
        self.failure = failure


def _non_negative_int(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name}={value!r}: must be an integer >= 0")
    if attribute.name == "max_runner_restarts" and value > MAX_RESTARTS_LIMIT:
        raise ValueError(f"max_runner_restarts={value!r}: at most {MAX_RESTARTS_LIMIT}")


def _bool(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name}={value!r}: must be True or False")


def _timeout(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    ok = value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    )
    if not ok:
        raise ValueError(f"{attribute.name}={value!r}: must be None or a number > 0")


@attrs.frozen(kw_only=True)
class FaultTolerance:
    """How a RunnerGroup reacts to a failed remote runner.

    With neither flag the failure raises :class:`RunnerFailedError`. With both, a runner
    is restarted while its budget lasts and skipped after that.
    """

    #: kill the failed actor and start a new one with the current weights, connector
    #: statistics and (after ``restore``) checkpoint; ``sample()`` then asks it again, so
    #: the batch keeps its promised size
    restart_failed_runners: bool = attrs.field(default=False, validator=_bool)
    #: restarts allowed per runner index; one more failure raises (or is skipped)
    max_runner_restarts: int = attrs.field(default=3, validator=_non_negative_int)
    #: drop the failed runner for good and return what the healthy runners produced
    ignore_runner_failures: bool = attrs.field(default=False, validator=_bool)
    #: a runner that gives no batch within this many seconds counts as failed (None: wait)
    sample_timeout_s: float | None = attrs.field(default=None, validator=_timeout)
    #: a runner that is not built within this many seconds (e.g. the cluster lacks the
    #: resources it asks for) raises RunnerFailedError instead of waiting forever
    start_timeout_s: float | None = attrs.field(default=180.0, validator=_timeout)


@attrs.frozen(kw_only=True)
class RunnerFailure:
    """One failure of one remote runner (see ``RunnerGroup.fault_metrics``)."""

    #: index of the remote runner (1..K)
    runner_index: int
    #: which start of that runner failed (0: the first, 1: after one restart, ...)
    incarnation: int
    #: the group call it failed in, e.g. "sample" or "sample_async"
    call: str
    #: the error's type name: "ActorDiedError", "EnvError", "GetTimeoutError", ...
    error_type: str
    #: the cause in one line: what the error said
    cause: str
    #: "restarted", "ignored" or "raised"
    action: str
    #: rows (steps, as counted by the config) the caller did not get because of it
    missing_rows: int

    def to_dict(self) -> dict[str, Any]:
        """The record as a plain dict (for logging)."""
        return attrs.asdict(self)


def describe_error(exc: BaseException) -> tuple[str, str]:
    """``(type name, one-line cause)`` of a Ray error, unwrapping task errors."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):  # an exception raised inside the actor
        lines = [ln.strip() for ln in str(inner).splitlines() if ln.strip()]
        return type(inner).__name__, _short(lines[0] if lines else "")
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Ray's actor-death message: a header, the actor's fields, then why it died.
    reason = next((ln for ln in lines if "because" in ln), lines[0] if lines else "")
    reason = reason.split(" Some common causes")[0].strip()
    where = [
        f"{key} {m.group(1)}" for key in ("pid", "ip") if (m := re.search(rf"{key}: (\S+)", text))
    ]
    return type(exc).__name__, _short(reason + (f" ({', '.join(where)})" if where else ""))


def _short(text: str) -> str:
    text = text or "(no message)"
    return text if len(text) <= 300 else text[:297] + "..."
