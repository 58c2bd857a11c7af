"""ONNX forms of connectors: torch modules computing what a connector computes once its
statistics are frozen, so ``export_onnx`` can trace them into one graph with the policy.

A form is a :class:`ConnectorForm`. The exported graph runs, for one batch of rows::

    cols = {"obs": obs, "rewards": reward}        # reward only when a member reads it;
                                                  # obs: a dict/tuple of a Dict/Tuple space
    for form, states in agent forms:              # each form gets its own state inputs
        cols, states = form(cols, states)
    outputs = {"actions": mode of the policy's distribution, "state_out_i": ...}
    for form, states in agent forms:
        states = form.after_policy(outputs, states)   # e.g. remember the action taken
    actions = outputs["actions"]
    for form in action forms:
        actions = form(actions)                   # action forms take and return actions

A member with per-episode state declares it with :meth:`ConnectorForm.state_specs` (shape
of one row, dtype, initial value, meaning): the graph takes each as an input
``state_in_<i>`` and returns its next value as ``state_out_<i>``; the caller feeds the
outputs back at the next step of the same episode and starts an episode from the initial
values. A state that starts from the episode's first observation (a frame stack) carries
its own ``started`` flag state.

A connector of your own gets an ONNX form by defining ``onnx_form(self) -> ConnectorForm``
(built-in connectors have theirs here). A member without one makes ``export_onnx`` raise
``ExportError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlconnect.connectors import Connector
from rlconnect.connectors.action import (
    ClipActions,
    ConvertToNumpy,
    ImmutableActions,
    UnsquashActions,
)
from rlconnect.connectors.agent import (
    ClipReward,
    CropObservations,
    FlattenObservations,
    FrameStack,
    Grayscale,
    MeanStdFilter,
    PrevActionsRewards,
    Resize,
    ScalePixels,
    StateBuffer,
    TransposeImage,
)
from rlconnect.connectors.agent.pixels import BT601
from rlconnect.connectors.agent.pixels_resize import resize_weights
from rlconnect.errors import ExportError
from rlconnect.spaces import describe_space, zeros_batch
from rlconnect.spaces.tensors import TensorFlattener

__all__ = ["BUILTIN_FORMS", "ConnectorForm", "StateSpec", "form_of"]

Columns = dict[str, torch.Tensor]


@attrs.frozen
class StateSpec:
    """One explicit state of a form: per-row ``initial`` value (its shape and dtype too)."""

    meaning: str
    initial: np.ndarray


class ConnectorForm(nn.Module):
    """The torch twin of one connector (see the module docstring).

    Agent connector forms override :meth:`forward` (``cols, states -> cols, states``) and,
    if they keep state, :meth:`state_specs` and possibly :meth:`after_policy`. Action
    connector forms override :meth:`forward` as ``actions -> actions``.
    """

    reads_rewards = False
    """True if the form reads the ``rewards`` column (the graph then takes a reward)."""

    def state_specs(self) -> list[StateSpec]:
        """The per-episode states this form carries (none by default)."""
        return []

    def after_policy(self, outputs: Columns, states: list[torch.Tensor]) -> list[torch.Tensor]:
        """The next states once the policy answered (the states ``forward`` returned by
        default)."""
        return states


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _to_dtype(x: torch.Tensor, dtype: np.dtype) -> torch.Tensor:
    """Float values to ``dtype`` as numpy's pixel code does: integers rounded and clipped."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        x = torch.clamp(torch.round(x), float(info.min), float(info.max))
    return x.to(_tensor(np.zeros(0, dtype)).dtype)


# -- agent connector forms --------------------------------------------------------------------


