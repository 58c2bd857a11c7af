"""Hand a batch to another library's learner: TorchRL's TensorDict and Stable-Baselines3's
replay buffer.

- `to_tensordict` (extra ``rlconnect[torchrl]``): a ``tensordict.TensorDict`` in TorchRL's
  layout, which its losses (``ClipPPOLoss``), advantage modules (``GAE``) and replay buffers
  take as they take a TorchRL collector's output.
- `fill_sb3_buffer` (extra ``rlconnect[sb3]``): a batch's rows written into an SB3
  ``ReplayBuffer`` as whole arrays, with SB3's own time-limit convention.

The peer libraries are imported inside these functions only: ``import rlconnect`` never
imports them, and a missing one is named when a function needs it.
"""

from __future__ import annotations

from rlconnect.interop.errors import InteropError
from rlconnect.interop.sb3_buffers import fill_sb3_buffer
from rlconnect.interop.tensordicts import to_tensordict

__all__ = ["InteropError", "fill_sb3_buffer", "to_tensordict"]
