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

import attrs
import numpy as np
import torch

from rlconnect.episodes.episode import Episode
from rlconnect.errors import EnvCheckError

__all__ = ["EndedEpisodes", "SampleRead", "TensorEpisodes"]

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

    def where(self, keep: np.ndarray) -> EndedEpisodes:
        """The episodes where the bool array ``keep`` is True."""
        return EndedEpisodes(
            self.eps_id[keep], self.env_id[keep], self.length[keep], self.returns[keep]
        )


@attrs.frozen
class SampleRead:
    """What the one host read of a ``sample()`` brought back: the episodes that ended
    (``ended``, without those of faulty sub-envs), the values of the flags read with it,
    which sub-envs ended at each round (``ended_rounds`` (T, N) bool) and, when faulty
    sub-envs are dropped rather than refused, ``bad``: sub-env -> the first round whose
    values were not finite."""

    ended: EndedEpisodes
    flags: list[bool]
    ended_rounds: np.ndarray
    bad: dict[int, int]


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
        self._bad_round = torch.full((num_envs,), _NONE, dtype=torch.int64, device=device)
        self._bad_field = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self._ended: list[EndedEpisodes] = []
        self._faulty: list[dict[str, Any]] = []  # records of episodes dropped as faulty

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
        resets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One env step of every episode with ``rewards`` (A, N): lengths and returns grow
        (not where ``resets`` (N,): a NEXT_STEP env's step that only reset the sub-env);
        returns ``(terminated, truncated, ended)`` with the horizon's truncation added."""
        self.length += 1 if resets is None else ~resets
        self.returns += rewards  # (float32 rewards added in float64)
        if horizon is not None:
            truncated = truncated | (self.length >= horizon)
        return terminated, truncated, terminated | truncated

    def check_finite(self, obs_ok: torch.Tensor, reward_ok: torch.Tensor, k: int) -> None:
        """Keep, per sub-env, the episode step (lengths advanced) and the round ``k`` at
        which its observation or reward (N,) was first not finite (checked once per
        ``sample()``, in ``read_back``): 0 for the observation, 1 for the reward in
        ``_bad_field``."""
        first = ~(obs_ok & reward_ok) & (self._bad_poll == _NONE)
        self._bad_poll = torch.where(first, self.length, self._bad_poll)
        self._bad_round.masked_fill_(first, k)
        self._bad_field = torch.where(first, obs_ok, self._bad_field)

    def note_nonfinite(
        self, step: torch.Tensor, is_reward: torch.Tensor, bad: torch.Tensor, rounds: torch.Tensor
    ) -> None:
        """The finite check done on a sample's recorded rows (``TensorStore``): per sub-env
        (N,) whether it found a NaN or inf (``bad``), at which episode step and round, and
        whether in the reward; kept unless an earlier one is."""
        first = bad & (self._bad_poll == _NONE)
        self._bad_poll = torch.where(first, step, self._bad_poll)
        self._bad_round = torch.where(first, rounds, self._bad_round)
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

    def read_back(
        self,
        flags: Sequence[torch.Tensor] = (),
        *,
        drop_bad: bool = False,
        locate: Callable[[list[bool]], bool] | None = None,
    ) -> SampleRead:
        """The one host read of a ``sample()``: the episodes that ended since the last
        call, the finite check, and the values of the 0-d bool ``flags`` (what else must be
        checked once per sample) that travel with them. A non-finite value raises
        ``EnvCheckError`` naming the first one's sub-env, field and episode step; with
        ``drop_bad`` its sub-env is in ``bad`` instead and the episodes that ended there
        from that round on are left out (the open one at it recorded as faulty).
        ``locate(flag values)``: True when it has just noted non-finite values
        (``note_nonfinite``, on the device): the marks are then read again, a second read
        made only in such a sample."""
        n = self.num_envs
        tail = [self._bad_poll, self._bad_field, self._bad_round]
        parts = [self._log.flatten(), *(t.to(torch.float64) for t in tail)]
        parts += [f.to(torch.float64).reshape(1) for f in flags]
        parts.append(self._next.to(torch.float64).reshape(1))
        flat = torch.cat(parts).cpu().numpy()  # the read
        self.next_id = int(flat[-1])
        flag_values = [bool(v) for v in flat[len(flat) - 1 - len(flags) : -1]]
        size = self._log.numel()
        marks = flat[size : size + 3 * n].reshape(3, n)  # (views: the log is megabytes)
        rounds = flat[:size].reshape(-1, 3 + len(self.agents), n)
        if locate is not None and locate(flag_values):  # the marks made after that read
            marks = torch.stack([self._bad_poll, self._bad_field, self._bad_round]).cpu().numpy()
        bad_poll, bad_field, bad_round = marks
        bad: dict[int, int] = {}
        if drop_bad:
            bad = {int(e): int(bad_round[e]) for e in np.flatnonzero(bad_poll != _NONE)}
        else:
            self._refuse_nonfinite(bad_poll, bad_field)
        ended_rounds = rounds[:, 0] > 0.5
        ended_at, env = np.nonzero(ended_rounds)
        out = EndedEpisodes(
            rounds[ended_at, 2, env].astype(np.int64),
            env.astype(np.int64),
            rounds[ended_at, 1, env].astype(np.int64),
            rounds[ended_at, 3:, env],
        )
        if bad:
            out = self._drop_faulty(out, ended_at, rounds, bad, bad_poll)
        self._ended.append(out)  # (until the runner's hand_over, once per sample())
        return SampleRead(out, flag_values, ended_rounds, bad)

    def _drop_faulty(
        self,
        ended: EndedEpisodes,
        ended_at: np.ndarray,
        rounds: np.ndarray,
        bad: dict[int, int],
        bad_poll: np.ndarray,
    ) -> EndedEpisodes:
        """``ended`` without the episodes of faulty sub-envs from their bad round on; the
        episode open at that round is recorded as faulty (its length the steps before the
        bad one; no return, since it would hold the value), and the bad marks cleared."""
        first_bad = np.full(self.num_envs, len(rounds), dtype=np.int64)
        for e, k in bad.items():
            first_bad[e] = k
            self._faulty.append(
                {
                    "episode_id": int(rounds[k, 2, e]),
                    "env_id": e,
                    "episode_length": int(bad_poll[e]),
                    "episode_reward": 0.0,
                    "agent_rewards": {},
                    "custom_metrics": {},
                    "hist_data": {},
                    "episode_faulty": True,
                }
            )
        for mark in (self._bad_poll, self._bad_round):
            mark.fill_(_NONE)
        return ended.where(ended_at < first_bad[ended.env_id])

    def restart_where(self, mask: torch.Tensor) -> None:
        """New episodes (new ids, length and returns 0) in the sub-envs where ``mask``
        (N,), whatever their episodes did: what a restarted faulty sub-env begins."""
        new_ids = self._next + torch.cumsum(mask, 0, dtype=torch.int64) - 1
        self.eps_id = torch.where(mask, new_ids, self.eps_id)
        self._next += mask.sum()
        self.length.masked_fill_(mask, 0)
        self.returns.masked_fill_(mask, 0.0)

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
            "RunnerConfig(check_finite=False) to record such values as they are, or "
            "RunnerConfig(restart_failed_sub_environments=True) to drop them"
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
        if self._faulty:
            faulty, self._faulty = self._faulty, []
            run_metrics.add_episodes(faulty)
            log.extend_lazy(len(faulty), lambda: faulty)

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
