"""MeanStdFilter: observations normalised by a running mean and standard deviation per feature.

Statistics are ``{"count", "mean", "m2"}`` (float64; ``m2`` is the sum of squared deviations
from the mean, so ``var = m2 / count``). Two sets of statistics merge exactly
(Chan et al.'s parallel update), which is how filters on several runners are synced::

    deltas = [f.get_delta() for f in filters]     # data each runner saw since the last sync
    for f in filters:
        f.reset_delta()
    total = merge_statistics([total, *deltas])    # exact: as if one filter saw everything
    for f in filters:
        f.set_statistics(total)

With ``freeze_between_syncs=True`` a filter normalises with *frozen* statistics, fixed at
the last sync point, while its data still accumulates into the totals and the delta. Then
what a runner outputs depends only on the raw data and the sync points, not on how the
data was split between runners (see docs/scaling.md, "The staleness rule").

On the tensor path the statistics live as float64 tensors on the observations' device
(float32 on Apple's ``mps``, which has no float64) and update there, from the rows where
``data.mask`` is True; they are saved, merged and loaded in the numpy format above, so a
filter trained on a GPU restores on a CPU-only machine and the other way round (they move
to the data's device at its first call, or with ``to(device)``). The NaN/inf check is
deferred there: rows with a non-finite value are left out of the statistics and recorded,
``pending_nonfinite()`` (also ``pending_flag()``) is a 0-d bool tensor the runner reads
once per ``sample()``, and ``raise_pending()`` raises the ValueError naming the rows'
(env_id, agent_id) and features.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlconnect.connectors._deferred import DeferredRows
from rlconnect.connectors._tensors import holds_tensors
from rlconnect.connectors.base import AgentData, ObservationConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import describe_space

__all__ = ["MeanStdFilter", "empty_statistics", "merge_statistics"]

_MAX_ROWS_SHOWN = 5
_MAX_FEATURES_SHOWN = 6
_FROZEN_KEY = "frozen"

Stats = tuple[float, np.ndarray, np.ndarray]


def empty_statistics(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Statistics of no data: count 0, zero mean and m2."""
    return {
        "count": np.zeros((), np.float64),
        "mean": np.zeros(shape, np.float64),
        "m2": np.zeros(shape, np.float64),
    }


def _combine(a: Stats, b: Stats) -> Stats:
    """Chan et al.: statistics of the union of two data sets from those of each."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    if n_b == 0:
        return a
    if n_a == 0:
        return b
    n = n_a + n_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    return n, mean, m2


def _unpack(stats: Mapping[str, Any], where: str) -> Stats:
    missing = {"count", "mean", "m2"} - set(stats)
    if missing:
        raise ValueError(f"{where}: statistics lack {sorted(missing)}; got {sorted(stats)}")
    count = float(np.asarray(stats["count"]))
    mean = np.asarray(stats["mean"], np.float64)
    m2 = np.asarray(stats["m2"], np.float64)
    if mean.shape != m2.shape:
        raise ValueError(f"{where}: mean has shape {mean.shape} but m2 has {m2.shape}")
    if not count >= 0:
        raise ValueError(f"{where}: count must be >= 0, got {count}")
    return count, mean, m2


def _pack(count: float, mean: np.ndarray, m2: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "count": np.asarray(count, np.float64),
        "mean": np.array(mean, np.float64),
        "m2": np.array(m2, np.float64),
    }


def merge_statistics(stats: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Combine statistics exactly: the result equals one filter fed all their data.

    Raises:
        ValueError: for an empty list, missing keys or differing feature shapes.
    """
    if not stats:
        raise ValueError("merge_statistics needs at least one set of statistics")
    parts = [_unpack(s, f"merge_statistics[{i}]") for i, s in enumerate(stats)]
    shapes = {p[1].shape for p in parts}
    if len(shapes) > 1:
        raise ValueError(f"merge_statistics: feature shapes differ: {sorted(shapes)}")
    total = parts[0]
    for p in parts[1:]:
        total = _combine(total, p)
    return _pack(*total)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _more(total: int, shown: int, what: str) -> str:
    return f" and {total - shown} more{what}" if total > shown else ""


def _batch_moments(x: np.ndarray) -> Stats:
    mean = x.mean(axis=0)
    dev = x - mean
    return float(len(x)), mean, np.einsum("i...,i...->...", dev, dev)


