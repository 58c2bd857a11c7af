"""Shared fixtures: tiny torch models with known outputs."""

from __future__ import annotations

import torch
from torch import nn


class FixedOutputModel(nn.Module):
    """Returns the same distribution inputs (a learnable row) for every observation."""

    def __init__(self, row: list[float], value: bool = False) -> None:
        super().__init__()
        self.row = nn.Parameter(torch.tensor(row, dtype=torch.float32))
        self.value = value

    def forward(self, obs: torch.Tensor):
        out = self.row.expand(obs.shape[0], -1)
        if self.value:
            return out, obs.reshape(obs.shape[0], -1).sum(dim=1)
        return out


class LinearModel(nn.Module):
    """dist_inputs = flatten(obs) @ W + b, optionally with a value head (B, 1)."""

    def __init__(self, in_dim: int, out_dim: int, value: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(123)
        self.lin = nn.Linear(in_dim, out_dim)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(out_dim, in_dim, generator=gen))
        self.vf = nn.Linear(in_dim, 1) if value else None

    def forward(self, obs: torch.Tensor):
        x = obs.reshape(obs.shape[0], -1)
        out = self.lin(x)
        return out if self.vf is None else (out, self.vf(x))


class GRUModel(nn.Module):
    """A recurrent model: one GRUCell state of size ``hidden``, logits from the new state."""

    def __init__(self, in_dim: int, n_actions: int, hidden: int = 5) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.GRUCell(in_dim, hidden)
        self.head = nn.Linear(hidden, n_actions)
        self.vf = nn.Linear(hidden, 1)

    def get_initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(self.hidden)]

    def forward(self, obs: torch.Tensor, state: list[torch.Tensor]):
        h = self.cell(obs, state[0])
        return self.head(h), [h], self.vf(h)
