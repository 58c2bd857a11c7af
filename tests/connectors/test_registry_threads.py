"""The connector and lambda registries from several threads: a name goes to one class."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import uuid
from typing import Any

import pytest

import rlconnect.connectors.registry as registry
from rlconnect.connectors.action.clip_actions import ClipActions


def _line_of(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _meet_at(line: int, filename: str, barrier: threading.Barrier):
    """A trace function that makes each thread wait at ``line`` for the other one (until
    the barrier's deadline): the interleaving in which check-then-set races show."""

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and frame.f_code.co_filename == filename:
            # (broken at the deadline: the other thread cannot get here)
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
        return local

    def global_(frame, event, arg):
        return local if frame.f_code.co_filename == filename else None

    return global_


def _connector(name: str, i: int) -> None:
    registry.register_connector(name, type(f"RacedClip{i}", (ClipActions,), {}))


def _lambda(name: str, i: int) -> None:
    def fn(x):
        return x + i

    fn.__qualname__ = f"raced_fn_{i}"  # another definition for each thread
    registry.register_lambda(name, fn)


@pytest.mark.parametrize(
    ("register", "fn", "taking"),
    [
        (_connector, registry.register_connector, "_CONNECTORS[name] = klass"),
        (_lambda, registry.register_lambda, "_LAMBDAS[name] = fn"),
    ],
)
def test_two_threads_registering_one_name_cannot_both_win(register, fn, taking):
    """Two definitions registered under one free name from two threads at once: exactly
    one registration succeeds and the other raises, whatever the interleaving (both
    threads are held where the name is taken, until the other arrives or 1 s passes)."""
    line = _line_of(fn, taking)
    name = f"_raced_{uuid.uuid4().hex}"  # free in every run
    barrier = threading.Barrier(2, timeout=1.0)
    outcomes: list[str] = []

    def run(i: int) -> None:
        sys.settrace(_meet_at(line, registry.__file__, barrier))
        try:
            register(name, i)
            outcomes.append("registered")
        except ValueError:
            outcomes.append("refused")
        finally:
            sys.settrace(None)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(outcomes) == ["refused", "registered"]
