"""What a runner measures: cheap per-step timers (``runner.perf_stats()``) and the run
metrics behind ``runner.metrics()``.

``RunMetrics`` is fed from two things every kind of step produces: the per-episode
records (the dicts ``get_metrics()`` returns) and the ``PerfTimers``. It never reads the
step's own state, so any step that fills those (the numpy kernel, the tensor path) gets
the same metrics. Its window is the time since the last ``take``: counts, returns and
phase seconds are of that window; ``*_lifetime`` keys are since the runner was built.

``merge_metrics`` merges several such dicts (runners of a ``RunnerGroup``, or the windows
of one run): counts and seconds add up, means are weighted by their episode counts, and
minima and maxima stay minima and maxima.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from rlconnect.errors import LoggerError, describe_exception

__all__ = [
    "PHASES",
    "STAGES",
    "EpisodeLog",
    "LoggerSet",
    "MetricsLogger",
    "PerfTimers",
    "RunMetrics",
    "merge_metrics",
]

STAGES = (
    "mean_env_wait_ms",
    "mean_raw_obs_processing_ms",
    "mean_inference_ms",
    "mean_action_processing_ms",
    "mean_recording_ms",
)

#: ``metrics()`` phase key -> the ``PerfTimers`` stage it reads
PHASES = {
    "time/env": "mean_env_wait_ms",
    "time/agent_connectors": "mean_raw_obs_processing_ms",
    "time/inference": "mean_inference_ms",
    "time/action_connectors": "mean_action_processing_ms",
    "time/recording": "mean_recording_ms",
}
#: phases whose time is the runner's own (``time/other``: the rest of ``time/sample``)
OWN_PHASES = ("time/recording", "time/other")


class PerfTimers:
    """Seconds per stage of all runner steps so far, the steps (polls), and the seconds of
    whole ``sample()`` calls spent sampling envs (``sampling``) and in learner pipelines
    (``learner``).

    The numpy kernel times its first polls and then a random eighth of them
    (``rlconnect._timing``: reading the clock twice per stage would cost more than some
    stages), each timing multiplied by its ``weight`` (8 there): the seconds are
    estimates of all polls' seconds. ``weight`` is the poll under way's (0.0: untimed;
    the tensor path times every poll, weight 1)."""

    __slots__ = ("learner", "sampling", "seconds", "steps", "weight")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.steps = 0
        self.weight = 1.0
        self.sampling = 0.0
        self.learner = 0.0

    def means(self) -> dict[str, float]:
        """Mean milliseconds per step of every stage."""
        n = max(self.steps, 1)
        return {k: 1000.0 * v / n for k, v in self.seconds.items()}

    def ledger(self) -> dict[str, float]:
        """Seconds so far per ``metrics()`` phase, with ``time/sample`` (the whole)."""
        out = {key: self.seconds[stage] for key, stage in PHASES.items()}
        out["time/learner_connectors"] = self.learner
        out["time/sample"] = self.sampling + self.learner
        return out


class MetricsLogger(Protocol):
    """What ``runner.add_logger`` takes (``rc.loggers`` has JSONL, CSV and TensorBoard)."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Record one dict of the runner's ``metrics()``, written once per ``sample()``."""

    def flush(self) -> None:
        """Push what is buffered to the destination."""

    def close(self) -> None:
        """Flush and release the destination; no write follows."""


