"""Env infos on the tensor path: a nested column of tensors, one row per sub-env and agent.

A batched tensor env returns its infos as one dict per step (gymnasium's vector
convention: ``infos[key]`` a tensor ``(N, ...)``, ``infos["_key"]`` its bool mask). With
``RunnerConfig(record_infos=True)`` the runner records them as the column ``infos``: a
nest of the same keys, each a tensor of the batch's rows, on the env's device; no dict
per row is made (that would be host work per row). Only tensors with one row per sub-env
are rows; other values (scalars, logs, strings) are left out.

The keys are those seen so far: the keys of a ``sample()``'s first step and of every
earlier step. A step without one of them records zeros (False for a ``_key`` mask, so a
gymnasium mask still says which rows hold the value); a key first seen in the middle of a
``sample()`` is recorded from the next one on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["TensorInfos"]

Path = tuple[str, ...]


class TensorInfos:
    """The ``infos`` rows of one policy: ``rows(per_agent)`` per round (see the module
    docstring); ``num_envs`` rows per agent, agent-major as the policy's other columns."""

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.num_envs, self.device = num_envs, device
        self._seen: dict[Path, tuple[tuple[int, ...], torch.dtype]] = {}
        self._keys: dict[Path, tuple[tuple[int, ...], torch.dtype]] | None = None
        self._zeros: dict[Path, torch.Tensor] = {}

    def begin_sample(self) -> None:
        """A ``sample()`` starts: its keys are fixed at its first step."""
        self._keys = None

    def rows(self, per_agent: Sequence[Any]) -> dict[str, Any] | None:
        """This round's infos of the policy's agents (one infos dict each, in its row
        order) as one nest of ``(agents * N, ...)`` tensors; None while no key is known."""
        flats = [self._flatten(infos) for infos in per_agent]
        if self._keys is None:
            self._keys = dict(self._seen)
        if not self._keys:
            return None
        out: dict[str, Any] = {}
        for path, (shape, dtype) in self._keys.items():
            leaves = [self._leaf(flat, path, shape, dtype) for flat in flats]
            _put(out, path, leaves[0] if len(leaves) == 1 else torch.cat(leaves))
        return out

    def _flatten(self, infos: Any) -> dict[Path, torch.Tensor]:
        """The per-sub-env tensors of ``infos`` by key path; new keys are noted."""
        flat: dict[Path, torch.Tensor] = {}
        _walk(infos, (), self.num_envs, flat)
        for path, leaf in flat.items():
            if path not in self._seen:
                self._seen[path] = (tuple(leaf.shape[1:]), leaf.dtype)
        return flat

    def _leaf(
        self, flat: Mapping[Path, torch.Tensor], path: Path, shape: tuple, dtype: torch.dtype
    ) -> torch.Tensor:
        leaf = flat.get(path)
        if leaf is None:
            zeros = self._zeros.get(path)
            if zeros is None:
                zeros = torch.zeros((self.num_envs, *shape), dtype=dtype, device=self.device)
                self._zeros[path] = zeros
            return zeros
        if tuple(leaf.shape[1:]) != shape or leaf.dtype != dtype:
            raise ValueError(
                f"tensor env: infos{''.join(f'[{k!r}]' for k in path)} was {dtype} shaped "
                f"(N, *{shape}) at an earlier step and is {leaf.dtype} shaped "
                f"{tuple(leaf.shape)} now; record_infos keeps one shape and dtype per key"
            )
        return leaf


def _walk(value: Any, path: Path, rows: int, out: dict[Path, torch.Tensor]) -> None:
    if isinstance(value, Mapping):
        for key, sub in value.items():
            _walk(sub, (*path, str(key)), rows, out)
    elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
        out[path] = value


def _put(nest: dict[str, Any], path: Path, leaf: torch.Tensor) -> None:
    for key in path[:-1]:
        nest = nest.setdefault(key, {})
    nest[path[-1]] = leaf