class _ObsMap(ConnectorForm):
    """A stateless map of the ``obs`` column."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, cols: Columns, states: list[torch.Tensor]) -> tuple[Columns, list]:
        return {**cols, "obs": self.fn(cols["obs"])}, states


class _Identity(ConnectorForm):
    def forward(self, cols: Any, states: Any = None) -> Any:
        return cols if states is None else (cols, states)


def _flatten(c: FlattenObservations) -> ConnectorForm:
    space = c.input_space
    if isinstance(space, gym.spaces.Box | gym.spaces.MultiBinary):
        return _ObsMap(lambda x: x.reshape(x.shape[0], -1).to(torch.float32))
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
        sizes = np.asarray(getattr(space, "nvec", [getattr(space, "n", 0)])).reshape(-1)
        start = _tensor(np.asarray(space.start, np.int64).reshape(-1))

        def one_hot(x: torch.Tensor) -> torch.Tensor:
            idx = x.reshape(x.shape[0], -1).to(torch.int64) - start
            parts = [nn.functional.one_hot(idx[:, i], int(n)) for i, n in enumerate(sizes)]
            return torch.cat(parts, dim=1).to(torch.float32)

        return _ObsMap(one_hot)
    try:  # Dict and Tuple: the tensor path's flattener, in FlattenObservations' layout
        flattener = TensorFlattener(space)
    except TypeError as exc:
        raise ExportError(f"FlattenObservations of {describe_space(space)}: {exc}") from None
    return _ObsMap(lambda nest: flattener(nest)[0])


def _mean_std(c: MeanStdFilter) -> ConnectorForm:
    stats = c.get_statistics()
    if c.freeze_between_syncs:
        stats = stats["frozen"]
    count = float(stats["count"])
    mean = np.asarray(stats["mean"], np.float64)
    std = np.ones_like(mean) if count == 0 else np.sqrt(np.asarray(stats["m2"]) / count)
    mean_t, scale_t, bound = _tensor(mean), _tensor(std + c.epsilon), c.clip

    def normalize(x: torch.Tensor) -> torch.Tensor:
        out = (x.to(torch.float64) - mean_t) / scale_t
        return torch.clamp(out, -bound, bound).to(torch.float32)

    return _ObsMap(normalize)


class _ClipRewardForm(ConnectorForm):
    reads_rewards = True

    def __init__(self, limit: float | None) -> None:
        super().__init__()
        self.limit = limit

    def forward(self, cols: Columns, states: list[torch.Tensor]) -> tuple[Columns, list]:
        r = cols["rewards"]
        r = torch.sign(r) if self.limit is None else torch.clamp(r, -self.limit, self.limit)
        return {**cols, "rewards": r}, states


class _FrameStackForm(ConnectorForm):
    """States: the last k frames, and whether the episode started (else the first
    observation fills the whole stack)."""

    def __init__(self, c: FrameStack) -> None:
        super().__init__()
        space = c.input_space
        self.k, self.dtype = c.num_frames, np.dtype(space.dtype)
        self.frame_shape = tuple(space.shape or ())

    def state_specs(self) -> list[StateSpec]:
        frames = np.zeros((self.k, *self.frame_shape), self.dtype)
        return [
            StateSpec("FrameStack: the last frames, newest last", frames),
            StateSpec("FrameStack: the episode started (false: fill with obs)", np.array(False)),
        ]

    def forward(self, cols: Columns, states: list[torch.Tensor]) -> tuple[Columns, list]:
        frames, started = states
        obs = cols["obs"].to(frames.dtype).unsqueeze(1)
        shifted = torch.cat([frames[:, 1:], obs], dim=1)
        fresh = obs.expand(frames.shape)
        flag = started.reshape(-1, *([1] * (frames.dim() - 1)))
        stacked = torch.where(flag, shifted, fresh)
        return {**cols, "obs": stacked}, [stacked, torch.ones_like(started)]


class _PrevActionsRewardsForm(ConnectorForm):
    """States: the previous action (the space's zero at an episode's start) and whether
    the episode started (the reward of an episode's first step counts as 0)."""

    reads_rewards = True

    def __init__(self, c: PrevActionsRewards) -> None:
        super().__init__()
        space = c.ctx.action_space
        if not isinstance(space, gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            raise ExportError(f"PrevActionsRewards of {describe_space(space)} has no ONNX form")
        self.zero = np.asarray(zeros_batch(space, 1))[0]

    def state_specs(self) -> list[StateSpec]:
        return [
            StateSpec("PrevActionsRewards: the action taken at the previous step", self.zero),
            StateSpec("PrevActionsRewards: the episode started", np.array(False)),
        ]

    def forward(self, cols: Columns, states: list[torch.Tensor]) -> tuple[Columns, list]:
        prev, started = states
        rewards = torch.where(started, cols["rewards"], torch.zeros_like(cols["rewards"]))
        out = {**cols, "prev_actions": prev, "prev_rewards": rewards.to(torch.float32)}
        return out, [prev, torch.ones_like(started)]

    def after_policy(self, outputs: Columns, states: list[torch.Tensor]) -> list[torch.Tensor]:
        return [outputs["actions"].to(states[0].dtype), states[1]]


class _StateBufferForm(ConnectorForm):
    """States: the policy's recurrent state, from its initial state."""

    def __init__(self, c: StateBuffer) -> None:
        super().__init__()
        self.initial = [np.asarray(s) for s in c.ctx.initial_states]

    def state_specs(self) -> list[StateSpec]:
        return [
            StateSpec(f"the policy's recurrent state {i}", s) for i, s in enumerate(self.initial)
        ]

    def forward(self, cols: Columns, states: list[torch.Tensor]) -> tuple[Columns, list]:
        return {**cols, **{f"state_in_{i}": s for i, s in enumerate(states)}}, states

    def after_policy(self, outputs: Columns, states: list[torch.Tensor]) -> list[torch.Tensor]:
        return [outputs[f"state_out_{i}"] for i in range(len(states))]


def _grayscale(c: Grayscale) -> ConnectorForm:
    weights, dtype = _tensor(BT601), np.dtype(c.input_space.dtype)
    return _ObsMap(lambda x: _to_dtype(x.to(torch.float32) @ weights, dtype))


def _scale(_c: ScalePixels) -> ConnectorForm:
    return _ObsMap(lambda x: x.to(torch.float32) * np.float32(1.0 / 255.0))


def _crop(c: CropObservations) -> ConnectorForm:
    h, w = tuple(c.input_space.shape or (0, 0))[:2]
    return _ObsMap(lambda x: x[:, c.top : h - c.bottom, c.left : w - c.right])


def _transpose(c: TransposeImage) -> ConnectorForm:
    axes = (0, *(a + 1 for a in c.axes))
    return _ObsMap(lambda x: x.permute(*axes))


def _resize(c: Resize) -> ConnectorForm:
    """Dense weights (the connector gathers bands): sums in another order, so integer
    pixels may differ by one level where a value falls on a rounding edge."""
    space = c.input_space
    h, w = tuple(space.shape or (0, 0))[:2]
    rows = _tensor(resize_weights(h, c.height, c.interpolation))
    cols = _tensor(resize_weights(w, c.width, c.interpolation))
    dtype = np.dtype(space.dtype)

    def resize(x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        if x.dim() == 4:  # (B, H, W, C): resize every channel
            out = torch.einsum("oh,bhwc,pw->bopc", rows, x, cols)
        else:
            out = torch.einsum("oh,bhw,pw->bop", rows, x, cols)
        return _to_dtype(out, dtype)

    return _ObsMap(resize)


# -- action connector forms -------------------------------------------------------------------


class _ActionMap(ConnectorForm):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        return self.fn(actions)


def _cast_to_box(space: gym.spaces.Box, y: torch.Tensor) -> torch.Tensor:
    if space.dtype.kind in "iu":
        y = torch.round(y)
    y = torch.minimum(
        torch.maximum(y, _tensor(space.low.astype(np.float64))),
        _tensor(space.high.astype(np.float64)),
    )
    return y.to(_tensor(np.zeros(0, space.dtype)).dtype)


def _unsquash(c: UnsquashActions) -> ConnectorForm:
    space = c.input_space
    if not isinstance(space, gym.spaces.Box):
        return _Identity()
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    fin = np.isfinite(low) & np.isfinite(high)
    lo, hi = _tensor(np.where(fin, low, -1.0)), _tensor(np.where(fin, high, 1.0))

    def unsquash(a: torch.Tensor) -> torch.Tensor:
        clipped = torch.clamp(a.to(torch.float64), -1.0, 1.0)
        return _cast_to_box(space, lo + (clipped + 1.0) * 0.5 * (hi - lo))

    return _ActionMap(unsquash)


def _clip(c: ClipActions) -> ConnectorForm:
    space = c.input_space
    if not isinstance(space, gym.spaces.Box):
        return _Identity()
    return _ActionMap(lambda a: _cast_to_box(space, a.to(torch.float64)))


BUILTIN_FORMS: dict[type[Connector], Callable[[Any], ConnectorForm]] = {
    FlattenObservations: _flatten,
    MeanStdFilter: _mean_std,
    ClipReward: lambda c: _ClipRewardForm(c.limit),
    FrameStack: _FrameStackForm,
    PrevActionsRewards: _PrevActionsRewardsForm,
    StateBuffer: _StateBufferForm,
    Grayscale: _grayscale,
    ScalePixels: _scale,
    CropObservations: _crop,
    TransposeImage: _transpose,
    Resize: _resize,
    ConvertToNumpy: lambda c: _Identity(),
    ImmutableActions: lambda c: _Identity(),
    UnsquashActions: _unsquash,
    ClipActions: _clip,
}
"""The ONNX form of every built-in connector that has one (``AgentLambda`` and
``ActionLambda`` wrap arbitrary Python functions and have none)."""


def form_of(name: str, connector: Connector) -> ConnectorForm:
    """The ONNX form of pipeline member ``name``: its own ``onnx_form()``, a built-in
    one, or ``ExportError`` naming the member."""
    own = getattr(connector, "onnx_form", None)
    if callable(own):
        form = own()
    elif type(connector) in BUILTIN_FORMS:
        form = BUILTIN_FORMS[type(connector)](connector)
    else:
        raise ExportError(
            f"pipeline member {name!r} ({type(connector).__name__}) has no ONNX form; give "
            "its class an onnx_form() method returning an rlconnect.deploy.onnx_forms."
            "ConnectorForm, or export it with rc.export_policy instead"
        )
    if not isinstance(form, ConnectorForm):
        raise ExportError(
            f"pipeline member {name!r}: onnx_form() returned {type(form).__name__}, not a "
            "ConnectorForm"
        )
    return form