class LoggerSet:
    """A runner's loggers: each gets every record. One that cannot write is closed and
    dropped, and its error (a ``LoggerError`` naming its path) is raised once the others
    have the record, with the batch of that ``sample()`` as its ``batch``."""

    def __init__(self) -> None:
        self._loggers: list[MetricsLogger] = []

    def __bool__(self) -> bool:
        return bool(self._loggers)

    def add(self, logger: MetricsLogger) -> None:
        """Add a logger; TypeError naming what it lacks unless it has write, flush and close."""
        missing = [m for m in ("write", "flush", "close") if not callable(getattr(logger, m, None))]
        if missing:
            raise TypeError(
                f"add_logger takes an object with write(record), flush() and close() (see "
                f"rc.loggers); {type(logger).__name__} has no {', '.join(missing)}"
            )
        self._loggers.append(logger)

    def write(self, record: dict[str, Any], batch: Any) -> None:
        """``record`` to every logger; then the first failure, if any, raised."""
        failed: LoggerError | None = None
        for logger in list(self._loggers):
            try:
                logger.write(record)
            except Exception as exc:
                self._loggers.remove(logger)
                failed = failed or _logger_error(logger, exc, "write")
                _close_quietly(logger)
        if failed is not None:
            error = LoggerError(
                f"{failed}; sample() built its batch all the same: it is this error's "
                "`batch`, and the runner samples on without this logger",
                failed.path,
            )
            error.batch, error.record = batch, record
            raise error from failed

    def close(self) -> None:
        """Flush and close every logger (all of them, even after a failure, which is then
        raised)."""
        failed: LoggerError | None = None
        loggers, self._loggers = self._loggers, []
        for logger in loggers:
            try:
                logger.flush()
                logger.close()
            except Exception as exc:
                failed = failed or _logger_error(logger, exc, "close")
                _close_quietly(logger)
        if failed is not None:
            raise failed


def _logger_error(logger: Any, exc: Exception, what: str) -> LoggerError:
    """``exc`` as a ``LoggerError`` naming the logger's path (a user logger may raise
    anything)."""
    if isinstance(exc, LoggerError):
        return exc
    path = getattr(logger, "path", None)
    where = f" ({path})" if path is not None else ""
    error = LoggerError(
        f"logger {type(logger).__name__}{where} raised {describe_exception(exc)} in {what}",
        None if path is None else str(path),
    )
    error.__cause__ = exc
    return error


def _close_quietly(logger: Any) -> None:
    with contextlib.suppress(Exception):  # (it failed already: that error is reported)
        logger.close()


class EpisodeLog:
    """Episode records kept for ``get_metrics()`` (taken and cleared there; at most
    ``maxlen``, the latest), apart from the ones ``RunMetrics`` folds."""

    __slots__ = ("_kept", "_pending")

    def __init__(self, maxlen: int) -> None:
        self._kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)
        self._pending: list[tuple[int, Callable[[], list[dict[str, Any]]]]] = []

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        """Keep ``records`` (past ``maxlen`` the oldest are dropped)."""
        self._kept.extend(records)

    def extend_lazy(self, count: int, make: Callable[[], list[dict[str, Any]]]) -> None:
        """``count`` records that ``make()`` builds when they are taken (the tensor path
        ends thousands of episodes per ``sample()``: their dicts are made only for a
        caller of ``get_metrics()``); past ``maxlen`` the oldest are dropped unmade."""
        self._pending.append((count, make))
        maxlen = self._kept.maxlen or 0
        while len(self._pending) > 1 and sum(c for c, _ in self._pending[1:]) >= maxlen:
            self._pending.pop(0)

    def take(self) -> list[dict[str, Any]]:
        """Every record kept (lazy ones built now), oldest first; the log is empty after."""
        for _, make in self._pending:
            self._kept.extend(make())
        self._pending.clear()
        out = list(self._kept)
        self._kept.clear()
        return out


class _Returns:
    """Episodes of one group (all, a policy's, an agent's) in the window: their returns
    and lengths, appended as they come (cheap) and summed up when reported; past
    ``_COMPACT`` episodes the lists are folded into the running figures (bounded)."""

    __slots__ = ("count", "high", "length", "lengths", "low", "returns", "total")

    def __init__(self) -> None:
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.count, self.total, self.length = 0, 0.0, 0
        self.low, self.high = float("inf"), float("-inf")

    def compact(self) -> None:
        """The lists folded into the running figures."""
        if self.returns:
            self.count += len(self.returns)
            self.total += math.fsum(self.returns)
            self.length += sum(self.lengths)
            self.low = min(self.low, min(self.returns))
            self.high = max(self.high, max(self.returns))
            self.returns, self.lengths = [], []

    def report(self, prefix: str, out: dict[str, Any]) -> None:
        """``<prefix>num_episodes`` and the return and length figures (None: no episode)."""
        self.compact()
        n = self.count
        out[prefix + "num_episodes"] = n
        out[prefix + "episode_return_mean"] = float(self.total / n) if n else None
        out[prefix + "episode_return_min"] = float(self.low) if n else None
        out[prefix + "episode_return_max"] = float(self.high) if n else None
        out[prefix + "episode_len_mean"] = float(self.length / n) if n else None