def _numpy_stats(stats: Any) -> Stats:
    """Statistics held as tensors (or numpy) as numpy: ``(float, array, array)``; tensors
    are read on the host in one transfer."""
    count, mean, m2 = stats
    if isinstance(mean, np.ndarray):
        return stats
    import torch

    flat = torch.cat([count.reshape(1), mean.reshape(-1), m2.reshape(-1)]).cpu().numpy()
    size = mean.numel()
    shape = tuple(mean.shape)
    return float(flat[0]), flat[1 : 1 + size].reshape(shape), flat[1 + size :].reshape(shape)


def _tensor_stats(stats: Any, device: Any) -> Any:
    """Statistics as tensors on ``device`` (float64; float32 on ``mps``)."""
    import torch

    dtype = torch.float32 if device.type == "mps" else torch.float64
    return tuple(torch.as_tensor(np.asarray(x), dtype=dtype, device=device) for x in stats)


def _tensor_moments(x: Any, weight: Any) -> Any:
    """``(count, mean, m2)`` of the rows of ``x`` where ``weight`` (bool ``(R,)``) is True."""
    import torch

    w = weight.reshape(-1, *([1] * (x.dim() - 1)))
    x = torch.where(w, x, 0.0)  # a NaN row times 0 would stay NaN
    n = weight.to(x.dtype).sum()
    mean = x.sum(dim=0) / n.clamp(min=1.0)
    dev = torch.where(w, x - mean, 0.0)
    return n, mean, (dev * dev).sum(dim=0)


