"""What a saved pipeline would allocate when built, estimated from its declared members and
the space it takes, before anything is built: ``pipeline_cost``.

A 2 KB file may declare members whose construction allocates gigabytes while each stays
under its own limits: a ``Resize`` to 16384 x 16384 builds two resize matrices of
``height x H`` and ``width x W`` (and float64 intermediates), a ``FlattenObservations``
of a ``Discrete(n)`` builds an ``n x n`` one-hot table, a ``FrameStack`` of ``k`` frames
keeps ``k`` copies of its input, and every member's output space holds its bounds. The
estimate follows the members in order (the element count, and the image shape while one
is known) and adds an upper bound of each one's cost; members of other kinds are counted
as keeping their input's size. A member declaring an output of more than
``spaces.MAX_JSON_ELEMENTS`` values is left to its own check, which refuses it naming
its parameter. Loaders refuse a pipeline whose estimate passes ``MAX_PIPELINE_BYTES``
with a ``CheckpointError`` naming the member, before building any of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlconnect.spaces import MAX_JSON_ELEMENTS

__all__ = ["MAX_PIPELINE_BYTES", "pipeline_cost"]

MAX_PIPELINE_BYTES = 512 << 20
"""The most a loaded pipeline's members may allocate when built, by the estimate (512 MiB)."""

#: bytes per value of a member's output: float64 low and high bounds, two boolean masks,
#: and a row of working memory
_PER_VALUE = 2 * 8 + 2 + 8


def _count(params: Mapping[str, Any], name: str, default: int) -> int:
    """An int parameter, 0 when it is not one (the connector's own check refuses it)."""
    value = params.get(name, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _image_shape(space: gym.Space | None) -> tuple[int, ...] | None:
    if isinstance(space, gym.spaces.Box) and len(space.shape) in (2, 3):
        return tuple(int(d) for d in space.shape)
    return None


def _member(
    kind: Any, params: Mapping[str, Any], values: int, image: tuple[int, ...] | None, space: Any
) -> tuple[int, int, tuple[int, ...] | None]:
    """``(bytes built, values out, image shape out)`` of one member."""
    if kind == "Resize":
        h, w = _count(params, "height", 84), _count(params, "width", 84)
        if image is None:  # not an image: Resize refuses it when built
            return 0, values, None
        channels = image[2] if len(image) == 3 else 1
        weights = 12 * (h * image[0] + w * image[1])  # float32 matrices, float64 on the way
        out = h * w * channels
        return weights + out * _PER_VALUE, out, (h, w, *image[2:])
    if kind == "FrameStack":
        out = _count(params, "num_frames", 4) * values
        return out * (_PER_VALUE + 8), out, None  # and the frames it keeps
    if kind == "FlattenObservations":
        out = gym.spaces.flatdim(space) if space is not None else values
        table = 4 * out * out if type(space) is gym.spaces.Discrete else 0  # one-hot rows
        return table + out * _PER_VALUE, out, None
    return values * _PER_VALUE, values, image


def pipeline_cost(state: Mapping[str, Any], space: gym.Space) -> tuple[int, str | None]:
    """The estimated bytes building the pipeline ``state`` (checked by
    ``check_pipeline_state``) on input ``space`` allocates, and the first member (its name
    and kind) whose cost takes the total past ``MAX_PIPELINE_BYTES`` (None if none does)."""
    try:
        values = gym.spaces.flatdim(space)
    except Exception:  # a space without a flat form: count its leaves' values
        values = sum(math.prod(getattr(s, "shape", None) or (1,)) for s in _leaves(space))
    image, total = _image_shape(space), 0
    current: gym.Space | None = space
    for m in state.get("members", []):
        kind, params = m.get("connector"), m.get("params") or {}
        cost, out, image_out = _member(kind, params, values, image, current)
        if out > MAX_JSON_ELEMENTS:  # its own check refuses it, naming its parameter
            return total, None
        total += cost
        if total > MAX_PIPELINE_BYTES:
            return total, f"member {m.get('name')!r} ({kind})"
        if (out, image_out) != (values, image):
            current = None  # its output space is not built here: counted from now on
        values, image = out, image_out
    return total, None


def _leaves(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Dict):
        return [leaf for s in space.spaces.values() for leaf in _leaves(s)]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s in space.spaces for leaf in _leaves(s)]
    return [space]
