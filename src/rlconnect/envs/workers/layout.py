"""The shared-memory block the runner and its env workers exchange one poll through.

One block holds, for all ``N`` sub-envs, every array a poll needs: the observation leaves
(nested spaces flattened into one array per leaf, ``(N, *leaf_shape)``), the action leaves,
rewards, the terminated / truncated / first flags, a per-sub-env status written by the
worker (row, error or nothing) and a per-sub-env command written by the runner (step,
reset, soft reset). Worker ``w`` only touches the rows of its own sub-envs. The block is
allocated once; a poll writes into it and never allocates in it.
"""

from __future__ import annotations

import contextlib
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.spaces import zeros_batch

__all__ = [
    "CMD_NONE",
    "CMD_RESET",
    "CMD_SOFT",
    "CMD_STEP",
    "CMD_STEP_PIPED",
    "ST_ROW",
    "SharedArrays",
    "SharedLayout",
    "array_template",
]

CMD_NONE, CMD_STEP, CMD_RESET, CMD_SOFT, CMD_STEP_PIPED = 0, 1, 2, 3, 4
"""Commands per sub-env: nothing, step (action in the block), reset, soft reset, step
(action sent through the pipe: a space or dtype the block does not hold)."""
ST_ROW = 1
"""Status of a sub-env that has a row in the block after the worker's poll."""

_ALIGN = 64


def array_template(space: gym.Space | None) -> Any:
    """A zero-row batch of ``space`` (the nest the block mirrors), or None when the space
    cannot live in arrays (e.g. ``Text``, ``Graph``): its values then travel by pipe."""
    if space is None:
        return None
    try:
        return zeros_batch(space, 0)
    except Exception:
        return None


class SharedArrays:
    """Numpy views of one block: ``obs`` / ``act`` (nests of ``(N, ...)`` arrays or None),
    ``rew``, ``term``, ``trunc``, ``first``, ``status``, ``cmd``."""

    def __init__(self, views: dict[str, np.ndarray], obs: Any, act: Any) -> None:
        self.obs = obs
        self.act = act
        self.obs_leaves: list[np.ndarray] = [] if obs is None else tree.flatten(obs)
        self.act_leaves: list[np.ndarray] = [] if act is None else tree.flatten(act)
        self.rew = views["rew"]
        self.term = views["term"]
        self.trunc = views["trunc"]
        self.first = views["first"]
        self.status = views["status"]
        self.cmd = views["cmd"]


class SharedLayout:
    """Where each array of the block lives (picklable: workers rebuild the same views)."""

    def __init__(self, num_envs: int, obs_template: Any, act_template: Any) -> None:
        self.num_envs = num_envs
        self.obs_template = obs_template
        self.act_template = act_template
        specs: list[tuple[str, tuple[int, ...], np.dtype]] = []
        for prefix, template in (("obs", obs_template), ("act", act_template)):
            if template is not None:
                for k, leaf in enumerate(tree.flatten(template)):
                    specs.append((f"{prefix}{k}", (num_envs, *leaf.shape[1:]), leaf.dtype))
        specs += [
            ("rew", (num_envs,), np.dtype(np.float64)),
            ("term", (num_envs,), np.dtype(bool)),
            ("trunc", (num_envs,), np.dtype(bool)),
            ("first", (num_envs,), np.dtype(bool)),
            ("status", (num_envs,), np.dtype(np.int8)),
            ("cmd", (num_envs,), np.dtype(np.int8)),
        ]
        self.specs: list[tuple[str, tuple[int, ...], np.dtype, int]] = []
        offset = 0
        for name, shape, dtype in specs:
            self.specs.append((name, shape, dtype, offset))
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        self.size = offset

    def views(self, buf: Any) -> SharedArrays:
        """The arrays of the block ``buf`` (a ``SharedMemory.buf``)."""
        views = {
            name: np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset)
            for name, shape, dtype, offset in self.specs
        }

        def nest(prefix: str, template: Any) -> Any:
            if template is None:
                return None
            leaves = [views[f"{prefix}{k}"] for k in range(len(tree.flatten(template)))]
            return tree.unflatten_as(template, leaves)

        return SharedArrays(views, nest("obs", self.obs_template), nest("act", self.act_template))


class SharedBlock:
    """A shared-memory block and its views; the creator unlinks it on ``close()``."""

    def __init__(self, layout: SharedLayout, name: str | None = None) -> None:
        self.layout = layout
        create = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=layout.size)
        self._owner = create
        self.arrays: SharedArrays | None = layout.views(self.shm.buf)

    @property
    def name(self) -> str:
        return self.shm.name

    def close(self) -> None:
        """Drop the views, close the mapping and (creator only) free the block."""
        self.arrays = None
        with contextlib.suppress(BufferError, OSError):  # views still held elsewhere
            self.shm.close()
        if self._owner:
            self._owner = False
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()
