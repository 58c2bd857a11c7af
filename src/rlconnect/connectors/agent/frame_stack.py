"""FrameStack: each row's observation becomes its agent's last ``num_frames`` observations."""

from __future__ import annotations

import math
import numbers
from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlconnect.connectors._tensors import torch_dtype
from rlconnect.connectors.agent._rows import RowState, expand_rows
from rlconnect.connectors.agent._slots import SlotTable
from rlconnect.connectors.base import AgentConnector, AgentData
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import MAX_JSON_ELEMENTS, describe_space

__all__ = ["FrameStack"]


@register_connector("FrameStack")
class FrameStack(AgentConnector):
    """Stacks each agent's last ``num_frames`` observations: ``(B, k, *obs_shape)``.

    The newest frame is last. An agent's first row of an episode (a new ``(env_id,
    agent_id)``, or the first after ``reset(env_id)``) fills the whole stack with copies of
    that observation. Needs a Box input; outputs a Box of shape ``(k, *shape)`` with the
    input's bounds repeated and the input's dtype, of at most ``spaces.MAX_JSON_ELEMENTS``
    values (so a saved ``num_frames`` cannot make loading allocate without bound). The
    frames are per-episode state and are not saved in a checkpoint.

    On the tensor path the frames are one tensor ``(R, k, *obs_shape)`` per row of the
    fixed layout, on the rows' device; ``reset_where(ended)`` starts the rows of ended
    sub-envs afresh, and rows outside ``data.mask`` keep their frames.

    Args:
        num_frames: how many frames to stack (k >= 1).
    """

    num_frames: int
    takes_tensors = True

    def __init__(self, ctx: Any, num_frames: int = 4) -> None:
        if (
            isinstance(num_frames, bool)
            or not isinstance(num_frames, numbers.Integral)
            or num_frames < 1
        ):
            raise ValueError(f"FrameStack: num_frames must be an int >= 1, got {num_frames!r}")
        super().__init__(ctx, num_frames=int(num_frames))
        self.num_frames = int(num_frames)
        self._slots: SlotTable | None = None
        self._rows: RowState = RowState()
        self._dtype: np.dtype = np.dtype(np.float32)

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """A Box ``(num_frames, *shape)`` with the input's bounds repeated; ValueError for a
        non-Box space or one too large to describe."""
        if not isinstance(input_space, gym.spaces.Box):
            raise ValueError(
                f"FrameStack needs a Box, got {describe_space(input_space)}; "
                "add FlattenObservations before it"
            )
        k = self.num_frames
        size = k * math.prod(input_space.shape)
        if size > MAX_JSON_ELEMENTS:  # checked before the Box allocates its bounds
            raise ValueError(
                f"FrameStack: {k} frames of {describe_space(input_space)} hold {size} values "
                f"per row, more than the limit {MAX_JSON_ELEMENTS} (spaces.MAX_JSON_ELEMENTS)"
            )
        low = np.broadcast_to(input_space.low, (k, *input_space.shape))
        high = np.broadcast_to(input_space.high, (k, *input_space.shape))
        return gym.spaces.Box(low, high, (k, *input_space.shape), input_space.dtype)

    def setup(self, input_space: gym.Space) -> None:
        """Allocate the frame slots for the input shape (kept when re-bound to the same one,
        so a pipeline edit does not lose the frames)."""
        shape = (self.num_frames, *(input_space.shape or ()))
        if self._slots is not None and self._slots["frames"].shape[1:] == shape:
            return  # re-bound to the same space (a pipeline edit): keep the frames
        self._dtype = np.dtype(input_space.dtype)
        self._rows = RowState()
        self._slots = SlotTable()
        self._slots.add("frames", np.zeros((0, *shape), self._dtype))

    def __call__(self, data: AgentData) -> AgentData:
        """Push each row's observation onto its agent's stack (a new agent's stack starts as
        copies of its first frame) and put the stack in ``obs``."""
        if self._slots is None:
            self.input_space  # noqa: B018  (binds to the context's observation space)
        if data.on_tensors:
            return self._call_tensors(data)
        table = cast("SlotTable", self._slots)  # bound just above
        obs = np.asarray(data["obs"], self._dtype)
        slots, new = table.lookup(data.row_keys())
        frames = table["frames"]  # read after lookup: it may have grown
        stacked = np.empty((len(slots), *frames.shape[1:]), self._dtype)
        stacked[:, :-1] = frames[slots, 1:]
        stacked[:, -1] = obs
        if new.any():
            stacked[new] = obs[new][:, None]
        frames[slots] = stacked
        data["obs"] = stacked
        return data

    def _call_tensors(self, data: AgentData) -> AgentData:
        import torch

        obs = data["obs"].to(torch_dtype(self._dtype))
        shape = (self.num_frames, *obs.shape[1:])

        def make(rows: int, device: Any) -> dict[str, Any]:
            return {"frames": torch.zeros((rows, *shape), dtype=obs.dtype, device=device)}

        fresh = self._rows.begin(data, make)
        frames = self._rows.tensors["frames"]
        newest = obs[:, None]
        stacked = torch.cat([frames[:, 1:], newest], dim=1)
        stacked = torch.where(expand_rows(fresh, stacked), newest.expand_as(stacked), stacked)
        self._rows.put("frames", stacked, data.mask)
        data["obs"] = stacked
        return data

    def reset(self, env_id: int) -> None:
        """Forget the stacks of ``env_id``'s agents: the next episode starts fresh."""
        if self._slots is not None:
            self._slots.reset(env_id)
        self._rows.reset(env_id)

    def reset_where(self, ended: Any) -> None:
        """Tensor path: mark the rows of the sub-envs in ``ended`` to start fresh stacks."""
        self._rows.reset_where(ended)

    def to(self, device: Any) -> None:
        """Move the tensor path's frame buffer to ``device``."""
        self._rows.to(device)
