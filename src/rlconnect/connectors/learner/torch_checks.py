"""The checks of learner connectors on tensors: one host read per call, or none.

On numpy a learner connector checks its inputs as it goes (finite rewards and values,
trajectories contiguous and in ``t`` order) and raises a ValueError naming the row, the
column and itself. On a device each such check would be a host read (the device waits
until the value reaches Python). So on tensors every check is a boolean *flag* on the
device, computed by a cheap whole-tensor test that is True whenever the check fails (and,
rarely, when it does not: a sum that overflows, eps_ids that do not grow), with a
function that, when the flag is set, makes the exact check on the host with the numpy
path's own functions and raises its named error, or returns if there is none. The flags
are read together:

- a connector called on its own reads its flags once, at its end (one host read), and
  raises before it adds any column, as on numpy;
- a :class:`~rlconnect.connectors.learner.pipeline.LearnerConnectorPipeline` reads the
  flags of all its members once, after the last one (one host read per pipeline call);
- inside ``with deferred_checks() as checks:`` nothing is read: the caller reads
  ``checks.raise_if_bad()`` when it chooses (a runner, with the host read it makes once
  per ``sample()`` anyway), so a call makes no host read at all. A batch that fails a
  deferred check has its columns already; the error is raised by ``raise_if_bad``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

__all__ = ["PendingChecks", "check_scope", "deferred_checks"]


@attrs.define
class PendingChecks:
    """Checks made on the device and not read yet: a flag (True: maybe failed) for each,
    and the function that makes the exact check on the host and raises its named error."""

    flags: list[torch.Tensor] = attrs.Factory(list)
    explain: list[Callable[[], None]] = attrs.Factory(list)

    def add(self, flag: torch.Tensor, explain: Callable[[], None]) -> None:
        """Add a check: ``flag`` (a bool tensor, any shape, True anywhere: maybe
        failed; not read here) and ``explain``, which raises the error if there is one."""
        self.flags.append(flag.any())
        self.explain.append(explain)

    def raise_if_bad(self) -> None:
        """Read every flag at once (one host read, none when there are no checks) and
        raise the error of the first check that fails on the host; the checks are cleared
        either way."""
        flags, explain = self.flags, self.explain
        self.flags, self.explain = [], []
        if not flags:
            return
        import torch  # (here: this module is imported with the pipelines, torch is not)

        device = flags[0].device
        failed = torch.stack([f.to(device) for f in flags]).tolist()  # the one host read
        _raise_for(failed, explain)

    def raise_for(self, values: list[bool]) -> None:
        """Raise the error of the first check that fails on the host, given the values of
        ``flags`` read by the caller (with a read of its own); the checks are cleared."""
        explain, self.flags, self.explain = self.explain, [], []
        _raise_for(values, explain)


def _raise_for(values: list[bool], explain: list[Callable[[], None]]) -> None:
    for bad, raise_error in zip(values, explain):
        if bad:
            raise_error()  # returns when the cheap test was a false alarm


_SCOPE: contextvars.ContextVar[PendingChecks | None] = contextvars.ContextVar(
    "rlconnect_learner_checks", default=None
)


@contextlib.contextmanager
def check_scope() -> Iterator[PendingChecks]:
    """The checks to add to: those of the enclosing scope when there is one (read by its
    owner), else new ones, read (one host read) when the block ends without an error."""
    outer = _SCOPE.get()
    if outer is not None:
        yield outer
        return
    checks = PendingChecks()
    token = _SCOPE.set(checks)
    try:
        yield checks
    finally:
        _SCOPE.reset(token)
    checks.raise_if_bad()


@contextlib.contextmanager
def deferred_checks() -> Iterator[PendingChecks]:
    """Learner connectors (and pipelines) called on tensors inside the block make no host
    read: their checks are collected in the yielded :class:`PendingChecks`, which the
    caller reads with ``raise_if_bad()`` (one host read for all of them)."""
    checks = PendingChecks()
    token = _SCOPE.set(checks)
    try:
        yield checks
    finally:
        _SCOPE.reset(token)
