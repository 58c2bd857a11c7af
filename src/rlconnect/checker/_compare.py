"""Comparing what the pipeline checks recorded: traces, batches and statistics.

Each comparison says where two nests of arrays first differ (path, shape/dtype, or how
many values and an example), so a failing check names the member and the value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

from rlconnect.checker._errors import _fail
from rlconnect.checker._replay import Trace, _copy_leaf, _take
from rlconnect.connectors.pipeline import ConnectorPipeline


def _path_text(path: tuple) -> str:
    return "".join(f"[{p!r}]" for p in path)


def _diff(a: Any, b: Any) -> str | None:
    """None when two nests of arrays are exactly equal, else what differs first."""
    try:
        tree.assert_same_structure(a, b, check_types=False)
    except (ValueError, TypeError) as exc:
        return f": structure differs ({exc})"
    for (path, x), (_, y) in zip(tree.flatten_with_path(a), tree.flatten_with_path(b)):
        x, y = np.asarray(x), np.asarray(y)
        where = _path_text(path)
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{where}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        nan = x.dtype.kind in "fc"
        if np.array_equal(x, y, equal_nan=nan):
            continue
        if x.dtype == object:
            return f"{where}: {x!r} vs {y!r}"
        same = (x == y) | (np.isnan(x) & np.isnan(y)) if nan else x == y
        bad = np.argwhere(~np.asarray(same))
        first = tuple(int(i) for i in bad[0]) if bad.size else ()
        return (
            f"{where}: {len(bad)} of {x.size} values differ, e.g. at {first}: "
            f"{x[first].item()!r} vs {y[first].item()!r}"
        )
    return None


def _diff_rows(a: dict[str, Any], b: dict[str, Any], rows_a: Any, rows_b: Any) -> str | None:
    if list(a) != list(b) and set(a) != set(b):
        return f"columns differ: {sorted(a)} vs {sorted(b)}"
    for col in a:
        d = _diff(_take(a[col], rows_a), _take(b[col], rows_b))
        if d is not None:
            return f"column {col!r}{d}"
    return None


def _compare(
    check: str,
    pipe: ConnectorPipeline,
    got: Trace,
    want: Trace,
    rows: tuple[Any, Any],
    context: str,
    hint: str = "",
) -> None:
    """Raise at the first member whose output rows differ (its inputs were still equal)."""
    for (name, snap_a), (other, snap_b) in zip(got, want):
        if name != other:
            raise _fail(check, f"{context}: member names differ ({name!r} vs {other!r})")
        d = _diff_rows(snap_a, snap_b, *rows)
        if d is not None:
            raise _fail(check, f"{context}: {d}{hint}", pipe, name)


def _stats(pipe: ConnectorPipeline, check: str) -> dict[str, Any]:
    try:
        return tree.map_structure(_copy_leaf, pipe.get_statistics())
    except Exception as exc:
        raise _fail(check, f"get_statistics raised {type(exc).__name__}: {exc}") from exc


def _stats_diff(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, str] | None:
    """``(member, what)`` of the first member whose statistics differ."""
    for name in list(before) + [n for n in after if n not in before]:
        if name not in before or name not in after:
            return name, "statistics appeared or disappeared"
        d = _diff(before[name], after[name])
        if d is not None:
            return name, f"statistics{d}"
    return None