_COMPACT = 65_536  # episodes a window's lists hold before they are folded


class RunMetrics:
    """The window behind ``runner.metrics()``: episode records and batch sizes added as
    they come, the timers read at each ``take``."""

    def __init__(self, policy_ids: Sequence[str], timers: PerfTimers) -> None:
        self._timers = timers
        self._policy_ids = [str(p) for p in policy_ids]
        self._agents: dict[str, None] = {}  # every agent seen, in order (keys stay)
        self._last = timers.ledger()
        self._lifetime = {"env_steps": 0, "agent_steps": 0, "num_episodes": 0}
        self._open_window()

    def _open_window(self) -> None:
        self._env_steps = self._agent_steps = self._batches = self._faulty = 0
        self._all = _Returns()
        self._groups: dict[str, _Returns] = {}
        self._pairs: dict[tuple[Any, str], tuple[_Returns, _Returns]] = {}

    def add_batch(self, env_steps: int, agent_steps: int) -> None:
        """A batch ``sample()`` handed out."""
        self._env_steps += env_steps
        self._agent_steps += agent_steps
        self._batches += 1

    def add_episodes(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Per-episode records (as ``get_metrics()`` gives them); faulty ones are counted
        apart. A policy's return is the sum over its agents in the episode."""
        every, pairs = self._all, self._pairs
        rets, lens = every.returns, every.lengths
        for r in records:
            if r["episode_faulty"]:
                self._faulty += 1
                continue
            length = r["episode_length"]
            rets.append(r["episode_reward"])
            lens.append(length)
            rewards = r["agent_rewards"]
            if len(rewards) == 1:  # one agent: its policy's return is its own
                ((pair, ret),) = rewards.items()
                for group in pairs.get(pair) or self._pair(pair):
                    group.returns.append(ret)
                    group.lengths.append(length)
            else:
                self._add_agents(rewards, length)
        if len(rets) > _COMPACT:
            for group in (every, *self._groups.values()):
                group.compact()

    def add_episode_arrays(
        self, lengths: Any, returns: Any, pairs: Sequence[tuple[Any, str]]
    ) -> None:
        """Episodes as whole arrays (the tensor path's): ``lengths`` (E,), ``returns``
        (E, A) of the agents ``pairs`` (``(agent_id, policy_id)``, in columns' order);
        the same figures as ``add_episodes`` of their records, without a dict each."""
        self._all.returns.extend(returns.sum(1).tolist())
        length_list = lengths.tolist()
        self._all.lengths.extend(length_list)
        by_policy: dict[str, list[int]] = {}
        for i, pair in enumerate(pairs):
            agent, _ = self._pairs.get(pair) or self._pair(pair)
            agent.returns.extend(returns[:, i].tolist())
            agent.lengths.extend(length_list)
            by_policy.setdefault(pair[1], []).append(i)
        for pid, columns in by_policy.items():
            group = self._groups[f"policy/{pid}/"]
            group.returns.extend(returns[:, columns].sum(1).tolist())
            group.lengths.extend(length_list)
        if len(self._all.returns) > _COMPACT:
            for group in (self._all, *self._groups.values()):
                group.compact()

    def _pair(self, pair: tuple[Any, str]) -> tuple[_Returns, _Returns]:
        """The agent's and the policy's groups of an ``(agent_id, policy_id)`` pair."""
        agent_key, policy_key = f"agent/{pair[0]}/", f"policy/{pair[1]}/"
        self._agents.setdefault(agent_key, None)
        groups = self._groups
        out = (groups.setdefault(agent_key, _Returns()), groups.setdefault(policy_key, _Returns()))
        self._pairs[pair] = out
        return out

    def _add_agents(self, rewards: Mapping[tuple[Any, str], float], length: int) -> None:
        """An episode of several agents: each one's return, and per policy their sum."""
        by_policy: dict[int, tuple[_Returns, float]] = {}
        for pair, ret in rewards.items():
            agent, policy = self._pairs.get(pair) or self._pair(pair)
            agent.returns.append(ret)
            agent.lengths.append(length)
            summed = by_policy.get(id(policy), (policy, 0.0))[1] + ret
            by_policy[id(policy)] = (policy, summed)
        for policy, ret in by_policy.values():
            policy.returns.append(ret)
            policy.lengths.append(length)

    def take(self) -> dict[str, Any]:
        """The window's metrics (see ``docs/metrics.md``), then a new window."""
        life = self._lifetime
        self._all.compact()
        life["env_steps"] += self._env_steps
        life["agent_steps"] += self._agent_steps
        life["num_episodes"] += self._all.count
        out: dict[str, Any] = {
            "env_steps": self._env_steps,
            "agent_steps": self._agent_steps,
            "num_batches": self._batches,
            "num_faulty_episodes": self._faulty,
            **{f"{k}_lifetime": v for k, v in life.items()},
        }
        self._all.report("", out)
        empty = _Returns()
        for key in [*(f"policy/{p}/" for p in self._policy_ids), *self._agents]:
            self._groups.get(key, empty).report(key, out)
        out.update(self._phase_seconds())
        _add_rates(out)
        self._open_window()
        return out

    def _phase_seconds(self) -> dict[str, float]:
        now = self._timers.ledger()
        spent = {k: max(v - self._last.get(k, 0.0), 0.0) for k, v in now.items()}
        self._last = now
        known = sum(v for k, v in spent.items() if k != "time/sample")
        spent["time/other"] = max(spent["time/sample"] - known, 0.0)
        return spent


def _add_rates(out: dict[str, Any]) -> None:
    """Steps per second of sampling and the runner's own share of it, from the counts
    and seconds in ``out``."""
    whole = out["time/sample"]
    out["env_steps_per_second"] = out["env_steps"] / whole if whole > 0 else None
    out["agent_steps_per_second"] = out["agent_steps"] / whole if whole > 0 else None
    own = sum(out.get(k, 0.0) for k in OWN_PHASES)
    out["time/overhead_share"] = min(own / whole, 1.0) if whole > 0 else 0.0


def merge_metrics(records: Sequence[Mapping[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """One metrics dict from several: of runners sampling side by side
    (``parallel=True``: their steps per second add up) or of one run's windows one after
    another (``parallel=False``: steps per second over the summed seconds; lifetime counts
    are the last window's). Counts and seconds add up; ``*_mean`` is weighted by the
    episode count beside it; ``*_min`` / ``*_max`` stay so; ``time/overhead_share`` is
    made anew from the summed seconds."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r.get(key) for r in records]
        present = [v for v in values if v is not None]
        if key.endswith("_mean"):
            count_key = key[: key.rfind("/") + 1] + "num_episodes"
            out[key] = _weighted_mean(values, [r.get(count_key) or 0 for r in records])
        elif key.endswith("_min"):
            out[key] = min(present) if present else None
        elif key.endswith("_max"):
            out[key] = max(present) if present else None
        elif key.endswith("_lifetime") and not parallel:
            out[key] = present[-1] if present else None
        elif not key.endswith(("_per_second", "_share")):
            out[key] = sum(present) if present else None
    if "time/sample" in out:
        _add_rates(out)
    if parallel:  # side by side: each runner's rate over its own seconds, added up
        for key in ("env_steps_per_second", "agent_steps_per_second"):
            rates = [r[key] for r in records if r.get(key) is not None]
            if key in out:
                out[key] = sum(rates) if rates else None
    return out


def _weighted_mean(values: Sequence[Any], weights: Sequence[int]) -> float | None:
    total = sum(w for w, v in zip(weights, values) if v is not None)
    if not total:
        return None
    return sum(w * v for w, v in zip(weights, values) if v is not None) / total
