"""Fakes for the learner connectors' tensor path: batches of torch tensors, a policy that
takes and returns tensors, random runner-like batches, and a host-read counter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import tree
from learner_fakes import ACT, OBS
from torch.overrides import TorchFunctionMode

import rlconnect as rc


class TensorBatch(rc.SampleBatch):
    """A SampleBatch that keeps torch tensor columns as they are (what the tensor path's
    batches do; used while rc.SampleBatch itself turns tensors into numpy arrays)."""

    def __init__(self, columns: Mapping[str, Any], *, meta: dict | None = None) -> None:
        super().__init__(meta=meta)
        for key, value in columns.items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        leaves = tree.flatten(value)
        if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
            super().__setitem__(key, value)
            return
        rows = leaves[0].shape[0]
        if self._columns and rows != self._count:
            raise ValueError(f"column {key!r} has {rows} rows, the batch {self._count}")
        self._columns[key] = value
        self._count = rows


def _keeps_tensors() -> bool:
    return isinstance(rc.SampleBatch({"x": torch.zeros(1)})["x"], torch.Tensor)


def to_tensors(batch: rc.SampleBatch, device: str = "cpu") -> rc.SampleBatch:
    """The same batch with every column a torch tensor on ``device`` (same meta)."""

    def move(x: Any) -> torch.Tensor:
        return torch.as_tensor(x, device=device)

    cols = {k: tree.map_structure(move, v) for k, v in batch.items()}
    if _keeps_tensors():
        return rc.SampleBatch(cols, meta=batch.meta)
    return TensorBatch(cols, meta=batch.meta)


def host(x: Any) -> np.ndarray:
    return np.asarray(x.detach().cpu()) if isinstance(x, torch.Tensor) else np.asarray(x)


class TorchValuePolicy(rc.Policy):
    """V(obs) = obs[:, 0] + 0.5 * obs[:, 1] (+ state_in_0[:, 0] when recurrent), logits
    obs[:, :1] * [0, 1, 2], summed in float64: torch in, torch out (on the input's device),
    numpy in, numpy out; ``numpy_out`` answers tensors with numpy arrays too."""

    def __init__(self, recurrent: bool = False, numpy_out: bool = False) -> None:
        super().__init__(OBS, ACT, seed=0)
        self.recurrent, self.numpy_out = recurrent, numpy_out
        self.value_calls: list[int] = []

    def get_initial_state(self) -> list[np.ndarray]:
        return [np.zeros(2, np.float32)] if self.recurrent else []

    def compute_actions(self, input_batch: Mapping[str, Any], explore: bool = True) -> Any:
        raise NotImplementedError

    def _out(self, x: Any, like: Any) -> Any:
        if isinstance(like, torch.Tensor) and not self.numpy_out:
            return x.float()
        return host(x).astype(np.float32)

    def compute_values(self, input_batch: Mapping[str, Any]) -> Any:
        obs = torch.as_tensor(input_batch["obs"]).double()
        self.value_calls.append(len(obs))
        v = obs[:, 0] + 0.5 * obs[:, 1]
        if self.recurrent:
            v = v + torch.as_tensor(input_batch["state_in_0"]).double()[:, 0]
        return self._out(v, input_batch["obs"])

    def compute_log_likelihoods(self, input_batch: Mapping[str, Any], actions: Any) -> Any:
        obs = torch.as_tensor(input_batch["obs"]).double()
        logp = torch.log_softmax(obs[:, :1] * torch.arange(3.0, dtype=torch.float64), dim=1)
        index = torch.as_tensor(actions).long().to(obs.device)[:, None]
        return self._out(logp.gather(1, index)[:, 0], input_batch["obs"])


def runner_like(
    n: int, steps: int, *, seed: int, agents: int = 1, end_p: float = 0.1, recurrent: bool = False
) -> rc.SampleBatch:
    """A numpy batch laid out as the tensor path's: ``n * agents`` blocks (slots) of
    ``steps`` rows in time order, several episodes per block ending by termination,
    truncation or both, the last one cut or ended; ``meta["rows_per_env"] = steps``."""
    rng = np.random.default_rng(seed)
    slots, rows = n * agents, n * agents * steps
    ends = rng.random((n, steps)) < end_p  # per sub-env: all its agents end together
    kind = rng.integers(0, 3, (n, steps))  # 0 term, 1 trunc, 2 both
    new_ep = np.zeros((n, steps), bool)
    new_ep[:, 1:] = ends[:, :-1]
    eps = (np.arange(n)[:, None] * 1000 + np.cumsum(new_ep, axis=1)).astype(np.int64)
    start_t = rng.integers(0, 50, (n, 1))
    pos = np.arange(steps)[None] - np.maximum.accumulate(np.where(new_ep, np.arange(steps), 0), 1)
    t = np.where(np.cumsum(new_ep, 1) == 0, start_t + np.arange(steps), pos)
    tile = lambda x: np.tile(x, (agents, 1)).reshape(rows)  # noqa: E731
    out: dict[str, Any] = {
        "eps_id": tile(eps),
        "t": tile(t).astype(np.int64),
        "terminateds": tile(ends & (kind != 1)),
        "truncateds": tile(ends & (kind != 0)),
        "env_id": tile(np.broadcast_to(np.arange(n)[:, None], (n, steps))).astype(np.int64),
        "rewards": rng.normal(size=rows).astype(np.float32),
        "obs": rng.uniform(-1, 1, (rows, 2)).astype(np.float32),
        "new_obs": rng.uniform(-1, 1, (rows, 2)).astype(np.float32),
        "actions": rng.integers(0, 3, rows),
        "action_logp": np.log(rng.uniform(0.2, 0.6, rows)).astype(np.float32),
        "vf_preds": rng.normal(size=rows).astype(np.float32),
    }
    if agents > 1:
        out["agent_index"] = np.repeat(np.arange(agents), n * steps).astype(np.int64)
    if recurrent:
        out["state_in_0"] = rng.normal(size=(rows, 2)).astype(np.float32)
        out["state_out_0"] = rng.normal(size=(rows, 2)).astype(np.float32)
    assert slots * steps == rows
    return rc.SampleBatch(out, meta={"rows_per_env": steps})


#: the Tensor methods that read a value back to the host
HOST_READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"}
    | {"__array__", "nonzero", "unique", "masked_select"}
)


class HostReads(TorchFunctionMode):
    """Counts host reads of tensors made inside ``with HostReads() as reads:``, by name;
    a boolean-mask index (``x[mask]``, which finds the mask's rows on the host) counts
    as ``nonzero``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.calls.append(name)
        elif name in ("__getitem__", "__setitem__") and _bool_index(args[1]):
            self.calls.append("nonzero")
        return func(*args, **(kwargs or {}))


def _bool_index(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)
