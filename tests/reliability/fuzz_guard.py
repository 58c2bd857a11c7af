"""The invariant check of the hostile-input fuzz tests, and the figures they publish.

``Guard(target, allowed, marker_dir).run(load, what)`` calls ``load()`` once and checks:
only the target's documented errors are raised (any other exception fails the test), no
canary marker file appeared in ``marker_dir``, ``sys.modules`` gained no module outside
``allow_imports``, and the traced peak allocation (numpy included; pyarrow's pool too with
``arrow=True``) stayed under ``MEMORY_BOUND``. Every run is tallied per target;
``publish`` merges the tallies into ``fuzz_figures.json`` when ``RLCONNECT_WRITE_FIGURES=1``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MEMORY_BOUND", "TALLIES", "Guard", "Tally", "publish"]

FIGURES_PATH = Path(__file__).with_name("fuzz_figures.json")
MEMORY_BOUND = 64 << 20
"""Peak traced allocation allowed while loading one hostile input (64 MiB)."""


@dataclass
class Tally:
    """What one target's examples did."""

    tried: int = 0
    mutation_kinds: Counter = field(default_factory=Counter)  # mutation kind -> count
    rejected: Counter = field(default_factory=Counter)  # documented error type -> count
    accepted: int = 0  # the mutation left a loadable input
    other: Counter = field(default_factory=Counter)  # undocumented exception type -> count
    code_executed: int = 0
    new_modules: set = field(default_factory=set)
    peak_bytes: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """The tally as JSON values (one target of ``fuzz_figures.json``)."""
        return {
            "mutations_tried": self.tried,
            "mutation_kinds": dict(sorted(self.mutation_kinds.items())),
            "rejected_with_documented_error": sum(self.rejected.values()),
            "accepted_as_valid": self.accepted,
            "other_exceptions": sum(self.other.values()),
            "code_executed": self.code_executed,
            "unexpected_imports": sorted(self.new_modules),
            "peak_traced_bytes": self.peak_bytes,
            "error_types": dict(sorted(self.rejected.items())),
            "other_exception_types": dict(sorted(self.other.items())),
            "seconds": round(self.seconds, 2),
        }


TALLIES: dict[str, Tally] = {}
_lock = threading.Lock()


class Guard:
    """Runs hostile loads for one ``target`` and checks every invariant on each.

    ``allowed``: the documented exception types; ``marker_dir``: where canaries would
    write (it must stay empty); ``allow_imports``: module names a hostile load may add.
    """

    def __init__(
        self,
        target: str,
        allowed: tuple[type[BaseException], ...],
        marker_dir: Path,
        allow_imports: frozenset[str] = frozenset(),
        arrow: bool = False,
    ) -> None:
        self.target, self.allowed, self.marker_dir = target, allowed, marker_dir
        self.allow_imports, self.arrow = allow_imports, arrow
        self.tally = TALLIES.setdefault(target, Tally())
        self.last_peak = 0  # traced peak of the latest run, in bytes

    def run(self, load: Callable[[], Any], what: object, kind: str | None = None) -> str:
        """``load()`` once; the outcome (``"accepted"`` or the error type's name).

        ``what`` describes the input (shown on failure); ``kind`` is the mutation kind
        counted in the figures (default: the text of ``what`` up to its first ``(``).
        """
        kind = kind or str(what).split("(")[0]
        before = set(sys.modules)
        started = not tracemalloc.is_tracing()
        if started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        pool = _ArrowPool() if self.arrow else None
        t0 = time.perf_counter()
        outcome, leaked = "accepted", None
        try:
            load()
        except self.allowed as exc:
            outcome = type(exc).__name__
        except Exception as exc:  # the bug this suite looks for: recorded, then failed
            outcome, leaked = type(exc).__name__, exc
        finally:
            peak = tracemalloc.get_traced_memory()[1] - base
            if pool is not None:
                peak += pool.close()
            if started:
                tracemalloc.stop()
        secs = time.perf_counter() - t0
        self.last_peak = peak
        self._record(kind, outcome, leaked, peak, set(sys.modules) - before, secs)
        if leaked is not None:
            raise AssertionError(
                f"{self.target}: {what}: leaked {type(leaked).__name__}: {leaked}"
            ) from leaked
        self.check(what, peak, set(sys.modules) - before)
        return outcome

    def _record(
        self, kind: str, outcome: str, leaked: Any, peak: int, new: set, secs: float
    ) -> None:
        with _lock:
            t = self.tally
            t.tried += 1
            t.mutation_kinds[kind] += 1
            t.seconds += secs
            t.peak_bytes = max(t.peak_bytes, peak)
            t.new_modules |= new - self.allow_imports
            if self.code_ran():
                t.code_executed += 1
            if leaked is not None:
                t.other[outcome] += 1
            elif outcome == "accepted":
                t.accepted += 1
            else:
                t.rejected[outcome] += 1

    def code_ran(self) -> bool:
        return self.marker_dir.exists() and any(self.marker_dir.iterdir())

    def check(self, what: object, peak: int, new_modules: set) -> None:
        assert not self.code_ran(), f"{self.target}: {what}: a canary ran code"
        unexpected = sorted(new_modules - self.allow_imports)
        assert not unexpected, f"{self.target}: {what}: imported {unexpected}"
        assert peak < MEMORY_BOUND, f"{self.target}: {what}: traced peak {peak} B"


class _ArrowPool:
    """Routes pyarrow's allocations (invisible to tracemalloc) through a pool that keeps
    its own peak, until ``close()`` returns that peak.

    The pool is never freed: a buffer it allocated may outlive the example (a cache, a
    traceback), and freeing it into a destroyed pool would crash the process.
    """

    def __init__(self) -> None:
        import pyarrow as pa

        self._pa, self._previous = pa, pa.default_memory_pool()
        self._pool = pa.proxy_memory_pool(self._previous)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._pool))  # immortal
        pa.set_memory_pool(self._pool)

    def close(self) -> int:
        self._pa.set_memory_pool(self._previous)
        return int(self._pool.max_memory() or 0)


def publish(targets: list[str]) -> None:
    """Merge the tallies of ``targets`` into ``fuzz_figures.json`` (only when
    ``RLCONNECT_WRITE_FIGURES=1``), under the run's ``RLCONNECT_FUZZ_SCALE``: the CI run
    (scale 1) and deeper runs are kept side by side; other targets already there are kept.
    """
    if os.environ.get("RLCONNECT_WRITE_FIGURES") != "1":
        return
    scale = os.environ.get("RLCONNECT_FUZZ_SCALE", "1")
    doc: dict[str, Any] = {}
    if FIGURES_PATH.exists():
        try:
            doc = json.loads(FIGURES_PATH.read_text())
        except ValueError:
            doc = {}
    doc["memory_bound_bytes"] = MEMORY_BOUND
    run = doc.setdefault("runs", {}).setdefault(f"scale_{scale}", {"targets": {}})
    for name in targets:
        if name in TALLIES:
            run["targets"][name] = TALLIES[name].as_json()
    totals: Counter[str] = Counter()
    for entry in run["targets"].values():
        for key in (
            "mutations_tried",
            "rejected_with_documented_error",
            "accepted_as_valid",
            "other_exceptions",
            "code_executed",
        ):
            totals[key] += entry[key]
    run["totals"] = dict(totals)
    run["max_peak_traced_bytes"] = max(e["peak_traced_bytes"] for e in run["targets"].values())
    run["process_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    run["python"] = sys.version.split()[0]
    FIGURES_PATH.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
