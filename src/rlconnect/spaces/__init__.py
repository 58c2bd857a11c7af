"""Batched helpers for gymnasium spaces: flatten, stack, validate, squash, and a safe JSON codec.

A *batch* of a space is the stacked structure of B samples: Box -> array ``(B, *shape)``,
Discrete -> int64 ``(B,)``, MultiDiscrete -> ``(B, *nvec.shape)``, MultiBinary -> ``(B, *shape)``,
Tuple -> tuple of batches, Dict -> dict of batches (in ``space.spaces`` order). Everything works
on whole batches with numpy; Python loops run only over sub-spaces.

>>> from gymnasium.spaces import Dict, Discrete, Box
>>> sp = Dict({"a": Discrete(3, start=1), "b": Box(-1.0, 1.0, (2,))})
>>> flatten_batch(sp, {"a": np.array([1, 3]), "b": np.zeros((2, 2))})
array([[1., 0., 0., 0., 0.],
       [0., 0., 1., 0., 0.]], dtype=float32)
>>> describe_space(sp)
'Dict(a: Discrete(3, start=1), b: Box(-1.0, 1.0, (2,), float32))'
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (the module docstring example uses np)

from rlconnect.spaces.box import clip_to_space, squash, unsquash
from rlconnect.spaces.checks import Problem as Problem
from rlconnect.spaces.checks import batch_in_space, check_batch
from rlconnect.spaces.codec import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from rlconnect.spaces.codec import MAX_JSON_ELEMENTS as MAX_JSON_ELEMENTS
from rlconnect.spaces.codec import MAX_SPACE_BYTES as MAX_SPACE_BYTES
from rlconnect.spaces.codec import space_from_json, space_to_json
from rlconnect.spaces.describe import describe_space, spaces_equal
from rlconnect.spaces.flatten import (
    batch_len,
    flat_dim,
    flatten_batch,
    flatten_space,
    stack_samples,
    unstack_batch,
    zeros_batch,
)

__all__ = [
    "batch_in_space",
    "batch_len",
    "check_batch",
    "clip_to_space",
    "describe_space",
    "flat_dim",
    "flatten_batch",
    "flatten_space",
    "space_from_json",
    "space_to_json",
    "spaces_equal",
    "squash",
    "stack_samples",
    "unsquash",
    "unstack_batch",
    "zeros_batch",
]
