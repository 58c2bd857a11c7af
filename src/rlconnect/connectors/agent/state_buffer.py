"""StateBuffer: keeps each agent's RNN state between steps and feeds it back as ``state_in_*``."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlconnect.connectors.action.convert_to_numpy import to_numpy
from rlconnect.connectors.agent._rows import RowState, expand_rows
from rlconnect.connectors.agent._slots import SlotTable
from rlconnect.connectors.base import ActionData, AgentConnector, AgentData
from rlconnect.connectors.registry import register_connector

__all__ = ["StateBuffer"]


@register_connector("StateBuffer")
class StateBuffer(AgentConnector):
    """Adds ``state_in_0 .. state_in_{n-1}`` columns, one per ``ctx.initial_states`` entry.

    ``state_in_i`` of a row is the ``state_out_i`` its agent's previous row produced
    (recorded by ``on_policy_output``), or ``ctx.initial_states[i]`` at the agent's first
    row of an episode (a new ``(env_id, agent_id)``, or the first after ``reset(env_id)``).
    With no initial states (a feed-forward policy) it adds nothing. ``on_policy_output``
    raises ValueError when a ``state_out_i`` column is missing or mis-shaped. The states
    are per-episode and are not saved in a checkpoint. ``obs`` and its space are unchanged.

    On the tensor path the states are tensors ``(R, ...)`` per row of the fixed layout, on
    the rows' device, starting from ``ctx.initial_states`` moved there once;
    ``reset_where(ended)`` starts the rows of ended sub-envs from the initial state again,
    and rows outside ``data.mask`` keep theirs.
    """

    takes_tensors = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._initial = [np.asarray(s) for s in ctx.initial_states]
        self._table = SlotTable()
        for i, s in enumerate(self._initial):
            self._table.add(f"state_{i}", s[None])
        self._rows = RowState()

    @property
    def num_states(self) -> int:
        """How many state tensors the policy keeps."""
        return len(self._initial)

    def __call__(self, data: AgentData) -> AgentData:
        """Add each row's ``state_in_i`` columns: the state its agent's last policy step
        returned, or the initial state for a new agent."""
        if not self._initial:
            return data
        if data.on_tensors:
            return self._call_tensors(data)
        slots, new = self._table.lookup(data.row_keys())
        any_new = bool(new.any())
        for i, init in enumerate(self._initial):
            state = self._table[f"state_{i}"][slots]
            if any_new:
                state[new] = init
            data[f"state_in_{i}"] = state
        return data

    def _call_tensors(self, data: AgentData) -> AgentData:
        import torch

        def make(rows: int, device: Any) -> dict[str, Any]:
            out = {}
            for i, init in enumerate(self._initial):
                first = torch.as_tensor(init, device=device)
                out[f"init_{i}"] = first
                out[f"state_{i}"] = first.expand(rows, *first.shape).clone()
            return out

        fresh = self._rows.begin(data, make)
        tensors = self._rows.tensors
        for i in range(len(self._initial)):
            store = tensors[f"state_{i}"]
            state = torch.where(expand_rows(fresh, store), tensors[f"init_{i}"], store)
            self._rows.put(f"state_{i}", state, data.mask)
            data[f"state_in_{i}"] = state
        return data

    def _check_output(self, output: ActionData, i: int) -> Any:
        name = f"state_out_{i}"
        if name not in output:
            raise ValueError(
                f"{self.name}: the policy output has no {name!r} column but the policy "
                f"has {len(self._initial)} initial states; columns: {sorted(output.keys())}"
            )
        value = output[name]
        if tuple(np.shape(value)[1:]) != self._initial[i].shape:
            raise ValueError(
                f"{self.name}: {name!r} rows have shape {tuple(np.shape(value)[1:])}, "
                f"the initial state has {self._initial[i].shape}"
            )
        return value

    def on_policy_output(self, output: ActionData) -> None:
        """Keep the policy's ``state_out_i`` of each row as its agent's next ``state_in_i``."""
        if not self._initial:
            return
        if output.on_tensors:
            if self._rows.fresh is not None:
                for i in range(len(self._initial)):
                    self._rows.put(f"state_{i}", self._check_output(output, i), output.mask)
            return
        slots = self._table.find(output.row_keys())
        known = slots >= 0
        every = bool(known.all())
        rows = slots if every else slots[known]
        for i in range(len(self._initial)):
            value = np.asarray(to_numpy(self._check_output(output, i)))
            self._table[f"state_{i}"][rows] = value if every else value[known]

    def reset(self, env_id: int) -> None:
        """Forget the states of ``env_id``'s agents: the next episode starts from the initial
        state."""
        self._table.reset(env_id)
        self._rows.reset(env_id)

    def reset_where(self, ended: Any) -> None:
        """Tensor path: the rows of the sub-envs in ``ended`` start again from the initial
        state."""
        self._rows.reset_where(ended)

    def to(self, device: Any) -> None:
        """Move the tensor path's state buffer to ``device``."""
        self._rows.to(device)
