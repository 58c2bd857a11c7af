"""Pixel connectors: ``Grayscale``, ``ScalePixels``, ``CropObservations``, ``TransposeImage``.

Each maps the whole ``obs`` column of a step at once (``(B, H, W, C)`` for all rows of all
sub-envs) with one numpy operation, and declares the Box it outputs, so a chain such as
``Grayscale -> Resize(84, 84) -> FrameStack(4)`` is checked when the pipeline is built.
Images are channel-last ``(H, W, C)`` or single-channel ``(H, W)``, as gymnasium's pixel
envs return them; use ``TransposeImage`` for channel-first models. ``Resize`` lives in
``pixels_resize``.

All of them work on torch tensors too (``takes_tensors``): the same arithmetic in float32
with torch operations on the frames' device, rounding integer images half to even as
``np.rint`` does.
"""

from __future__ import annotations

import numbers
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.connectors._tensors import torch_dtype
from rlconnect.connectors.base import ObservationConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import describe_space

__all__ = [
    "BT601",
    "CropObservations",
    "Grayscale",
    "ScalePixels",
    "TransposeImage",
    "image_box",
]

BT601 = np.array([0.299, 0.587, 0.114], dtype=np.float32)
"""ITU-R BT.601 luma weights of R, G and B."""


def image_box(name: str, space: gym.Space, ndims: tuple[int, ...] = (2, 3)) -> gym.spaces.Box:
    """``space`` as a Box of one of ``ndims`` dimensions, or a ValueError naming ``name``."""
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in ndims:
        dims = " or ".join(f"{n}-d" for n in ndims)
        raise ValueError(f"{name} needs a {dims} image Box, got {describe_space(space)}")
    return space


def _non_negative_int(name: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name}: {key} must be an int >= 0, got {value!r}")
    return int(value)


def _to_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float results back to ``dtype``: integers rounded to nearest and clipped to range."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.rint(values), info.min, info.max).astype(dtype)
    return values.astype(dtype, copy=False)


