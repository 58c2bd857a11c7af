"""Episode bookkeeping of the tensor path: ids, lengths and returns as tensors.

On a batched tensor simulator every sub-env's episode advances at every round, and which
ones end is device data. ``TensorEpisodes`` keeps the table of the running episodes (id,
length, return per agent) on the device and updates it with masked whole-tensor
operations, so a round reads nothing back. The episodes that end are logged, a tensor per
round, and read back once per ``sample()`` (``read_back``): one transfer that also
carries the first non-finite value each sub-env returned (the deferred finite check).
Per-episode records are made from that read only when ``get_metrics()`` asks for them;
``metrics()`` folds the arrays (``hand_over``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rlconnect.episodes.episode import Episode
from rlconnect.errors import EnvCheckError

__all__ = ["EndedEpisodes", "TensorEpisodes"]

_FIELDS = ("obs", "reward")  #: what a non-finite value was found in, by code
_NONE = -1  #: no non-finite value (an episode step otherwise)


class EndedEpisodes:
    """The episodes that ended during one ``sample()``, as host arrays: ``eps_id``,
    ``env_id``, ``length`` (N_ended,) and ``returns`` (N_ended, A), agents in ``agents``
    order."""

    def __init__(
        self, eps_id: np.ndarray, env_id: np.ndarray, length: np.ndarray, returns: np.ndarray
    ) -> None:
        self.eps_id, self.env_id, self.length, self.returns = eps_id, env_id, length, returns

    def __len__(self) -> int:
        return len(self.eps_id)


class TensorEpisodes:
    """The running episode of each of ``num_envs`` sub-envs, for agents ``agents``.

    ``eps_id`` are numbered from ``next_id`` in sub-env order, as on the numpy path (new
    ids for the sub-envs that ended at a round are ``next + cumsum(ended) - 1``).
    ``policy_of(agent)`` names each agent's policy for the ``agent_rewards`` keys.
    """

    def __init__(
        self,
        num_envs: int,
        agents: Sequence[Any],
        device: torch.device,
        *,
        first_id: int,
        policy_of: Callable[[Any], str],
    ) -> None:
        self.num_envs, self.agents, self.device = num_envs, tuple(agents), device
        self.next_id = first_id
        self._policy_of = policy_of
        self.length = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.returns = torch.zeros(len(self.agents), num_envs, dtype=torch.float64, device=device)
        self.eps_id = torch.full((num_envs,), -1, dtype=torch.int64, device=device)
        self._next = torch.zeros((), dtype=torch.int64, device=device)
        self._log = torch.zeros((0, 3 + len(self.agents), num_envs), dtype=torch.float64)
        self._log_rows: list[tuple[torch.Tensor, ...]] = []  # per round: views of its row
        self._bad_poll = torch.full((num_envs,), _NONE, dtype=torch.int64, device=device)
        self._bad_field = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self._ended: list[EndedEpisodes] = []

    def start(self) -> None:
        """Every sub-env begins an episode (the first round)."""
        self._next.fill_(self.next_id)
        self.eps_id = self._next + torch.arange(self.num_envs, device=self.device)
        self._next += self.num_envs
        self.length.zero_()
        self.returns.zero_()

    def advance(
        self,
        rewards: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        horizon: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One env step of every episode with ``rewards`` (A, N): lengths and returns grow;
        returns ``(terminated, truncated, ended)`` with the horizon's truncation added."""
        self.length += 1
        self.returns += rewards  # (float32 rewards added in float64)
        if horizon is not None:
            truncated = truncated | (self.length >= horizon)
        return terminated, truncated, terminated | truncated

    def check_finite(self, obs_ok: torch.Tensor, reward_ok: torch.Tensor) -> None:
        """Keep, per sub-env, the episode step (lengths advanced) at which its observation
        or reward (N,) was first not finite (checked once per ``sample()``, in
        ``read_back``): 0 for the observation, 1 for the reward in ``_bad_field``."""
        first = ~(obs_ok & reward_ok) & (self._bad_poll == _NONE)
        self._bad_poll = torch.where(first, self.length, self._bad_poll)
        self._bad_field = torch.where(first, obs_ok, self._bad_field)

    def note_nonfinite(
        self, step: torch.Tensor, is_reward: torch.Tensor, bad: torch.Tensor
    ) -> None:
        """The finite check done on a sample's recorded rows (``TensorStore``): per sub-env
        (N,) whether it found a NaN or inf (``bad``), at which episode step, and whether
        in the reward; kept unless an earlier one is."""
        first = bad & (self._bad_poll == _NONE)
        self._bad_poll = torch.where(first, step, self._bad_poll)
        self._bad_field = torch.where(first, is_reward.to(torch.int64), self._bad_field)

    def begin_sample(self, rounds: int) -> None:
        """A ``sample()`` of ``rounds`` rounds starts: its log of ended episodes, one row
        per round of (ended, length, eps_id, return per agent) for every sub-env (made
        once, and written over by every sample: ``end`` writes each round's whole row)."""
        shape = (rounds, 3 + len(self.agents), self.num_envs)
        if self._log.shape != shape:
            self._log = torch.zeros(shape, dtype=torch.float64, device=self.device)
            self._log_rows = [(row[0], row[1], row[2], row[3:]) for row in self._log.unbind(0)]

    def end(self, k: int, ended: torch.Tensor) -> None:
        """Log round ``k``'s episodes that ``ended`` (N,); begin new ones in their sub-envs."""
        ended_row, length_row, eps_row, returns_row = self._log_rows[k]
        ended_row.copy_(ended)
        length_row.copy_(self.length)
        eps_row.copy_(self.eps_id)
        returns_row.copy_(self.returns)
        new_ids = self._next + torch.cumsum(ended, 0, dtype=torch.int64) - 1
        self.eps_id = torch.where(ended, new_ids, self.eps_id)
        self._next += ended.sum()
        self.length.masked_fill_(ended, 0)
        self.returns.masked_fill_(ended, 0.0)

    def read_back(self, flags: Sequence[torch.Tensor] = ()) -> tuple[EndedEpisodes, list[bool]]:
        """The one host read of a ``sample()``: the episodes that ended since the last
        call, the finite check (``EnvCheckError`` naming the first non-finite value's
        sub-env, field and episode step), and the values of the 0-d bool ``flags`` (what
        else must be checked once per sample) that travel with them."""
        n = self.num_envs
        parts = [self._log.flatten()]
        parts += [self._bad_poll.to(torch.float64), self._bad_field.to(torch.float64)]
        parts += [f.to(torch.float64).reshape(1) for f in flags]
        parts.append(self._next.to(torch.float64).reshape(1))
        flat = torch.cat(parts).cpu().numpy()  # the read
        body = flat[: len(flat) - 1 - len(flags)]  # (a view: the log is megabytes)
        flag_values = [bool(v) for v in flat[len(body) : -1]]
        self.next_id = int(flat[-1])
        bad_poll, bad_field = body[-2 * n : -n], body[-n:]
        rounds = body[: -2 * n].reshape(-1, 3 + len(self.agents), n)
        self._refuse_nonfinite(bad_poll, bad_field)
        ended_at, env = np.nonzero(rounds[:, 0] > 0.5)
        out = EndedEpisodes(
            rounds[ended_at, 2, env].astype(np.int64),
            env.astype(np.int64),
            rounds[ended_at, 1, env].astype(np.int64),
            rounds[ended_at, 3:, env],
        )
        self._ended.append(out)  # (until the runner's hand_over, once per sample())
        return out, flag_values

    def refuse_nonfinite(self) -> None:
        """``EnvCheckError`` as ``read_back`` raises it, for what ``note_nonfinite`` noted
        after that read (a second host read, made only when a value may not be finite)."""
        found = torch.stack([self._bad_poll, self._bad_field]).cpu().numpy()
        self._refuse_nonfinite(found[0], found[1])

    def _refuse_nonfinite(self, bad_poll: np.ndarray, bad_field: np.ndarray) -> None:
        bad = np.flatnonzero(bad_poll != _NONE)
        if not len(bad):
            return
        env = int(bad[np.argmin(bad_poll[bad])])
        field = _FIELDS[int(bad_field[env])]
        raise EnvCheckError(
            f"sub-env {env} returned a non-finite {field} (NaN or inf) at step "
            f"{int(bad_poll[env])} of its episode (found at the end of sample(), where the "
            f"tensor path checks); {len(bad)} sub-env(s) did. Fix the simulator, or pass "
            "RunnerConfig(check_finite=False) to record such values as they are"
        )

    def hand_over(self, log: Any, run_metrics: Any) -> None:
        """The episodes ended since the last call, as whole arrays to the runner's
        ``metrics()`` window (``add_episode_arrays``) and as records made only when
        ``get_metrics()`` asks (``log.extend_lazy``)."""
        pairs = [(a, self._policy_of(a)) for a in self.agents]
        for ended in self._ended:
            if len(ended):
                run_metrics.add_episode_arrays(ended.length, ended.returns, pairs)
                log.extend_lazy(len(ended), functools.partial(self.records, ended))
        self._ended.clear()

    def records(self, ended: EndedEpisodes) -> list[dict[str, Any]]:
        """The ``get_metrics()`` records of ``ended``: one dict each, made from lists."""
        pairs = [(a, self._policy_of(a)) for a in self.agents]
        rows = zip(
            ended.eps_id.tolist(),
            ended.env_id.tolist(),
            ended.length.tolist(),
            ended.returns.sum(1).tolist(),
            ended.returns.tolist(),
        )
        return [
            {
                "episode_id": eps,
                "env_id": env,
                "episode_length": length,
                "episode_reward": total,
                "agent_rewards": dict(zip(pairs, returns)),
                "custom_metrics": {},
                "hist_data": {},
                "episode_faulty": False,
            }
            for eps, env, length, total, returns in rows
        ]

    def episode(self, ended: EndedEpisodes, i: int, runner: Any) -> Episode:
        """An ``Episode`` of ended episode ``i``, for ``on_episode_end`` callbacks."""

        def mapping(agent_id: Any, episode: Episode, **kwargs: Any) -> str:
            return self._policy_of(agent_id)

        ep = Episode(int(ended.eps_id[i]), int(ended.env_id[i]), mapping, worker=runner)
        ep.length = int(ended.length[i])
        ep.total_reward = float(ended.returns[i].sum())
        for a in self.agents:
            ep.policy_for(a)
        ep.agent_rewards = {
            (a, self._policy_of(a)): float(r) for a, r in zip(self.agents, ended.returns[i])
        }
        return ep
