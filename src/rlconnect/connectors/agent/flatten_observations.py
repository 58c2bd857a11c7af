"""FlattenObservations: any observation space to one flat float32 vector per row."""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
import numpy as np

from rlconnect.connectors._deferred import DeferredRows
from rlconnect.connectors._tensors import holds_tensors
from rlconnect.connectors.base import AgentData, ObservationConnector
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import describe_space, flatten_space
from rlconnect.spaces.flatten import Flattener, make_flattener
from rlconnect.spaces.tensors import TensorFlattener

__all__ = ["FlattenObservations"]


@register_connector("FlattenObservations")
class FlattenObservations(ObservationConnector):
    """Maps ``obs`` of any space to ``(B, flat_dim)`` float32.

    Box and MultiBinary parts are reshaped and cast; Discrete and MultiDiscrete parts become
    one-hot vectors; Tuple and Dict parts are concatenated in the space's order. Output
    space: ``spaces.flatten_space(input_space)``, a float32 Box (one-hot parts in [0, 1]).

    On torch tensors (nests of them for Dict/Tuple spaces) it flattens on their device with
    torch operations. A Discrete/MultiDiscrete index out of range, a ValueError at once on
    numpy, gives an all-zero one-hot part there and is recorded instead: ``pending_flag()``
    turns True and ``raise_pending()`` raises the ValueError naming the rows (the runner
    checks once per ``sample()``).
    """

    takes_tensors = True
    _flatten: Flattener | None = None  # planned once per bound input space, in setup
    _tensor_flatten: TensorFlattener | None = None
    _deferred: DeferredRows | None = None

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """The flat float32 Box of ``input_space``; ValueError for a space that cannot be
        flattened (e.g. a Sequence or Graph)."""
        try:
            return flatten_space(input_space)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def setup(self, input_space: gym.Space) -> None:
        """Plan the flattening for ``input_space`` once, on numpy and on tensors."""
        self._flatten = make_flattener(input_space)
        self._tensor_flatten = TensorFlattener(input_space)

    def transform(self, value: Any) -> np.ndarray:
        """A numpy batch of observations as ``(B, flat_dim)`` float32."""
        if self._flatten is None:
            self.input_space  # noqa: B018  (binds a standalone connector: setup plans)
        return cast("Flattener", self._flatten)(value)

    def __call__(self, data: AgentData) -> AgentData:
        """Flatten ``obs``; on tensors an out-of-range Discrete index is recorded for
        ``raise_pending`` instead of read on the host."""
        obs = data["obs"]
        if not holds_tensors(obs):
            return super().__call__(data)
        if self._tensor_flatten is None:
            self.input_space  # noqa: B018  (binds a standalone connector: setup plans)
        flat, bad = cast("TensorFlattener", self._tensor_flatten)(obs)
        if self._deferred is None:
            self._deferred = DeferredRows()
        self._deferred.record(bad, data)
        data["obs"] = flat
        return data

    def pending_flag(self) -> Any:
        """True on the device when a tensor batch held an out-of-range Discrete index."""
        return None if self._deferred is None else self._deferred.flag()

    def raise_pending(self) -> None:
        """ValueError naming (up to five of) the rows whose Discrete / MultiDiscrete index
        was out of range on the tensor path; nothing when none was."""
        found = None if self._deferred is None else self._deferred.take()
        if found is None:
            return
        keys = ", ".join(f"(env_id={e}, agent_id={a!r})" for e, a in found[0][:5])
        more = f" and {len(found[0]) - 5} more" if len(found[0]) > 5 else ""
        raise ValueError(
            f"{self.name}: observations outside {describe_space(self.input_space)} "
            f"(a Discrete/MultiDiscrete index out of range) in rows {keys}{more}; their "
            "one-hot parts were zeros"
        )