def tensor_to_dtype(values: Any, dtype: np.dtype) -> Any:
    """``_to_dtype`` for a float32 torch tensor: integers rounded to nearest (half to even,
    as ``np.rint``) and clamped to range."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = values.round().clamp(float(info.min), float(info.max))
    return values.to(torch_dtype(dtype))


@register_connector("Grayscale")
class Grayscale(ObservationConnector):
    """``(H, W, 3)`` RGB to ``(H, W)`` luma: ``0.299 R + 0.587 G + 0.114 B`` (ITU BT.601).

    Integer images are rounded to the nearest level; float images stay float. The output
    Box keeps the dtype; its bounds are the per-pixel min / max of the channel bounds.

    >>> import gymnasium as gym, numpy as np
    >>> import rlconnect as rc
    >>> space = gym.spaces.Box(0, 255, (2, 2, 3), np.uint8)
    >>> ctx = rc.ConnectorContext(space, gym.spaces.Discrete(2))
    >>> from rlconnect.connectors import Grayscale
    >>> Grayscale(ctx).output_space(space).shape
    (2, 2)
    """

    takes_tensors = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._dtype: np.dtype = np.dtype(np.uint8)
        self._weights: dict[Any, Any] = {}  # BT601 as a tensor, per device

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """A Box ``(H, W)`` without the channel axis (bounds: min of lows, max of highs);
        ValueError unless the input is ``(H, W, 3)``."""
        box = image_box("Grayscale", input_space, (3,))
        if box.shape[-1] != 3:
            raise ValueError(f"Grayscale needs RGB images (H, W, 3), got {describe_space(box)}")
        low, high = box.low.min(axis=-1), box.high.max(axis=-1)
        return gym.spaces.Box(low, high, box.shape[:-1], box.dtype)

    def setup(self, input_space: gym.Space) -> None:
        """Keep the input dtype: luma is rounded back to it (uint8 stays uint8)."""
        self._dtype = np.dtype(input_space.dtype)

    def transform(self, value: Any) -> np.ndarray:
        """``(B, H, W, 3)`` frames as ``(B, H, W)`` luma in the input dtype."""
        rgb = np.asarray(value)
        luma = rgb.astype(np.float32, copy=False) @ BT601  # (B, H, W, 3) @ (3,) -> (B, H, W)
        return _to_dtype(luma, self._dtype)

    def transform_tensor(self, value: Any) -> Any:
        """The same weighting on torch tensors (the weights cached per device)."""
        import torch

        weights = self._weights.get(value.device)
        if weights is None:
            weights = self._weights[value.device] = torch.as_tensor(BT601, device=value.device)
        return tensor_to_dtype(value.to(torch.float32) @ weights, self._dtype)


@register_connector("ScalePixels")
class ScalePixels(ObservationConnector):
    """uint8 pixels to float32 in ``[0, 1]`` (divided by 255).

    Leave it out to keep uint8 frames (4x less memory) and scale inside the model.
    """

    takes_tensors = True

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """A float32 Box of the same shape, bounds divided by 255; ValueError unless the
        pixels are uint8."""
        box = image_box("ScalePixels", input_space, (1, 2, 3, 4))
        if box.dtype != np.uint8:
            raise ValueError(f"ScalePixels needs uint8 pixels, got {describe_space(box)}")
        low = box.low.astype(np.float32) / 255.0
        high = box.high.astype(np.float32) / 255.0
        return gym.spaces.Box(low, high, box.shape, np.float32)

    def transform(self, value: Any) -> np.ndarray:
        """The pixels as float32, times 1/255."""
        out = np.asarray(value, dtype=np.float32)
        out *= np.float32(1.0 / 255.0)
        return out

    def transform_tensor(self, value: Any) -> Any:
        """The same scale on torch tensors (the float32 factor, so both paths agree bit for bit)."""
        import torch

        return value.to(torch.float32) * float(np.float32(1.0 / 255.0))


@register_connector("CropObservations")
class CropObservations(ObservationConnector):
    """Cuts ``top``, ``bottom``, ``left`` and ``right`` pixels off every ``(H, W[, C])`` frame.

    Args:
        top: rows removed at the top.
        bottom: rows removed at the bottom.
        left: columns removed on the left.
        right: columns removed on the right.
    """

    takes_tensors = True

    def __init__(self, ctx: Any, top: int = 0, bottom: int = 0, left: int = 0, right: int = 0):
        sides = {"top": top, "bottom": bottom, "left": left, "right": right}
        sides = {k: _non_negative_int("CropObservations", k, v) for k, v in sides.items()}
        super().__init__(ctx, **sides)
        self.top, self.bottom = sides["top"], sides["bottom"]
        self.left, self.right = sides["left"], sides["right"]

    def _crop(self, frames: Any, lead: int) -> Any:
        """Crop the two axes after ``lead`` leading axes."""
        h, w = frames.shape[lead], frames.shape[lead + 1]
        index = (slice(None),) * lead + (
            slice(self.top, h - self.bottom),
            slice(self.left, w - self.right),
        )
        return frames[index]

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """The Box cut to the crop; ValueError when the crop leaves no pixel."""
        box = image_box("CropObservations", input_space)
        h, w = box.shape[:2]
        if self.top + self.bottom >= h or self.left + self.right >= w:
            raise ValueError(
                f"CropObservations(top={self.top}, bottom={self.bottom}, left={self.left}, "
                f"right={self.right}) leaves nothing of {describe_space(box)}"
            )
        low, high = self._crop(box.low, 0), self._crop(box.high, 0)
        return gym.spaces.Box(low, high, low.shape, box.dtype)

    def transform(self, value: Any) -> np.ndarray:
        """The cropped frames as a contiguous array (not a view of the env's buffer)."""
        return np.ascontiguousarray(self._crop(np.asarray(value), 1))

    def transform_tensor(self, value: Any) -> Any:
        """The cropped frames as a contiguous tensor."""
        return self._crop(value, 1).contiguous()


_LAYOUTS = ("CHW", "HWC")


@register_connector("TransposeImage")
class TransposeImage(ObservationConnector):
    """Channel-last ``(H, W, C)`` to channel-first ``(C, H, W)`` (``to="CHW"``), or back.

    Args:
        to: ``"CHW"`` (the default; input is HWC) or ``"HWC"`` (input is CHW).
    """

    takes_tensors = True

    def __init__(self, ctx: Any, to: str = "CHW") -> None:
        if to not in _LAYOUTS:
            raise ValueError(f"TransposeImage: to must be one of {list(_LAYOUTS)}, got {to!r}")
        super().__init__(ctx, to=to)
        self.axes = (2, 0, 1) if to == "CHW" else (1, 2, 0)

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """The Box with its axes moved (``(H, W, C)`` to ``(C, H, W)`` or back)."""
        box = image_box("TransposeImage", input_space, (3,))
        low, high = box.low.transpose(self.axes), box.high.transpose(self.axes)
        return gym.spaces.Box(low, high, low.shape, box.dtype)

    def transform(self, value: Any) -> np.ndarray:
        """The frames with their axes moved, as a contiguous array."""
        return np.ascontiguousarray(np.asarray(value).transpose(0, *(a + 1 for a in self.axes)))

    def transform_tensor(self, value: Any) -> Any:
        """The frames with their axes moved, as a contiguous tensor."""
        return value.permute(0, *(a + 1 for a in self.axes)).contiguous()
