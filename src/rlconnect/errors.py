"""Named errors raised by rlconnect: each says what was wrong, where, and what to do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "CallbackError",
    "CheckpointError",
    "EnvCheckError",
    "EnvError",
    "EnvTimeoutError",
    "ExportError",
    "LoggerError",
    "PolicyError",
    "RunnerStateError",
    "UnknownConnectorError",
    "describe_exception",
    "did_you_mean",
    "import_hint",
]


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: message"`` for any exception, even one whose ``__str__`` raises.

    Error paths use it so that reporting an odd exception (no args, a constructor that
    needs extra arguments, a broken ``__str__``) can never fail in turn.
    """
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the error path
        try:
            text = repr(exc.args)
        except Exception:
            text = "<unprintable>"
    return f"{name}: {text}" if text else name


def import_hint(register: str) -> str:
    """What to do about a kind or connector this process has not registered: import the
    module that registers it with ``register`` before loading, in Python or on the
    command line."""
    return (
        f"Import the module that registers it ({register}) before loading: `import your_module` "
        "in Python, `--import your_module` on the rlconnect command line (the current "
        "folder is importable)"
    )


class CheckpointError(Exception):
    """A saved pipeline or checkpoint cannot be loaded (damaged, hostile, wrong version)."""


class UnknownConnectorError(KeyError):
    """A connector or lambda name is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ExportError(Exception):
    """A policy cannot be exported in the asked form: its kind cannot be rebuilt by name, or
    a pipeline member or model has no ONNX form; the message names it and what to do."""


class EnvError(RuntimeError):
    """An environment misbehaved (raised, returned bad data); the message names env and agent."""


class EnvCheckError(EnvError, ValueError):
    """An env returned data that does not fit its spaces (shape, dtype, bounds, NaN)."""


class EnvTimeoutError(EnvError, TimeoutError):
    """A sub-env in a worker process did not answer within ``RunnerConfig.sub_env_timeout_s``."""


class PolicyError(RuntimeError):
    """A policy raised in ``compute_actions`` or returned actions outside the action space;
    the message names the policy id (and the bad values, env ids and agent ids)."""


class CallbackError(RuntimeError):
    """A user callback raised; the message names the callback class and method."""


class RunnerStateError(RuntimeError):
    """``sample()`` was called on a runner whose earlier ``sample()`` raised midway.

    Its episodes were left half-processed, so it refuses to sample on; ``__cause__`` is
    the first error. Build a new runner (or restore one from a checkpoint).
    """


class LoggerError(OSError):
    """A metrics logger cannot write (a bad path, a full disk); ``path`` is its file or
    folder. Raised when the logger is made, or by ``runner.sample()`` once its batch is
    built: the batch is then this error's ``batch`` (and the metrics record it could not
    write its ``record``), and the runner samples on without that logger."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.batch: Any = None
        self.record: dict[str, Any] | None = None

    def __str__(self) -> str:  # (OSError's own would show errno fields)
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: object, known: Iterable[object]) -> str:
    """``" (did you mean 'x'?)"`` when one of ``known`` (an iterable of names) is close
    to ``name`` (difflib's ratio), else ``""``: appended to an error naming a misspelling."""
    import difflib  # only on error paths

    words = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), words, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
