"""Deferred checks of the tensor path: record bad rows as tensors, read them once per sample.

On numpy a connector raises at the call that sees a bad value (a NaN for ``MeanStdFilter``,
an index out of range for ``FlattenObservations``). On tensors that needs a host read per
call, so the connector records the bad rows instead: ``record`` ORs a bool tensor into the
rows seen since the last check (with tensor operations only), ``flag()`` is a 0-d bool
tensor a runner reads with its own flags once per ``sample()``, and ``take()`` reads the
recorded rows on the host (one read) for the error message, then clears them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DeferredRows"]


class DeferredRows:
    """Bad rows (and, optionally, bad features per row) seen since the last ``take``."""

    def __init__(self) -> None:
        self._rows: Any = None  # bool tensor (R,), or None before the first tensor call
        self._features: Any = None  # bool tensor (R, F) when features are recorded
        self._env_ids: Any = None
        self._agent_ids: tuple = ()

    def record(self, bad_rows: Any, data: Any, bad_features: Any = None) -> None:
        """OR ``bad_rows`` (bool ``(R,)``, limited to ``data.mask``) into the record."""
        if data.mask is not None:
            bad_rows = bad_rows & data.mask
            if bad_features is not None:
                bad_features = bad_features & data.mask[:, None]
        same = self._rows is not None and self._rows.shape == bad_rows.shape
        if same and self._rows.device == bad_rows.device:
            self._rows = self._rows | bad_rows
            if bad_features is not None and self._features is not None:
                self._features = self._features | bad_features
        else:
            self._rows, self._features = bad_rows, bad_features
        self._env_ids, self._agent_ids = data.env_ids, data.agent_ids

    def flag(self) -> Any:
        """A 0-d bool tensor, True when a bad row was recorded; None before any record."""
        return None if self._rows is None else self._rows.any()

    def take(self) -> tuple[list[tuple[int, Any]], np.ndarray | None] | None:
        """``(keys of the bad rows, their bad features (rows, F) or None)``, read on the
        host, and clear the record; None when no row was bad."""
        if self._rows is None:
            return None
        rows = self._rows.cpu().numpy()
        features = None if self._features is None else self._features.cpu().numpy()
        env_ids = np.asarray(self._env_ids.cpu().numpy())
        self._rows = self._features = None
        if not rows.any():
            return None
        index = np.flatnonzero(rows)
        keys = [(int(env_ids[i]), self._agent_ids[i]) for i in index]
        return keys, None if features is None else features[index]
