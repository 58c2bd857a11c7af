"""The runner's offline I/O: ``OfflineConfig(output=DIR)`` and ``OfflineConfig(input=...)``
(``RunnerConfig(output=DIR)``, ``RunnerConfig(input=...)``), attached by ``OfflineConfig.attach``.

Output: every batch ``sample()`` returns from live sampling is written to Parquet files
under ``output`` and the file is finished before ``sample()`` returns (so everything
sampled is in finished files at that point). Batches read from offline input are not
written again.

Input: ``input`` is ``"sampler"`` (live sampling, the default), a path or glob of offline
files, or ``{source: probability}``; each ``sample()`` draws one source with those
probabilities (seeded by ``RunnerConfig.seed`` and ``worker_index``) and returns a batch of
``rollout_fragment_length * num_envs`` env steps from it (a MultiAgentBatch: whole written
batches merged until at least that many). Offline sources loop over their files forever.
Every returned batch's ``meta["input"]`` (each policy batch's, for a MultiAgentBatch)
names its source. Read batches go, in this order, through:

1. the agent connectors (``input_connectors=True``): a copy of the runner's live agent
   pipeline, in eval mode (reading never changes the live statistics), replays each
   trajectory's ``obs`` step by step (and ``new_obs`` of its last row); ``obs``,
   ``new_obs`` and ``rewards`` become the pipeline's outputs. The data should hold env
   observations (e.g. written by a runner whose pipeline passes them through). A
   trajectory fragment that starts mid-episode starts the connectors' per-episode state
   afresh;
2. the current policy's ``postprocess_trajectory`` (``postprocess_inputs=True``), per
   trajectory, without other agents' batches or an episode object;
3. the runner's learner pipelines, on each batch as it was written (its trajectories
   whole, their cuts where the writer cut them); live batches of the ``"sampler"`` source
   go through them too;
4. the shuffle buffer (``shuffle_buffer_size=N > 0``, single-agent only): rows are drawn
   at random from a buffer of at least ``N`` rows, learning signal included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tree

from rlconnect.batches import DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch, concat_samples
from rlconnect.connectors import AgentData
from rlconnect.offline.reader import list_batch_files, read_batches

if TYPE_CHECKING:
    from rlconnect.offline.config import OfflineConfig
    from rlconnect.runner import EnvRunner

__all__ = ["RunnerInput", "RunnerOutput", "replay_agent_connectors"]

Batch = SampleBatch | MultiAgentBatch


# --------------------------------------------------------------------------------- output
class RunnerOutput:
    """Writes what the runner samples to ``settings.output`` (one finished file per sample)."""

    def __init__(self, runner: EnvRunner, settings: OfflineConfig) -> None:
        from rlconnect.offline._common import import_parquet_module

        writer = import_parquet_module(
            "rlconnect.offline.parquet_writer", "RunnerConfig(output=...) (Parquet files)"
        )
        self.runner = runner
        self.writer = writer.ParquetBatchWriter(
            settings.output,
            max_file_size=settings.output_max_file_size,
            compress_columns=settings.output_compress_columns,
            spaces=self._spaces(),
            worker_index=runner.config.worker_index,
        )
        self._space_ids = self._ids()

    def _ids(self) -> list[int]:
        return [id(self.runner.agent_pipeline(pid).output_space) for pid in self.runner.policies]

    def _spaces(self) -> dict[str, dict[str, Any]]:
        out = {}
        for pid in self.runner.policies:
            pipe = self.runner.agent_pipeline(pid)
            out[pid] = {"obs": pipe.output_space, "new_obs": pipe.output_space}
            if self.runner.config.keep_raw_obs:
                out[pid]["raw_obs"] = pipe.input_space
        return out

    def write(self, batch: Batch, agent_ids: dict[str, Any]) -> None:
        """Write ``batch`` and finish its file (a batch of torch tensors, from the tensor
        path, is converted to numpy here, once)."""
        if batch.device is not None:
            batch = batch.numpy()
        ids = self._ids()
        if ids != self._space_ids:  # a pipeline was edited: record its new output space
            self.writer._spaces = self.writer._space_json(self._spaces())
            self._space_ids = ids
        rows = batch.policy_batches if isinstance(batch, MultiAgentBatch) else {}
        ids_ok = {
            pid: a for pid, a in agent_ids.items() if pid in rows and len(rows[pid]) == len(a)
        }
        self.writer.write(batch, agent_ids=ids_ok)
        self.writer.flush()


# ---------------------------------------------------------------------------------- input
class RunnerInput:
    """Draws each ``sample()`` from one of the configured sources."""

    def __init__(self, runner: EnvRunner, settings: OfflineConfig) -> None:
        cfg = runner.config
        spec = settings.input if isinstance(settings.input, dict) else {settings.input: 1.0}
        if settings.shuffle_buffer_size and not runner.is_single_agent:
            raise ValueError(
                "OfflineConfig.shuffle_buffer_size > 0 needs single-agent input; "
                "multi-agent batches cannot be shuffled by row"
            )
        self.runner, self.settings = runner, settings
        self.names = [name for name, p in spec.items() if p > 0]
        probs = np.array([float(spec[n]) for n in self.names])
        self.probs = probs / probs.sum()
        seed = cfg.seed if cfg.seed is not None else int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        self.rng = np.random.default_rng([seed, cfg.worker_index, 0x1A7])
        self.sources: dict[str, Any] = {
            name: None if name == "sampler" else _OfflineSource(runner, settings, name, self.rng)
            for name in self.names
        }
        self.counts = dict.fromkeys(self.names, 0)
        self._metrics: list[dict[str, Any]] = []

    def take_metrics(self) -> list[dict[str, Any]]:
        """Off-policy estimates since the last call (``runner.get_off_policy_metrics()``)."""
        out, self._metrics = self._metrics, []
        return out

    def next(self) -> Batch:
        """One batch from a source drawn with the configured probabilities."""
        k = 0 if len(self.names) == 1 else int(self.rng.choice(len(self.names), p=self.probs))
        name = self.names[k]
        source = self.sources[name]
        if source is None:
            batch = self.runner.apply_learner_pipelines(self.runner.sample_envs())
        else:
            batch = source.next()
        self.counts[name] += 1
        if source is not None and self.settings.off_policy_estimation:
            self._estimate(name, batch)
        for b in batch.policy_batches.values() if isinstance(batch, MultiAgentBatch) else [batch]:
            b.meta["input"] = name
        return batch

    def _estimate(self, source: str, batch: Batch) -> None:
        """Off-policy estimates of the current policies on the episodes of ``batch``."""
        from rlconnect.offline.estimators import estimate_off_policy

        cfg = self.settings
        for pid, policy in self.runner.policies.items():
            if isinstance(batch, MultiAgentBatch) and pid not in batch.policy_batches:
                continue
            try:
                result = estimate_off_policy(
                    [batch],
                    policy,
                    estimators=cfg.off_policy_estimation,
                    gamma=cfg.off_policy_gamma,
                    policy_id=pid,
                )
            except KeyError as exc:  # e.g. the data has no action_logp
                raise ValueError(f"off-policy estimation on {source!r}: {exc}") from None
            self._metrics.append({"policy_id": pid, "input": source, **result})


class _OfflineSource:
    """Batches of the runner's size from files, looping; see the module docstring."""

    def __init__(
        self, runner: EnvRunner, settings: OfflineConfig, pattern: str, rng: np.random.Generator
    ) -> None:
        self.runner, self.settings, self.pattern, self.rng = runner, settings, pattern, rng
        self.files = list_batch_files(pattern)
        if not self.files:
            raise FileNotFoundError(f"OfflineConfig.input: {pattern!r} holds no batch files")
        self.size = runner.config.rollout_fragment_length * runner.num_envs
        self.shuffle = settings.shuffle_buffer_size
        self._stream = self._prepared()
        self._buffer: list[Batch] = []

    def _prepared(self) -> Iterator[Batch]:
        cfg = self.settings
        while True:
            count = 0
            for b in read_batches(self.files):
                b = self._as_runner_kind(b)
                if cfg.input_connectors:
                    b = _per_policy(
                        b, lambda pid, sb: replay_agent_connectors(self.runner, pid, sb)
                    )
                if cfg.postprocess_inputs:
                    b = _per_policy(b, lambda pid, sb: postprocess_read(self.runner, pid, sb))
                count += 1
                yield b
            if count == 0:
                raise ValueError(f"OfflineConfig.input: {self.pattern!r} holds no batches")

    def _read(self) -> Batch:
        """The next batch read, through the learner pipelines (outside ``_prepared``: a
        learner connector that raises loses this batch, not the stream)."""
        return self.runner.apply_learner_pipelines(next(self._stream))

    def _as_runner_kind(self, b: Batch) -> Batch:
        if self.runner.is_single_agent:
            if isinstance(b, MultiAgentBatch):
                if list(b.policy_batches) != [DEFAULT_POLICY_ID]:
                    raise ValueError(
                        f"OfflineConfig.input {self.pattern!r} holds multi-agent batches "
                        f"(policies {list(b.policy_batches)}); this runner is single-agent"
                    )
                return b.policy_batches[DEFAULT_POLICY_ID]
            return b
        if isinstance(b, SampleBatch):
            return MultiAgentBatch({str(b.meta.get("policy_id", DEFAULT_POLICY_ID)): b}, len(b))
        return b

    def next(self) -> Batch:
        if not self.runner.is_single_agent:
            return self._next_multi_agent()
        want = max(self.size, self.shuffle)
        buffer: list[SampleBatch] = self._buffer  # type: ignore[assignment]
        rows = sum(len(b) for b in buffer)
        while rows < want:
            buffer.append(self._read())  # type: ignore[arg-type]
            rows += len(buffer[-1])
        pool = concat_samples(buffer) if len(buffer) > 1 else buffer[0]
        if self.shuffle:
            pick = np.zeros(len(pool), dtype=np.bool_)
            pick[self.rng.choice(len(pool), self.size, replace=False)] = True
            out, rest = pool.take(pick), pool.take(np.logical_not(pick))
        else:
            out, rest = pool[: self.size], pool[self.size :]
        self._buffer = [rest] if len(rest) else []
        return out

    def _next_multi_agent(self) -> MultiAgentBatch:
        parts: list[MultiAgentBatch] = []
        steps = 0
        while steps < self.size:
            parts.append(self._read())  # type: ignore[arg-type]
            steps += parts[-1].env_steps()
        return concat_samples(parts) if len(parts) > 1 else parts[0]


