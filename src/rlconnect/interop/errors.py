"""`InteropError`: a batch that the other library cannot take as it is."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlconnect.batches import SampleBatch

__all__ = ["InteropError", "import_peer", "single_agent", "with_columns"]


class InteropError(ValueError):
    """A batch (or the buffer it goes to) that the other library cannot take as it is; the
    message names the column or space and says what to change."""


def import_peer(module: str, extra: str) -> ModuleType:
    """Import an optional peer library, or ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is not installed: pip install 'rlconnect[{extra}]'") from exc


def single_agent(batch: object, what: str) -> SampleBatch:
    """``batch`` as a SampleBatch, or TypeError saying to pass one policy batch."""
    from rlconnect.batches import MultiAgentBatch, SampleBatch

    if isinstance(batch, MultiAgentBatch):
        raise TypeError(
            f"{what} takes a SampleBatch; for a MultiAgentBatch pass one of its "
            f"policy_batches ({sorted(batch.policy_batches)})"
        )
    if not isinstance(batch, SampleBatch):
        raise TypeError(f"{what} takes a SampleBatch, got {type(batch).__name__}")
    return batch


def with_columns(batch: SampleBatch, names: tuple[str, ...], what: str) -> None:
    """InteropError naming the columns of ``names`` that ``batch`` lacks."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise InteropError(
            f"{what} needs the columns {list(names)}; the batch lacks {missing} "
            f"(it has {sorted(batch.keys())})"
        )