def _combine_tensors(a: Any, b: Any) -> Any:
    """``_combine`` without a branch on the counts (an empty side adds nothing)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    safe = n.clamp(min=1.0)
    delta = mean_b - mean_a
    return n, mean_a + delta * (n_b / safe), m2_a + m2_b + delta * delta * (n_a * n_b / safe)


def _same(a: Stats, b: Stats) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])


@register_connector("MeanStdFilter")
class MeanStdFilter(ObservationConnector):
    """Normalises ``obs`` per feature: ``clip((obs - mean) / (std + epsilon), -clip, clip)``.

    The statistics are updated with the batch first, then the batch is normalised with the
    updated statistics (so the first batch is normalised by its own mean and std). They
    update only when ``update`` is true and the connector is in training mode
    (``in_eval()`` freezes them). With no data yet (count 0) mean is 0 and std 1. The
    variance is the population variance ``m2 / count``.

    With ``freeze_between_syncs=True`` the filter normalises with *frozen* statistics
    instead (``get_statistics()["frozen"]``); the batch still updates the totals and the
    delta, but not what it is normalised by. The frozen statistics become the totals at
    each sync point: ``set_statistics()`` (a group's ``sync_connector_states()``,
    ``set_connector_states()``, a restore) and ``refreeze()``, which a runner calls at the
    start of every ``sample()``. ``refreeze()`` does nothing when the filter handed its new
    data over with ``reset_delta()`` (as remote runners of a ``RunnerGroup`` do after each
    batch): that data returns through the next sync instead.

    Needs a float Box input (put FlattenObservations before it for other spaces); outputs
    ``Box(-clip, clip, shape, float32)``. A NaN or inf in ``obs`` raises ValueError naming
    the rows' (env_id, agent_id) and features, and leaves the statistics untouched (on
    torch tensors: see the module docstring, the check is deferred).

    Args:
        clip: bound of the normalised output (a positive number).
        epsilon: added to the standard deviation before dividing.
        update: False keeps the statistics fixed (e.g. loaded from a checkpoint).
        freeze_between_syncs: normalise with the statistics of the last sync point.
    """

    takes_tensors = True

    def __init__(
        self,
        ctx: Any,
        clip: float = 10.0,
        epsilon: float = 1e-8,
        update: bool = True,
        freeze_between_syncs: bool = False,
    ) -> None:
        if not (_is_number(clip) and clip > 0):
            raise ValueError(f"MeanStdFilter: clip must be a positive number, got {clip!r}")
        if not (_is_number(epsilon) and epsilon >= 0):
            raise ValueError(f"MeanStdFilter: epsilon must be a number >= 0, got {epsilon!r}")
        for key, value in (("update", update), ("freeze_between_syncs", freeze_between_syncs)):
            if not isinstance(value, bool):
                raise ValueError(f"MeanStdFilter: {key} must be a bool, got {value!r}")
        # saved only when set, so that default filters save exactly what they always did
        extra = {"freeze_between_syncs": True} if freeze_between_syncs else {}
        super().__init__(ctx, clip=float(clip), epsilon=float(epsilon), update=update, **extra)
        self.clip, self.epsilon, self.update = float(clip), float(epsilon), update
        self.freeze_between_syncs = freeze_between_syncs
        self._shape: tuple[int, ...] | None = None
        self._total: Stats = (0.0, np.zeros(()), np.zeros(()))
        self._delta: Stats = self._total
        self._frozen: Stats = self._total  # what frozen mode normalises with
        self._kept = False  # frozen mode: data seen since the last sync point, not handed over
        self._pending: Mapping[str, Any] | None = None  # statistics set before binding
        self._device: Any = None  # None: the statistics are numpy; else their torch device
        self._nonfinite = DeferredRows()  # the tensor path's deferred NaN/inf check

    # -- spaces ---------------------------------------------------------------------------
    def output_space(self, input_space: gym.Space) -> gym.Space:
        """A float32 Box ``[-clip, clip]`` of the input's shape; ValueError unless the input
        is a float Box (flatten other spaces first)."""
        if not (isinstance(input_space, gym.spaces.Box) and input_space.dtype.kind == "f"):
            raise ValueError(
                f"MeanStdFilter needs a float Box, got {describe_space(input_space)}; "
                "add FlattenObservations before it"
            )
        return gym.spaces.Box(-self.clip, self.clip, input_space.shape, np.float32)

    def setup(self, input_space: gym.Space) -> None:
        """Fresh statistics for a new observation shape (kept for the same one); statistics
        set before binding are applied now."""
        shape = tuple(input_space.shape or ())
        if shape != self._shape:
            self._shape = shape
            self._device = None
            self._total = _unpack(empty_statistics(shape), "MeanStdFilter")
            self._delta = self._frozen = self._total
            self._kept = False
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.set_statistics(pending)

    def _ensure_bound(self) -> tuple[int, ...]:
        if self._shape is None:
            self.input_space  # noqa: B018  (binds to the context's observation space)
        return cast("tuple[int, ...]", self._shape)  # bound just above

    # -- running --------------------------------------------------------------------------
    def __call__(self, data: AgentData) -> AgentData:
        """In training (with ``update``), add the batch to the running statistics; then
        normalise ``column``. Non-finite observations raise ValueError (deferred on tensors)."""
        shape = self._ensure_bound()
        if holds_tensors(data[self.column]):
            return self._call_tensors(data, shape)
        if self._device is not None:
            self._move(None)
        obs = np.asarray(data[self.column], np.float64)
        if obs.shape[1:] != shape:
            raise ValueError(
                f"MeanStdFilter: obs rows have shape {obs.shape[1:]}, expected {shape}"
            )
        finite = np.isfinite(obs)
        if not finite.all():
            raise ValueError(self._non_finite_message(data, obs, finite))
        if self.update and self.is_training and len(obs):
            batch = _batch_moments(obs)
            self._total = _combine(self._total, batch)
            self._delta = _combine(self._delta, batch)
            self._kept = True
        data[self.column] = self._normalize(obs)
        return data

    def _call_tensors(self, data: AgentData, shape: tuple[int, ...]) -> AgentData:
        import torch

        obs = data[self.column]
        if tuple(obs.shape[1:]) != shape:
            raise ValueError(
                f"MeanStdFilter: obs rows have shape {tuple(obs.shape[1:])}, expected {shape}"
            )
        if self._device != obs.device:
            self._move(obs.device)
        x = obs.to(self._total[1].dtype)
        finite = torch.isfinite(x).reshape(len(x), -1)
        good = finite.all(dim=1)
        self._nonfinite.record(~good, data, ~finite)
        if self.update and self.is_training and len(x):
            batch = _tensor_moments(x, good if data.mask is None else good & data.mask)
            self._total = _combine_tensors(self._total, batch)
            self._delta = _combine_tensors(self._delta, batch)
            self._kept = True
        data[self.column] = self._normalize_tensor(x)
        return data

    def _move(self, device: Any) -> None:
        """Hold the statistics on ``device`` (None: as numpy); tensors move device to device."""
        for name in ("_total", "_delta", "_frozen"):
            stats = getattr(self, name)
            if device is None:
                stats = _numpy_stats(stats)
            elif isinstance(stats[1], np.ndarray):
                stats = _tensor_stats(stats, device)
            else:
                stats = tuple(x.to(device) for x in stats)
            setattr(self, name, stats)
        self._device = device

    def _fit(self, stats: Stats) -> Any:
        """NumPy statistics on the device the filter holds its statistics on."""
        return stats if self._device is None else _tensor_stats(stats, self._device)

    def to(self, device: Any) -> None:
        """Hold the statistics on torch ``device`` from now on."""
        import torch

        self._ensure_bound()
        self._move(torch.empty(0, device=device).device)  # "cuda" -> "cuda:0", as tensors say

    def transform(self, value: Any) -> Any:
        """Normalise with the current (or, when freezing, the frozen) statistics, without
        updating them."""
        self._ensure_bound()
        if holds_tensors(value):
            if self._device != value.device:
                self._move(value.device)
            return self._normalize_tensor(value.to(self._total[1].dtype))
        if self._device is not None:
            self._move(None)
        return self._normalize(np.asarray(value, np.float64))

    def _normalize_tensor(self, x: Any) -> Any:
        import torch

        stats: Any = self._frozen if self.freeze_between_syncs else self._total
        count, mean, m2 = stats
        std = torch.where(count > 0, torch.sqrt(m2 / count.clamp(min=1.0)), 1.0)
        out = (x - mean) / (std + self.epsilon)
        return out.clamp(-self.clip, self.clip).to(torch.float32)

    def pending_flag(self) -> Any:
        """True on the device when a tensor batch held a non-finite observation."""
        return self._nonfinite.flag()

    def pending_nonfinite(self) -> Any:
        """Tensor path: a 0-d bool tensor, True when a NaN or inf arrived since the last
        ``raise_pending()`` (None before the first tensor call)."""
        return self._nonfinite.flag()

    def raise_pending(self) -> None:
        """Raise the ValueError of the non-finite rows recorded on the tensor path (naming
        their (env_id, agent_id) and features) and clear them; nothing if there were none."""
        found = self._nonfinite.take()
        if found is None:
            return
        keys, bad = found
        parts = []
        for (env_id, agent_id), feats in list(zip(keys, cast(np.ndarray, bad)))[:_MAX_ROWS_SHOWN]:
            index = np.flatnonzero(feats)
            shown = ", ".join(self._feature_name(int(f)) for f in index[:_MAX_FEATURES_SHOWN])
            more = _more(len(index), _MAX_FEATURES_SHOWN, "")
            parts.append(f"(env_id={env_id}, agent_id={agent_id!r}): features {shown}{more}")
        raise ValueError(
            f"{self.name}: non-finite observation values (NaN or inf) in {len(keys)} row(s) "
            "since the last check: "
            + "; ".join(parts)
            + _more(len(keys), _MAX_ROWS_SHOWN, " rows")
            + ". These rows were left out of the statistics."
        )

    def start_sample(self) -> None:
        """The runner's sync point when it runs alone: ``refreeze()``."""
        self.refreeze()

    def refreeze(self) -> None:
        """A sync point of a filter on its own (runners call it at the start of ``sample()``):
        with ``freeze_between_syncs``, in training mode, the frozen statistics become the
        totals if the filter saw data since the last sync point and kept it (no
        ``reset_delta`` since). Otherwise nothing changes."""
        if self.freeze_between_syncs and self._kept and self.is_training:
            self._frozen = self._total
            self._kept = False

    def _normalize(self, obs: np.ndarray) -> np.ndarray:
        count, mean, m2 = self._frozen if self.freeze_between_syncs else self._total
        std = np.ones_like(mean) if count == 0 else np.sqrt(m2 / count)
        out = (obs - mean) / (std + self.epsilon)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def _non_finite_message(self, data: AgentData, obs: np.ndarray, finite: np.ndarray) -> str:
        bad = ~finite.reshape(len(obs), -1)
        rows = np.flatnonzero(bad.any(axis=1))
        keys = data.row_keys()
        parts = []
        for r in rows[:_MAX_ROWS_SHOWN]:
            feats = np.flatnonzero(bad[r])
            flat = obs[r].reshape(-1)
            shown = ", ".join(
                f"{self._feature_name(int(f))}={flat[f]}" for f in feats[:_MAX_FEATURES_SHOWN]
            )
            more = _more(len(feats), _MAX_FEATURES_SHOWN, "")
            env_id, agent_id = keys[r]
            parts.append(f"(env_id={env_id}, agent_id={agent_id!r}): features {shown}{more}")
        more_rows = _more(len(rows), _MAX_ROWS_SHOWN, " rows")
        return (
            f"{self.name}: non-finite observation values in {len(rows)} row(s): "
            + "; ".join(parts)
            + more_rows
            + ". The statistics were left unchanged."
        )

    def _feature_name(self, flat_index: int) -> str:
        shape = self._shape or ()
        if len(shape) <= 1:
            return f"[{flat_index}]"
        return str(list(np.unravel_index(flat_index, shape)))

    # -- statistics -----------------------------------------------------------------------
    def get_statistics(self) -> dict[str, Any]:
        """``{"count": () float64, "mean": shape float64, "m2": shape float64}``: the totals;
        with ``freeze_between_syncs`` also ``"frozen"``, the statistics it normalises with
        (same keys)."""
        self._ensure_bound()
        out: dict[str, Any] = _pack(*_numpy_stats(self._total))
        if self.freeze_between_syncs:
            out[_FROZEN_KEY] = _pack(*_numpy_stats(self._frozen))
        return out

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        """Replace the statistics (e.g. from a checkpoint or a sync) and clear the delta.

        With ``freeze_between_syncs`` this is a sync point: the frozen statistics become
        ``stats["frozen"]`` when given (a checkpoint), else the new totals (a sync, or a
        state saved without freezing). A filter without freezing ignores ``"frozen"``.
        """
        where = "MeanStdFilter.set_statistics"
        frozen_stats = stats.get(_FROZEN_KEY)
        if frozen_stats is not None and not isinstance(frozen_stats, Mapping):
            raise ValueError(f"{where}: {_FROZEN_KEY!r} must be statistics, got {frozen_stats!r}")
        if self._shape is None:  # not bound yet: apply once the input space is known
            _unpack(stats, where)
            if frozen_stats is not None:
                _unpack(frozen_stats, f"{where}[{_FROZEN_KEY!r}]")
            self._pending = dict(stats)
            return
        total = self._checked(stats, where)
        frozen = total
        if frozen_stats is not None and self.freeze_between_syncs:
            frozen = self._checked(frozen_stats, f"{where}[{_FROZEN_KEY!r}]")
        self._total, self._frozen = self._fit(total), self._fit(frozen)
        self._delta = self._fit(_unpack(empty_statistics(self._shape), "MeanStdFilter"))
        self._kept = not _same(frozen, total)  # a checkpoint taken between sync points

    def _checked(self, stats: Mapping[str, Any], where: str) -> Stats:
        count, mean, m2 = _unpack(stats, where)
        if mean.shape != self._shape:
            raise ValueError(
                f"{where}: mean has shape {mean.shape}, the observations have {self._shape}"
            )
        return count, mean.copy(), m2.copy()

    def get_delta(self) -> dict[str, np.ndarray]:
        """Statistics of the data seen since the last ``reset_delta`` / ``set_statistics``."""
        self._ensure_bound()
        return _pack(*_numpy_stats(self._delta))

    def reset_delta(self) -> None:
        """Forget the delta (after it was sent for merging); the totals are kept. With
        ``freeze_between_syncs`` the data handed over reaches the frozen statistics only
        through the next ``set_statistics`` (never through ``refreeze``)."""
        shape = self._ensure_bound()
        self._delta = self._fit(_unpack(empty_statistics(shape), "MeanStdFilter"))
        self._kept = False

    @property
    def mean(self) -> np.ndarray:
        """Current running mean per feature (of the totals)."""
        self._ensure_bound()
        return np.array(_numpy_stats(self._total)[1])

    @property
    def std(self) -> np.ndarray:
        """Current population standard deviation per feature (1 with no data)."""
        self._ensure_bound()
        count, mean, m2 = _numpy_stats(self._total)
        return np.ones_like(mean) if count == 0 else np.sqrt(m2 / count)

    @property
    def count(self) -> float:
        """Number of rows the statistics (the totals) were computed from."""
        return float(_numpy_stats(self._total)[0])
