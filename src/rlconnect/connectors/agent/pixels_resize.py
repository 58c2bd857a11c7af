"""Resize: every ``(H, W[, C])`` frame of the batch to ``(height, width[, C])`` at once.

Both interpolations are separable linear maps ``Wh @ frame @ Ww.T`` whose weight matrices
are banded (an output pixel mixes at most a few neighbouring input pixels), so the whole
batch is, per axis, one gather of those k neighbours (``np.take``, on the input's dtype)
and one batched ``(1, k) @ (k, n)`` float32 product, with the bands built once per input
shape. (A dense ``matmul`` does ~30x more arithmetic for 210x160 -> 84x84 and was slower
on small CPUs; ``einsum`` over the gathered neighbours ran up to 8x slower for some batch
sizes, depending on the memory layout it was given.)

- ``"area"`` (default): each output pixel is the mean of the input area it covers, with
  fractional weights at the edges, i.e. OpenCV's ``INTER_AREA`` when shrinking (what
  gymnasium's ``AtariPreprocessing`` uses for 210x160 -> 84x84).
- ``"bilinear"``: torch's ``interpolate(mode="bilinear", align_corners=False)`` without
  antialiasing.

The whole frame is kept (no crop): the aspect ratio changes if the shapes disagree.

On torch tensors the same bands run as ``index_select`` and ``matmul`` on the frames'
device (not ``torch.nn.functional.interpolate``, whose ``"area"`` mode is not INTER_AREA
for non-integer scales): results equal the numpy path's up to float32 rounding, so an
integer pixel may differ by one level where a value lies within rounding of a half.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.connectors.agent.pixels import image_box, tensor_to_dtype
from rlconnect.connectors.base import ObservationConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import MAX_JSON_ELEMENTS

__all__ = ["INTERPOLATIONS", "MAX_SIDE", "FrameResizer", "Resize", "resize_weights"]

INTERPOLATIONS = ("area", "bilinear")
MAX_SIDE = 1 << 14
"""Largest output height or width: the weights are dense ``(side, input side)`` matrices."""


def _area_weights(size_in: int, size_out: int) -> np.ndarray:
    """``(size_out, size_in)``: overlap of input pixel j with output pixel i, rows sum to 1."""
    scale = size_in / size_out
    edges = np.arange(size_out + 1, dtype=np.float64) * scale  # output cell edges, input units
    start, stop = edges[:-1, None], edges[1:, None]
    j = np.arange(size_in, dtype=np.float64)[None, :]
    overlap = np.clip(np.minimum(stop, j + 1) - np.maximum(start, j), 0.0, None)
    return overlap / scale


def _bilinear_weights(size_in: int, size_out: int) -> np.ndarray:
    """``(size_out, size_in)`` weights of torch's bilinear, ``align_corners=False``."""
    scale = size_in / size_out
    src = np.clip((np.arange(size_out) + 0.5) * scale - 0.5, 0.0, None)
    lo = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
    hi = np.minimum(lo + 1, size_in - 1)
    frac = src - lo
    out = np.zeros((size_out, size_in))
    rows = np.arange(size_out)
    np.add.at(out, (rows, lo), 1.0 - frac)
    np.add.at(out, (rows, hi), frac)
    return out


def resize_weights(size_in: int, size_out: int, interpolation: str = "area") -> np.ndarray:
    """The ``(size_out, size_in)`` float32 matrix that resizes one image axis."""
    if interpolation == "area":
        weights = _area_weights(size_in, size_out)
    elif interpolation == "bilinear":
        weights = _bilinear_weights(size_in, size_out)
    else:
        raise ValueError(
            f"interpolation must be one of {list(INTERPOLATIONS)}, got {interpolation!r}"
        )
    return weights.astype(np.float32)


