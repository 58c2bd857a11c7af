"""The tensor path's deferred finite check: where each sub-env first returned a NaN or inf.

A round of the tensor path reads nothing back, so a non-finite observation or reward is
noted on the device (``FiniteMarks.mark``) and read with the ``sample()``'s host read:
per sub-env the episode step and round of its first bad value, which field it was in,
and its episode's returns before that step (what a faulty episode reports, as the numpy
path does). A sub-env's marks stay until it is restarted (``clear``): a sample that
reads its rounds in two parts sees them twice and reports them once (``known``).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["NONE", "FiniteMarks"]

NONE = -1  #: no non-finite value (an episode step otherwise)


class FiniteMarks:
    """Per sub-env (N,): ``step`` (episode step of the first bad value, ``NONE``: none),
    ``round`` (its round in the sample), ``field`` (0 observation, 1 reward) and
    ``returns`` (A, N) before it; ``known``: sub-env -> round, the faulty ones already
    reported and not yet restarted (host)."""

    def __init__(self, num_envs: int, agents: int, device: torch.device) -> None:
        self.step = torch.full((num_envs,), NONE, dtype=torch.int64, device=device)
        self.round = torch.full((num_envs,), NONE, dtype=torch.int64, device=device)
        self.field = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.returns = torch.zeros((agents, num_envs), dtype=torch.float64, device=device)
        self.known: dict[int, int] = {}

    def mark(
        self,
        bad: torch.Tensor,
        step: torch.Tensor,
        rounds: torch.Tensor | int,
        field: torch.Tensor,
        returns: torch.Tensor,
    ) -> None:
        """Note the sub-envs where ``bad`` (N,) at ``step`` and ``rounds``, in ``field``,
        with ``returns`` before it, unless an earlier value of theirs is noted."""
        first = bad & (self.step == NONE)
        self.step = torch.where(first, step, self.step)
        if isinstance(rounds, int):
            self.round.masked_fill_(first, rounds)
        else:
            self.round = torch.where(first, rounds, self.round)
        self.field = torch.where(first, field.to(torch.int64), self.field)
        self.returns = torch.where(first, returns, self.returns)

    def tensors(self) -> list[torch.Tensor]:
        """What the read carries, float64, flat: step, field, round (N each), returns."""
        return [
            self.step.to(torch.float64),
            self.field.to(torch.float64),
            self.round.to(torch.float64),
            self.returns.flatten(),
        ]

    @staticmethod
    def size(num_envs: int, agents: int) -> int:
        """The values ``tensors`` holds."""
        return (3 + agents) * num_envs

    def clear(self, mask: torch.Tensor, env_ids: list[int]) -> None:
        """Sub-envs ``env_ids`` (``mask`` (N,), the same ones) restart: no marks of theirs."""
        self.step.masked_fill_(mask, NONE)
        self.round.masked_fill_(mask, NONE)
        for e in env_ids:
            self.known.pop(e, None)

    def new_bad(self, step: np.ndarray, rounds: np.ndarray) -> dict[int, int]:
        """From read marks: sub-env -> bad round of those not reported yet (now known)."""
        new = {
            int(e): int(rounds[e]) for e in np.flatnonzero(step != NONE) if int(e) not in self.known
        }
        self.known.update(new)
        return new
