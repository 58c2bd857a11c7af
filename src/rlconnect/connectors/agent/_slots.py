"""A growable table of per-(env_id, agent_id) slots, shared by the stateful agent connectors.

Each connector that keeps per-agent state (frame stacks, previous actions, RNN states) owns
one ``SlotTable``. The table maps every row's ``(env_id, agent_id)`` key to an integer slot
and owns arrays (or nests of arrays) whose first axis is the slot axis, so a connector reads
and writes the state of all rows at once with fancy indexing::

    table = SlotTable()
    table.add("frames", np.zeros((0, k, *obs_shape), np.float32))
    slots, new = table.lookup(data.row_keys())   # new: rows whose key got a fresh slot
    frames = table["frames"]                      # (capacity, k, *obs_shape)
    ...
    table.reset(env_id)                           # frees every slot of that sub-env

Freed slots are reused; arrays grow (doubling) only when every slot is taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import tree

from rlconnect.connectors.base import RowKey

__all__ = ["SlotTable"]

_EMPTY_INT = np.zeros(0, dtype=np.intp)


class SlotTable:
    """Slots keyed by ``(env_id, agent_id)``, plus the arrays that hold their state."""

    def __init__(self, capacity: int = 8) -> None:
        self._capacity = max(int(capacity), 1)
        self._slot_of: dict[RowKey, int] = {}
        self._keys_of_env: dict[int, list[RowKey]] = {}
        self._free: list[int] = list(range(self._capacity - 1, -1, -1))  # pop() -> lowest
        self._arrays: dict[str, Any] = {}
        # fast path: the same keys as the last call give the same slots, none new
        self._last_keys: list[RowKey] | None = None
        self._last_slots = _EMPTY_INT

    # -- arrays ---------------------------------------------------------------------------
    def add(self, name: str, template: Any) -> None:
        """Hold a nest of arrays under ``name``; each leaf's first axis becomes the slot axis.

        ``template`` gives each leaf's per-slot shape and dtype (its first axis is ignored).
        """
        self._arrays[name] = tree.map_structure(
            lambda leaf: np.zeros((self._capacity, *np.shape(leaf)[1:]), np.asarray(leaf).dtype),
            template,
        )

    def __getitem__(self, name: str) -> Any:
        return self._arrays[name]

    @property
    def capacity(self) -> int:
        """Number of slots the arrays currently hold."""
        return self._capacity

    def __len__(self) -> int:
        """Number of slots in use."""
        return len(self._slot_of)

    def __contains__(self, key: object) -> bool:
        return key in self._slot_of

    def _grow(self, needed: int) -> None:
        new_cap = self._capacity
        while new_cap < needed:
            new_cap *= 2
        if new_cap == self._capacity:
            return

        def grow(leaf: np.ndarray) -> np.ndarray:
            out = np.zeros((new_cap, *leaf.shape[1:]), leaf.dtype)
            out[: leaf.shape[0]] = leaf
            return out

        self._arrays = {k: tree.map_structure(grow, v) for k, v in self._arrays.items()}
        self._free = list(range(new_cap - 1, self._capacity - 1, -1)) + self._free
        self._capacity = new_cap

    # -- lookup ---------------------------------------------------------------------------
    def lookup(self, keys: Sequence[RowKey]) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``keys`` (allocating unseen ones) and a bool mask of rows given a new slot.

        Raises:
            ValueError: when a key appears twice (one row per agent per call).
        """
        if keys is self._last_keys or keys == self._last_keys:
            return self._last_slots, np.zeros(len(keys), dtype=bool)
        slot_of = self._slot_of
        missing = [k for k in keys if k not in slot_of]
        if missing:
            if len(set(keys)) != len(keys):
                raise ValueError(f"duplicate (env_id, agent_id) rows in one call: {_dupes(keys)}")
            self._grow(len(slot_of) + len(missing))
            for key in missing:
                slot_of[key] = self._free.pop()
                self._keys_of_env.setdefault(key[0], []).append(key)
        slots = np.fromiter((slot_of[k] for k in keys), dtype=np.intp, count=len(keys))
        if not missing and len(np.unique(slots)) != len(slots):
            raise ValueError(f"duplicate (env_id, agent_id) rows in one call: {_dupes(keys)}")
        new = np.zeros(len(keys), dtype=bool)
        if missing:
            fresh = set(missing)
            new = np.fromiter((k in fresh for k in keys), dtype=bool, count=len(keys))
        self._last_keys = list(keys)
        self._last_slots = slots
        return slots, new

    def find(self, keys: Sequence[RowKey]) -> np.ndarray:
        """Slots of ``keys`` without allocating: -1 for keys that hold no slot."""
        if keys is self._last_keys or keys == self._last_keys:
            return self._last_slots
        get = self._slot_of.get
        return np.fromiter((get(k, -1) for k in keys), dtype=np.intp, count=len(keys))

    def reset(self, env_id: int) -> None:
        """Free every slot of sub-env ``env_id``; a reused slot's rows are flagged new."""
        keys = self._keys_of_env.pop(int(env_id), None)
        if not keys:
            return
        for key in keys:
            self._free.append(self._slot_of.pop(key))
        self._last_keys = None
        self._last_slots = _EMPTY_INT

    def clear(self) -> None:
        """Free every slot."""
        for env_id in list(self._keys_of_env):
            self.reset(env_id)


def _dupes(keys: Sequence[RowKey]) -> list[RowKey]:
    return sorted((k for k, n in Counter(keys).items() if n > 1), key=repr)