def _band(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(index, weight)``, ``(size_out, k)`` and ``(size_out, 1, k)``: the k nonzero
    columns of each row (padded with weight 0), for a gather-and-sum instead of a dense
    product."""
    nonzero = weights != 0
    k = max(int(nonzero.sum(axis=1).max()), 1)
    index = np.zeros((weights.shape[0], k), np.intp)
    band = np.zeros((weights.shape[0], k), np.float32)
    for i, row in enumerate(nonzero):
        cols = np.flatnonzero(row)
        index[i, : len(cols)], index[i, len(cols) :] = cols, cols[-1]
        band[i, : len(cols)] = weights[i, cols]
    return index, band[:, None, :]


class FrameResizer:
    """Resizes batches ``(B, H, W[, C])`` of frames of one size ``(H, W)`` to
    ``(B, height, width[, C])``, keeping the dtype (integers rounded to the nearest level).

    The banded weights are built once here; ``Resize`` (on a batch of every sub-env's
    frames) and the Atari env side (``rlconnect.envs.atari.ScreenFrames``, one frame per
    step) both resize with it, so their pixels are the same.
    """

    def __init__(
        self,
        size_in: tuple[int, int],
        size_out: tuple[int, int],
        dtype: Any = np.uint8,
        interpolation: str = "area",
    ) -> None:
        self._rows = _band(resize_weights(size_in[0], size_out[0], interpolation))
        self._cols = _band(resize_weights(size_in[1], size_out[1], interpolation))
        self._dtype = np.dtype(dtype)
        self._round = np.issubdtype(self._dtype, np.integer)
        self._bands: dict[Any, tuple[Any, ...]] = {}  # the bands as tensors, per device

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        # (B, H, W[, C]) -> (B, h, W[, C]); then the same along W, on the swapped view
        """Resize ``(B, H, W[, C])`` frames: rows first, then columns, each one weighted sum;
        integers rounded back to their dtype."""
        tall = _resize_axis1(frames, *self._rows)
        out = _resize_axis1(tall.swapaxes(1, 2), *self._cols).swapaxes(1, 2)
        if self._round:  # the weights are >= 0 and sum to 1: no result leaves the range
            np.rint(out, out=out)
        return out.astype(self._dtype, order="C")

    def resize_tensor(self, frames: Any) -> Any:
        """The same resize of a torch tensor ``(B, H, W[, C])``, on its device."""
        bands = self._bands.get(frames.device)
        if bands is None:
            import torch

            bands = tuple(
                torch.as_tensor(a, device=frames.device) for a in (*self._rows, *self._cols)
            )
            self._bands[frames.device] = bands
        tall = _resize_axis1_tensor(frames, *bands[:2])
        out = _resize_axis1_tensor(tall.transpose(1, 2), *bands[2:]).transpose(1, 2)
        return tensor_to_dtype(out, self._dtype).contiguous()


def _positive_int(key: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or not 1 <= int(value) <= MAX_SIDE
    ):
        raise ValueError(f"Resize: {key} must be an int in [1, {MAX_SIDE}], got {value!r}")
    return int(value)


@register_connector("Resize")
class Resize(ObservationConnector):
    """Resizes ``(H, W)`` or ``(H, W, C)`` frames to ``(height, width[, C])``, whole batch at once.

    Integer images are rounded to the nearest level; the dtype is kept. The output Box's
    bounds are the input's overall min and max (the weights are convex).

    Args:
        height: output rows (1 to ``MAX_SIDE``; at most ``spaces.MAX_JSON_ELEMENTS`` values
            per frame in all).
        width: output columns (1 to ``MAX_SIDE``).
        interpolation: ``"area"`` (box average, OpenCV's INTER_AREA when shrinking) or
            ``"bilinear"``.
    """

    takes_tensors = True

    def __init__(self, ctx: Any, height: int = 84, width: int = 84, interpolation: str = "area"):
        height, width = _positive_int("height", height), _positive_int("width", width)
        if interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"Resize: interpolation must be one of {list(INTERPOLATIONS)}, "
                f"got {interpolation!r}"
            )
        super().__init__(ctx, height=height, width=width, interpolation=interpolation)
        self.height, self.width, self.interpolation = height, width, interpolation
        self._resize: FrameResizer | None = None

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """A Box ``(height, width[, C])`` spanning the input's bounds; ValueError when the
        frames would be too large to describe."""
        box = image_box("Resize", input_space)
        shape = (self.height, self.width, *box.shape[2:])
        if math.prod(shape) > MAX_JSON_ELEMENTS:  # checked before the Box allocates its bounds
            raise ValueError(
                f"Resize: frames of shape {shape} hold more than {MAX_JSON_ELEMENTS} values "
                "(spaces.MAX_JSON_ELEMENTS)"
            )
        return gym.spaces.Box(float(box.low.min()), float(box.high.max()), shape, box.dtype)

    def setup(self, input_space: gym.Space) -> None:
        """Plan the resize weights for the input frame size once."""
        h, w = image_box("Resize", input_space).shape[:2]
        size = (self.height, self.width)
        self._resize = FrameResizer((h, w), size, input_space.dtype, self.interpolation)

    def transform(self, value: Any) -> np.ndarray:
        """The batch of frames resized, in the input dtype."""
        assert self._resize is not None, "Resize.setup runs when the pipeline is built"
        return self._resize(np.asarray(value))

    def transform_tensor(self, value: Any) -> Any:
        """The batch of frames resized on the tensors' device."""
        assert self._resize is not None, "Resize.setup runs when the pipeline is built"
        return self._resize.resize_tensor(value)


def _resize_axis1(frames: np.ndarray, index: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``out[b, o] = sum_j weights[o, 0, j] * frames[b, index[o, j]]`` as float32: one
    gather (contiguous, ``(B, O, k, rest)``) and one batched ``(1, k) @ (k, rest)`` product."""
    b, (o, k), rest = frames.shape[0], index.shape, frames.shape[2:]
    size = math.prod(rest)  # (not -1: the batch may be empty)
    near = np.take(frames, index, axis=1).reshape(b, o, k, size).astype(np.float32, copy=False)
    return np.matmul(weights, near).reshape(b, o, *rest)


def _resize_axis1_tensor(frames: Any, index: Any, weights: Any) -> Any:
    """``_resize_axis1`` with torch: one ``index_select`` and one batched product."""
    import torch

    b, (o, k), rest = frames.shape[0], tuple(index.shape), tuple(frames.shape[2:])
    size = math.prod(rest)
    near = frames.index_select(1, index.reshape(-1)).reshape(b, o, k, size).to(torch.float32)
    return torch.matmul(weights, near).reshape(b, o, *rest)
