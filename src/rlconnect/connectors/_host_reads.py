"""Counting device-to-host reads on torch tensors, for tests of the tensor path.

A read is a call that needs a tensor's values on the host, which on an accelerator waits
for the device: ``item``, ``tolist``, ``numpy``, ``cpu``, ``bool(t)``, ``int(t)``,
``float(t)``, ``t.__index__``, ``np.asarray(t)``, ``nonzero`` (and ``torch.nonzero``,
``torch.unique``, ``masked_select``, one-argument ``torch.where``, and ``x[mask]`` with a
bool tensor mask: their result shape depends on the values). On a CPU-only machine these
are cheap, but the count is what a GPU run would pay, so tests on CPU catch them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["HOST_READS", "HostReadCounter"]

HOST_READS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__array__",
        "nonzero",
        "unique",
        "masked_select",
    }
)
"""Names of the tensor methods and torch functions counted as host reads."""


def _bool_index(args: tuple) -> bool:
    """``x[mask]`` with a bool tensor (alone or inside a tuple index)."""
    import torch

    if len(args) < 2:
        return False
    index = args[1]
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _counter_class() -> type:
    from torch.overrides import TorchFunctionMode

    class _Mode(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.reads: Counter[str] = Counter()

        def __torch_function__(
            self, func: Any, _types: Any, args: tuple = (), kwargs: dict | None = None
        ) -> Any:
            name = getattr(func, "__name__", "")
            if name == "__getitem__" and _bool_index(args):
                self.reads["x[bool mask]"] += 1
            elif name in HOST_READS or (name == "where" and len(args) + len(kwargs or {}) == 1):
                self.reads[name] += 1
            return func(*args, **(kwargs or {}))

    return _Mode


class HostReadCounter:
    """``with HostReadCounter() as reads: ...`` then ``reads.total`` and ``reads.by_name``.

    A ``torch.overrides.TorchFunctionMode`` sees every torch call made inside the block
    (by any code, in this thread) and counts those in ``HOST_READS``.
    """

    def __init__(self) -> None:
        self._mode: Any = None

    def __enter__(self) -> HostReadCounter:
        self._mode = _counter_class()()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)

    @property
    def by_name(self) -> Counter[str]:
        """Reads counted so far, by method or function name."""
        return Counter() if self._mode is None else Counter(self._mode.reads)

    @property
    def total(self) -> int:
        """Reads counted so far (inside the block, or in all once it ended)."""
        return sum(self.by_name.values())
