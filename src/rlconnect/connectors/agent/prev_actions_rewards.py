"""PrevActionsRewards: adds each agent's previous action and the reward it just received."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.connectors.action.convert_to_numpy import to_numpy
from rlconnect.connectors.agent._rows import RowState, expand_rows
from rlconnect.connectors.agent._slots import SlotTable
from rlconnect.connectors.base import ActionData, AgentConnector, AgentData
from rlconnect.connectors.registry import register_connector
from rlconnect.spaces import zeros_batch

__all__ = ["PrevActionsRewards"]


@register_connector("PrevActionsRewards")
class PrevActionsRewards(AgentConnector):
    """Adds ``prev_actions`` and ``prev_rewards`` columns from each agent's own history.

    ``prev_actions`` is the action the agent took at its previous step, as recorded by
    ``on_policy_output`` from ``output["actions"]`` (the policy's raw output, before the
    action pipeline); at an agent's first row of an episode it is
    ``spaces.zeros_batch(ctx.action_space, ...)`` (zeros; ``start`` for Discrete).
    ``prev_rewards`` (float32) is the ``rewards`` column of the row, i.e. the reward the
    agent received with its current observation, and 0 at its first row of an episode (or
    when there is no ``rewards`` column). ``obs`` and its space are unchanged.

    On the tensor path the previous actions are tensors ``(R, ...)`` per row of the fixed
    layout, on the rows' device; ``reset_where(ended)`` starts the rows of ended sub-envs
    afresh, and rows outside ``data.mask`` keep their state.
    """

    takes_tensors = True

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        try:
            template = zeros_batch(ctx.action_space, 0)
        except TypeError as exc:
            raise ValueError(f"PrevActionsRewards: {exc}") from None
        self._table = SlotTable()
        self._table.add("actions", template)
        self._rows = RowState()

    def __call__(self, data: AgentData) -> AgentData:
        """Add ``prev_actions`` (zeros at an agent's first row) and ``prev_rewards``."""
        if data.on_tensors:
            return self._call_tensors(data)
        slots, new = self._table.lookup(data.row_keys())
        prev = self._previous_actions(slots, new)
        rewards = data.get("rewards")
        if rewards is None:
            prev_rewards = np.zeros(len(data), np.float32)
        else:
            prev_rewards = np.asarray(rewards, np.float32).copy()
            prev_rewards[new] = 0.0
        data["prev_actions"] = prev
        data["prev_rewards"] = prev_rewards
        return data

    def _previous_actions(self, slots: np.ndarray, new: np.ndarray) -> Any:
        """The stored actions of ``slots``, zeros for the ``new`` rows (a copy)."""
        prev = tree.map_structure(lambda store: store[slots], self._table["actions"])
        if new.any():  # Discrete/MultiDiscrete "zero" is their start value
            zeros = zeros_batch(self.ctx.action_space, int(new.sum()))
            tree.map_structure(lambda out, z: out.__setitem__(new, z), prev, zeros)
        return prev

    def closing_row(self, data: AgentData) -> AgentData:
        """An agent's closing row gets what its next row would: its last action as
        ``prev_actions`` and the reward since as ``prev_rewards`` (its slot is kept)."""
        slots = self._table.find(data.row_keys())
        unknown = slots < 0  # (an agent that never acted: zeros, as at a first row)
        data["prev_actions"] = self._previous_actions(np.where(unknown, 0, slots), unknown)
        rewards = data.get("rewards")
        if rewards is None:
            prev_rewards = np.zeros(len(data), np.float32)
        else:
            prev_rewards = np.array(rewards, np.float32)
            prev_rewards[unknown] = 0.0
        data["prev_rewards"] = prev_rewards
        return data

    def _call_tensors(self, data: AgentData) -> AgentData:
        import torch

        def make(rows: int, device: Any) -> dict[str, Any]:
            zeros = zeros_batch(self.ctx.action_space, rows)
            as_tensors = tree.map_structure(lambda z: torch.as_tensor(z, device=device), zeros)
            return {"actions": as_tensors, "zeros": as_tensors}

        fresh = self._rows.begin(data, make)
        prev = tree.map_structure(
            lambda store, zero: torch.where(expand_rows(fresh, store), zero, store),
            self._rows.tensors["actions"],
            self._rows.tensors["zeros"],
        )
        self._rows.put("actions", prev, data.mask)  # a fresh row keeps its zeros until acting
        rewards = data.get("rewards")
        device = data.env_ids.device
        if rewards is None:
            prev_rewards = torch.zeros(len(data), dtype=torch.float32, device=device)
        else:
            prev_rewards = torch.where(fresh, 0.0, rewards.to(torch.float32))
        data["prev_actions"] = prev
        data["prev_rewards"] = prev_rewards
        return data

    def on_policy_output(self, output: ActionData) -> None:
        """Record each known row's raw action as its agent's next ``prev_actions``."""
        if output.on_tensors:
            if self._rows.fresh is not None:  # rows seen before (as numpy: known keys only)
                self._rows.put("actions", output["actions"], output.mask)
            return
        slots = self._table.find(output.row_keys())
        known = slots >= 0
        if not known.any():
            return
        actions = to_numpy(output["actions"])
        rows = slots if known.all() else slots[known]

        def scatter(store: np.ndarray, value: Any) -> None:
            value = np.asarray(value)
            store[rows] = value if known.all() else value[known]

        tree.map_structure(scatter, self._table["actions"], actions)

    def reset(self, env_id: int) -> None:
        """Forget the history of ``env_id``'s agents: the next episode starts at zeros."""
        self._table.reset(env_id)
        self._rows.reset(env_id)

    def reset_where(self, ended: Any) -> None:
        """Tensor path: the rows of the sub-envs in ``ended`` start again at zeros."""
        self._rows.reset_where(ended)

    def to(self, device: Any) -> None:
        """Move the tensor path's previous actions to ``device``."""
        self._rows.to(device)

    def output_space(self, input_space: gym.Space) -> gym.Space:
        """``input_space`` unchanged: the new columns sit beside ``obs``."""
        return input_space