def _per_policy(batch: Batch, fn: Any) -> Batch:
    if isinstance(batch, MultiAgentBatch):
        return MultiAgentBatch(
            {pid: fn(pid, b) for pid, b in batch.policy_batches.items()}, batch.env_steps()
        )
    return fn(str(batch.meta.get("policy_id", DEFAULT_POLICY_ID)), batch)


def _trajectories(batch: SampleBatch) -> tuple[np.ndarray, np.ndarray]:
    """Start and stop row of each trajectory (rows are contiguous per episode and agent)."""
    n = len(batch)
    key = batch["eps_id"].astype(np.int64)
    if "agent_index" in batch:
        key = key * 4096 + batch["agent_index"].astype(np.int64)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if n else np.zeros(0, np.int64)
    return starts, np.r_[starts[1:], n].astype(np.int64)


def postprocess_read(runner: EnvRunner, pid: str, batch: SampleBatch) -> SampleBatch:
    """``postprocess_trajectory`` of the runner's policy ``pid`` over each trajectory."""
    policy = runner.policies.get(pid)
    if policy is None:
        raise ValueError(f"read data holds policy {pid!r}; this runner has {list(runner.policies)}")
    starts, stops = _trajectories(batch)
    pieces = [
        policy.postprocess_trajectory(batch[a:b].copy(), None, None)
        for a, b in zip(starts.tolist(), stops.tolist())
    ]
    return concat_samples(pieces) if pieces else batch


