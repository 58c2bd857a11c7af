"""Episode bookkeeping of the tensor path: ids, lengths and returns as tensors.

On a batched tensor simulator every sub-env's episode advances at every round, and which
ones end is device data. ``TensorEpisodes`` keeps the table of the running episodes (id,
length, return per agent) on the device and updates it with masked whole-tensor
operations, so a round reads nothing back. The episodes that end are logged, a tensor per
round, and read back once per ``sample()`` (``read_back``): one transfer that also
carries the first non-finite value each sub-env returned (the deferred finite check). A
``sample()`` may read its rounds in two parts (``read_back(rounds=...)``: a NEXT_STEP
env's extra rounds); a faulty sub-env is reported once, at the read that finds it, and
its marks stay until it is restarted (``restart_where``).
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
from rlconnect.episodes.finite_marks import NONE, FiniteMarks
from rlconnect.errors import EnvCheckError

__all__ = ["EndedEpisodes", "SampleRead", "TensorEpisodes"]

_FIELDS = ("obs", "reward")  #: what a non-finite value was found in, by code


class EndedEpisodes:
    """The episodes that ended during one ``sample()``, as host arrays: ``eps_id``,
    ``env_id``, ``length`` (N_ended,) and ``returns`` (N_ended, A), agents in ``agents``
    order; ``faulty``: they were dropped as faulty (restart_failed_sub_environments)."""

    def __init__(
        self,
        eps_id: np.ndarray,
        env_id: np.ndarray,
        length: np.ndarray,
        returns: np.ndarray,
        *,
        faulty: bool = False,
    ) -> None:
        self.eps_id, self.env_id, self.length, self.returns = eps_id, env_id, length, returns
        self.faulty = faulty

    @classmethod
    def empty(cls, agents: int) -> EndedEpisodes:
        """No episodes (of ``agents`` agents)."""
        no = np.zeros(0, dtype=np.int64)
        return cls(no, no, no, np.zeros((0, agents)))

    def __len__(self) -> int:
        return len(self.eps_id)

    def where(self, keep: np.ndarray) -> EndedEpisodes:
        """The episodes where the bool array ``keep`` is True."""
        return EndedEpisodes(
            self.eps_id[keep],
            self.env_id[keep],
            self.length[keep],
            self.returns[keep],
            faulty=self.faulty,
        )


@attrs.frozen
class SampleRead:
    """What a host read of a ``sample()`` brought back: the episodes that ended
    (``ended``, without those of faulty sub-envs), the values of the flags read with it,
    which sub-envs ended at each round read (``ended_rounds`` (rounds, N) bool) and, when
    faulty sub-envs are dropped rather than refused, ``bad``: sub-env -> the first round
    whose values were not finite (those found by earlier reads of the sample too), and
    ``faulty``: the episodes this read found faulty (length and returns of the steps
    before the bad one)."""

    ended: EndedEpisodes
    flags: list[bool]
    ended_rounds: np.ndarray
    bad: dict[int, int]
    faulty: EndedEpisodes


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
        self._rounds = 0  # the rounds of this sample so far (``reserve``)
        self._marks = FiniteMarks(num_envs, len(self.agents), device)
        #: the returns as a sample began (what the recorded rows' check takes at round 0)
        self._start_returns = torch.zeros_like(self.returns)
        self._ended: list[EndedEpisodes] = []
        self._faulty: list[EndedEpisodes] = []  # episodes dropped as faulty

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

    def check_finite(
        self,
        obs_ok: torch.Tensor,
        reward_ok: torch.Tensor,
        k: int,
        resets: torch.Tensor | None = None,
    ) -> None:
        """Keep, per sub-env, the episode step and the round ``k`` at which its
        observation or reward (N,) was first not finite (checked once per ``sample()``, in
        ``read_back``): 0 for the observation, 1 for the reward in ``_bad_field``; and the
        returns before that step. Called before ``advance`` (with its ``resets``)."""
        step = self.length + 1 if resets is None else self.length + ~resets
        self._marks.mark(~(obs_ok & reward_ok), step, k, obs_ok, self.returns)

    def faulty(self) -> torch.Tensor:
        """(N,) bool: the sub-envs that returned a non-finite value since their restart."""
        return self._marks.step != NONE

    def note_nonfinite(
        self, step: torch.Tensor, is_reward: torch.Tensor, bad: torch.Tensor, rounds: torch.Tensor
    ) -> None:
        """The finite check done on a sample's recorded rows (``TensorStore``): per sub-env
        (N,) whether it found a NaN or inf (``bad``), at which episode step and round, and
        whether in the reward; kept unless an earlier one is."""
        self._marks.mark(bad, step, rounds, is_reward, self._returns_before(rounds))

    def _returns_before(self, rounds: torch.Tensor) -> torch.Tensor:
        """(A, N): each sub-env's returns before round ``rounds`` (N,) of this sample, from
        the log (0 where its episode ended the round before; the start's at round 0)."""
        log = self._log[: self._rounds]
        before = torch.cat([self._start_returns.unsqueeze(0), log[:-1, 3:]])  # (T, A, N)
        ended = torch.cat([torch.zeros_like(log[:1, 0]), log[:-1, 0]]) > 0.5  # (T, N)
        before = before.masked_fill(ended.unsqueeze(1), 0.0)
        at = rounds.clamp(0, len(log) - 1).reshape(1, 1, -1).expand(1, len(self.agents), -1)
        return before.gather(0, at).squeeze(0)

    def begin_sample(self, rounds: int) -> None:
        """A ``sample()`` of ``rounds`` rounds starts: its log of ended episodes, one row
        per round of (ended, length, eps_id, return per agent) for every sub-env (made
        once, and written over by every sample: ``end`` writes each round's whole row)."""
        self._rounds = 0
        self.reserve(rounds)
        self._start_returns.copy_(self.returns)

    def reserve(self, rounds: int) -> None:
        """Room in the log for ``rounds`` rounds of this sample (grown, rows kept, when a
        NEXT_STEP env's sample needs extra rounds)."""
        self._rounds = rounds
        if len(self._log) >= rounds:
            return
        log = torch.zeros(
            (rounds, 3 + len(self.agents), self.num_envs), dtype=torch.float64, device=self.device
        )
        log[: len(self._log)] = self._log
        self._log = log
        self._log_rows = [(row[0], row[1], row[2], row[3:]) for row in log.unbind(0)]

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
        rounds: range | None = None,
    ) -> SampleRead:
        """A host read of a ``sample()``: the episodes that ended at ``rounds`` (all of
        the sample's: None), the finite check, and the values of the 0-d bool ``flags``
        (what else must be checked once per sample) that travel with them. A non-finite
        value raises ``EnvCheckError`` naming the first one's sub-env, field and episode
        step; with ``drop_bad`` its sub-env is in ``bad`` instead and the episodes that
        ended there from that round on are left out (the open one at it is ``faulty``).
        ``locate(flag values)``: True when it has just noted non-finite values
        (``note_nonfinite``, on the device): the marks are then read again, a second read
        made only in such a sample."""
        rounds = range(self._rounds) if rounds is None else rounds
        n, a = self.num_envs, len(self.agents)
        log = self._log[rounds.start : rounds.stop]
        parts = [log.flatten(), *self._marks.tensors()]
        parts += [f.to(torch.float64).reshape(1) for f in flags]
        parts.append(self._next.to(torch.float64).reshape(1))
        flat = torch.cat(parts).cpu().numpy()  # the read
        self.next_id = int(flat[-1])
        flag_values = [bool(v) for v in flat[len(flat) - 1 - len(flags) : -1]]
        size = log.numel()
        marks = flat[size : size + FiniteMarks.size(n, a)]  # (views: the log is megabytes)
        read = flat[:size].reshape(-1, 3 + a, n)
        if locate is not None and locate(flag_values):  # the marks made after that read
            marks = torch.cat(self._marks.tensors()).cpu().numpy()
        bad, faulty = self._faults(read, marks, rounds.start, drop_bad)
        ended_rounds = read[:, 0] > 0.5
        ended_at, env = np.nonzero(ended_rounds)
        out = EndedEpisodes(
            read[ended_at, 2, env].astype(np.int64),
            env.astype(np.int64),
            read[ended_at, 1, env].astype(np.int64),
            read[ended_at, 3:, env],
        )
        if bad:
            first_bad = np.full(n, rounds.stop, dtype=np.int64)
            for e, k in bad.items():
                first_bad[e] = k
            out = out.where(ended_at + rounds.start < first_bad[out.env_id])
        self._ended.append(out)  # (until the runner's hand_over, once per sample())
        if len(faulty):
            self._faulty.append(faulty)
        return SampleRead(out, flag_values, ended_rounds, bad, faulty)

    def _faults(
        self, read: np.ndarray, marks: np.ndarray, first_round: int, drop_bad: bool
    ) -> tuple[dict[int, int], EndedEpisodes]:
        """From the read marks: the faulty sub-envs (-> bad round; all of the sample's) and
        the episodes newly found faulty: each open at its sub-env's bad round, its length
        the steps before the bad one and its returns theirs; refused unless ``drop_bad``."""
        n = self.num_envs
        step, field, bad_round = marks[: 3 * n].reshape(3, n)
        if not drop_bad:
            self._refuse_nonfinite(step, field)
            return {}, EndedEpisodes.empty(len(self.agents))
        new = self._marks.new_bad(step, bad_round)
        envs = np.array(sorted(new), dtype=np.int64)
        at = np.array([new[e] - first_round for e in sorted(new)], dtype=np.int64)
        returns = marks[3 * n :].reshape(len(self.agents), n)
        faulty = EndedEpisodes(
            read[at, 2, envs].astype(np.int64) if len(envs) else np.zeros(0, np.int64),
            envs,
            np.maximum(step[envs] - 1, 0).astype(np.int64),
            returns[:, envs].T.copy(),
            faulty=True,
        )
        return dict(self._marks.known), faulty

    def restart_where(self, mask: torch.Tensor, env_ids: list[int]) -> None:
        """New episodes (new ids, length and returns 0) in the sub-envs ``env_ids``
        (``mask`` (N,), the same ones), whatever their episodes did: what a restarted
        faulty sub-env begins (its finite marks cleared)."""
        self._marks.clear(mask, env_ids)
        new_ids = self._next + torch.cumsum(mask, 0, dtype=torch.int64) - 1
        self.eps_id = torch.where(mask, new_ids, self.eps_id)
        self._next += mask.sum()
        self.length.masked_fill_(mask, 0)
        self.returns.masked_fill_(mask, 0.0)

    def _refuse_nonfinite(self, bad_poll: np.ndarray, bad_field: np.ndarray) -> None:
        bad = np.flatnonzero(bad_poll != NONE)
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
        for faulty in self._faulty:  # (counted apart, as on the numpy path)
            records = self.records(faulty)
            run_metrics.add_episodes(records)
            log.extend_lazy(len(records), functools.partial(list, records))
        self._faulty.clear()

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
                "episode_faulty": ended.faulty,
            }
            for eps, env, length, total, returns in rows
        ]

    def episode(self, ended: EndedEpisodes, i: int, runner: Any) -> Episode:
        """An ``Episode`` of ended episode ``i``, for ``on_episode_end`` callbacks (a
        faulty one with ``episode.faulty`` set, as on the numpy path)."""

        def mapping(agent_id: Any, episode: Episode, **kwargs: Any) -> str:
            return self._policy_of(agent_id)

        ep = Episode(int(ended.eps_id[i]), int(ended.env_id[i]), mapping, worker=runner)
        ep.length = int(ended.length[i])
        ep.total_reward = float(ended.returns[i].sum())
        ep.faulty = ended.faulty
        for a in self.agents:
            ep.policy_for(a)
        ep.agent_rewards = {
            (a, self._policy_of(a)): float(r) for a, r in zip(self.agents, ended.returns[i])
        }
        return ep