def _clone_pipeline(runner: EnvRunner, pid: str) -> Any:
    live = runner.agent_pipeline(pid)
    pipe = type(live).from_state(live.ctx, live.to_state())
    pipe.set_statistics(live.get_statistics())
    pipe.in_eval()
    return pipe


def replay_agent_connectors(runner: EnvRunner, pid: str, batch: SampleBatch) -> SampleBatch:
    """``batch`` with ``obs`` / ``new_obs`` / ``rewards`` passed through (a copy of) the
    runner's agent pipeline for ``pid``, step by step per trajectory."""
    if len(batch) == 0:
        return batch
    pipe = _clone_pipeline(runner, pid)
    starts, stops = _trajectories(batch)
    lengths = stops - starts
    traj = np.repeat(np.arange(len(starts)), lengths)
    pos = np.arange(len(batch)) - np.repeat(starts, lengths)
    rewards = np.asarray(batch["rewards"])
    infos = batch.get("infos")
    obs_out: list[tuple[np.ndarray, Any]] = []
    new_out: list[tuple[np.ndarray, Any]] = []
    rew_out = rewards.copy()
    longest = int(lengths.max())
    for k in range(longest + 1):
        final = k == longest  # one more step per trajectory: its last row's new_obs
        rows = stops - 1 if final else np.flatnonzero(pos == k)
        cols = {
            "obs": tree.map_structure(lambda x, r=rows: x[r], batch["new_obs" if final else "obs"]),
            "rewards": rewards[rows] if final else (rewards[rows - 1] if k else 0 * rewards[rows]),
            "terminateds": batch["terminateds"][rows] if final else np.zeros(len(rows), bool),
            "truncateds": batch["truncateds"][rows] if final else np.zeros(len(rows), bool),
            "infos": [{} if infos is None else infos[i] for i in rows.tolist()],
            "t": batch["t"][rows] + int(final),
        }
        data = pipe(AgentData(traj[rows], [f"t{int(i)}" for i in traj[rows]], cols))
        if not final:
            obs_out.append((rows, data["obs"]))
        if final or k:  # this step's output is the previous row's new_obs and reward
            ends = rows if final else rows - 1
            new_out.append((ends, data["obs"]))
            if "rewards" in data.columns:
                rew_out[ends] = data["rewards"]
    for t in range(len(starts)):
        pipe.reset(int(t))
    out = batch.copy()
    out["obs"] = _scatter(obs_out, len(batch))
    out["new_obs"] = _scatter(new_out, len(batch))
    out["rewards"] = rew_out
    return out


def _scatter(pieces: list[tuple[np.ndarray, Any]], n: int) -> Any:
    first = pieces[0][1]

    def alloc(x: np.ndarray) -> np.ndarray:
        return np.empty((n, *np.shape(x)[1:]), dtype=np.asarray(x).dtype)

    out = tree.map_structure(alloc, first)
    for rows, value in pieces:
        tree.map_structure(lambda o, v, r=rows: o.__setitem__(r, v), out, value)
    return out
