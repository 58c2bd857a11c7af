"""RunnerGroup: one local runner plus K remote runners on Ray actors.

>>> import rlconnect as rc
>>> import gymnasium as gym
>>> env = gym.make("CartPole-v1")
>>> policy = rc.RandomPolicy(env.observation_space, env.action_space)
>>> config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0)
>>> group = rc.RunnerGroup("CartPole-v1", policy, config=config, num_runners=0)
>>> len(group.sample())  # num_runners=0: the local runner samples; Ray is not imported
10
>>> group.stop()

With ``num_runners=K > 0`` only the remote runners sample; the local runner holds the
reference weights and connector statistics (what ``save_checkpoint`` writes). Ray is
imported only then; call ``ray.init()`` (or ``ray.init(address=...)``) first, or Ray
starts a local instance itself. See ``docs/scaling.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from rlconnect.checkpoints.files import read_regular_file
from rlconnect.distributed.faults import FaultTolerance, RunnerFailedError, RunnerFailure
from rlconnect.distributed.gather import Batch, DeltaInbox, sample_round, sample_stream, tag_batch
from rlconnect.distributed.pool import RunnerPool
from rlconnect.distributed.sync import apply_deltas, check_frozen_filters
from rlconnect.distributed.worker import RunnerSpec
from rlconnect.policy import Policy
from rlconnect.runner import Callbacks, EnvRunner, RunnerConfig
from rlconnect.runner.metrics import LoggerSet, MetricsLogger, merge_metrics
from rlconnect.runner.pipelines import PipelineSpecs
from rlconnect.runner.versions import mark_weights_lag

__all__ = ["RunnerGroup", "checkpoint_files"]


def checkpoint_files(path: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files a group's remote runners restore from: the checkpoint's manifest and the
    files it lists, each checked for its size (before it is read) and its SHA-256, by
    '/'-separated relative path. Nothing else in the folder is read (a big stray file, a
    FIFO or a device left there costs nothing)."""
    from rlconnect.checkpoints.runner_format import (
        MANIFEST,
        MAX_MANIFEST_BYTES,
        read_blob,
        read_manifest,
    )

    root = os.fspath(path)
    manifest = read_manifest(root)
    files = {
        MANIFEST: read_regular_file(os.path.join(root, MANIFEST), max_bytes=MAX_MANIFEST_BYTES)
    }
    for policy in manifest["policies"]:
        for entry in policy["files"].values():
            files[entry["path"]] = read_blob(root, entry)[1]
    return files


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "RunnerGroup(num_runners > 0) needs Ray: pip install 'rlconnect[ray]'"
        ) from exc
    return ray


_PIPELINE_KEYWORDS = {
    "agent_pipelines": "agent",
    "action_pipelines": "action",
    "learner_pipelines": "learner",
}


def _pipeline_specs(given: Mapping[str, Any]) -> PipelineSpecs:
    """``agent_pipelines=`` / ``action_pipelines=`` / ``learner_pipelines=`` as one record
    (a TypeError names any other keyword, and where fault settings now go)."""
    unknown = sorted(set(given) - set(_PIPELINE_KEYWORDS))
    if unknown:
        faults = sorted(set(unknown) & set(attrs.fields_dict(FaultTolerance)))
        hint = (
            f"; {faults} are FaultTolerance settings: fault_tolerance=FaultTolerance(...)"
            if faults
            else ""
        )
        raise TypeError(f"RunnerGroup got unexpected keyword arguments {unknown}{hint}")
    return PipelineSpecs(**{_PIPELINE_KEYWORDS[k]: v for k, v in given.items()})


class RunnerGroup:
    """A local EnvRunner plus ``num_runners`` remote EnvRunners (Ray actors).

    Args:
        env, policies, policy_mapping_fn, config, callbacks: as for ``rc.EnvRunner``; every
            runner gets a copy (remote runner ``k`` is seeded ``seed + k * num_envs``).
        num_runners: remote runners K (0: sample locally; Ray is never imported).
        runner_resources: Ray resources of each remote runner, passed to
            ``.options()`` (default ``{"num_cpus": 1}``).
        fault_tolerance: what to do when a remote runner fails or does not start (an
            ``rc.FaultTolerance``; default: raise ``RunnerFailedError``).
        agent_pipelines, action_pipelines, learner_pipelines: as for ``rc.EnvRunner`` (by
            policy id), passed to every runner, local and remote (each remote runner runs
            its learner pipelines on its own batches, with its own copy of the policy).
            Give callables ``ctx -> pipeline`` defined at module level (they must
            pickle), so each runner builds its own pipelines.
    """

    def __init__(
        self,
        env: Any,
        policies: Policy | Mapping[str, Policy],
        policy_mapping_fn: Callable[..., str] | None = None,
        config: RunnerConfig | None = None,
        callbacks: Callbacks | None = None,
        num_runners: int = 0,
        runner_resources: Mapping[str, Any] | None = None,
        *,
        fault_tolerance: FaultTolerance | None = None,
        **pipelines: Mapping[str, Any] | None,
    ) -> None:
        specs = _pipeline_specs(pipelines)
        local = EnvRunner(
            env,
            policies,
            policy_mapping_fn,
            config=config,
            callbacks=callbacks,
            agent_pipelines=specs.agent,
            action_pipelines=specs.action,
            learner_pipelines=specs.learner,
        )
        spec = RunnerSpec(env, local.policies, policy_mapping_fn, local.config, callbacks, specs)
        self._setup(local, spec, num_runners, runner_resources, fault_tolerance)

    def _setup(
        self,
        local: EnvRunner,
        spec: RunnerSpec,
        num_runners: int,
        runner_resources: Mapping[str, Any] | None,
        faults: FaultTolerance | None,
        checkpoint_files: Mapping[str, bytes] | None = None,
    ) -> None:
        if isinstance(num_runners, bool) or not isinstance(num_runners, int) or num_runners < 0:
            local.stop()
            raise ValueError(f"num_runners={num_runners!r}: must be an integer >= 0")
        if faults is not None and not isinstance(faults, FaultTolerance):
            local.stop()
            raise TypeError(
                f"fault_tolerance must be an rc.FaultTolerance or None, got {type(faults).__name__}"
            )
        self.local_runner = local
        self.config = local.config
        self.faults = faults or FaultTolerance()
        self.num_runners = num_runners
        self._inbox = DeltaInbox(num_runners)
        self.last_sample_info: dict[str, Any] = {}
        self._stopped = False
        self._pool: RunnerPool | None = None
        self._loggers = LoggerSet()
        if num_runners == 0:
            return
        self._ray = _import_ray()
        resources = dict(runner_resources or {"num_cpus": 1})
        try:
            check_frozen_filters(local)
            self._pool = RunnerPool(
                self._ray, spec, local, num_runners, resources, self.faults, checkpoint_files
            )
        except BaseException:
            local.stop()
            raise

    # -- actors ---------------------------------------------------------------------------
    @property
    def healthy_runner_indices(self) -> list[int]:
        """Indices (1..K) of the remote runners still in use."""
        return self._pool.indices if self._pool else []

    @property
    def _remote(self) -> RunnerPool:
        if self._pool is None:
            raise RuntimeError("this RunnerGroup has no remote runners (num_runners=0)")
        return self._pool

    @property
    def _actors(self) -> dict[int, Any]:
        return self._pool.actors if self._pool else {}

    # -- sampling -------------------------------------------------------------------------
    def sample(self) -> Batch:
        """One batch from every healthy runner, gathered in parallel, concatenated in
        runner order. Its ``meta`` (of each policy batch) holds ``runner_rows``
        (rows per runner index) and ``runner_failures`` (records of this call)."""
        if self.num_runners == 0:
            out = self.local_runner.sample()
        else:
            self._require_runners()
            count_by = self.config.count_steps_by
            out, info = sample_round(self._remote, self._inbox, count_by, self.num_runners)
            self.last_sample_info = info
            mark_weights_lag(out, self.local_runner.policies)  # behind the learner's versions
        if self._loggers:
            self._loggers.write(self.metrics(), out)
        return out

    def add_logger(self, logger: MetricsLogger) -> None:
        """Write one record of ``metrics()`` (merged over the runners) per ``sample()``
        to ``logger`` (``sample_async`` writes none: asking the runners would stall their
        stream); ``stop()`` flushes and closes it. A logger that cannot write makes
        ``sample()`` raise ``rc.LoggerError`` with the batch as its ``batch``."""
        self._loggers.add(logger)

    def sample_async(self, num_batches: int | None = None) -> Iterator[Batch]:
        """Yield runners' batches as they finish (each tagged ``meta["runner_index"]``);
        every runner samples its next batch while the caller works on this one.
        ``num_batches=None`` runs until the iterator is closed.

        A failed runner is handled as in ``sample()``: restarted (its request is sent
        again, so every batch keeps the promised size) or skipped (the healthy runners
        make up the count). The next batch yielded carries the failure records in
        ``meta["runner_failures"]`` (an empty list when there were none); all of them are
        in ``fault_metrics()``."""
        if self.num_runners == 0:
            n = 0
            while num_batches is None or n < num_batches:
                n += 1
                batch = self.local_runner.sample()
                tag_batch(batch, runner_index=0)
                yield batch
            return
        self._require_runners()
        stream = sample_stream(self._remote, self._inbox, num_batches, self._require_runners)
        try:  # (a generator: closing this one closes it, and its requests, too)
            for batch in stream:
                mark_weights_lag(batch, self.local_runner.policies)
                yield batch
        finally:
            stream.close()

    def __iter__(self) -> Iterator[Batch]:
        return self.sample_async()

    def _require_runners(self) -> None:
        if self._stopped:
            raise RuntimeError("this RunnerGroup was stopped")
        if not self._actors:
            raise RunnerFailedError(
                f"no healthy remote runner left (all {self.num_runners} failed; see "
                "fault_metrics())"
            )

    # -- weights and connector statistics ---------------------------------------------------
    def get_weights(self) -> dict[str, Any]:
        """The reference weights (the local runner's), by policy id."""
        return self.local_runner.get_weights()

    def sync_weights(
        self,
        weights: Mapping[str, Any] | None = None,
        weights_seq: int | Mapping[str, int] | None = None,
    ) -> None:
        """Set ``weights`` (default: the local runner's) on every runner; one object-store
        put is shared by all actors. ``weights_seq`` (the learner's version of
        ``weights``: an int, or an int by policy id) becomes every runner's
        ``policy.weights_seq``, so the rows they record show how far behind they are;
        without it, loading ``weights`` counts a new version locally, and the remote
        runners always take the local runner's versions with its weights."""
        local = self.local_runner
        if weights is not None:
            local.set_weights(weights, weights_seq)
        elif weights_seq is not None:
            local.set_weights(local.get_weights(), weights_seq)
        if not self._actors:
            return
        self._remote.weights_ref = self._ray.put(local.get_weights())
        self._call_all("set_weights", self._remote.weights_ref, self._remote.versions())

    def sync_connector_states(self) -> None:
        """Merge every runner's connector deltas into the reference statistics and send the
        result to every runner (see ``rlconnect.distributed.sync``). Deltas are merged in
        runner order, then call order, so the result does not depend on timing. With
        ``observation_filter_sync="frozen"`` this is when what remote runners normalise
        with changes (docs/scaling.md, "The staleness rule")."""
        if self.num_runners == 0:
            return
        merged = apply_deltas(self.local_runner, self._inbox.take())
        if merged and self._actors:
            self._call_all("set_connector_states", self._ray.put(merged))

    def get_connector_states(self) -> dict[str, Any]:
        """The reference connector statistics (the local runner's)."""
        return self.local_runner.get_connector_states()

    def _call_all(self, method: str, *args: Any) -> list[Any]:
        return self._pool.call_all(method, *args) if self._pool else []

    # -- helpers over all runners ------------------------------------------------------------
    def foreach_runner(self, fn: Callable[[EnvRunner], Any]) -> list[Any]:
        """``fn(runner)`` on every healthy remote runner (the local one when K=0), in runner
        order."""
        if self.num_runners == 0:
            return [fn(self.local_runner)]
        return self._call_all("apply", fn)

    def get_metrics(self) -> list[dict[str, Any]]:
        """Per-episode records of every runner since the last call, each with
        ``runner_index`` (0: local)."""
        if self.num_runners == 0:
            per_runner = {0: self.local_runner.get_metrics()}
        else:
            per_runner = dict(zip(self.healthy_runner_indices, self._call_all("get_metrics")))
        return [{**r, "runner_index": k} for k, recs in per_runner.items() for r in recs]

    def metrics(self) -> dict[str, Any]:
        """``runner.metrics()`` of every healthy runner that samples (the local one when
        K=0), merged: counts and seconds summed, means weighted by their episode counts,
        steps per second added up (the runners sample side by side); with
        ``num_runners_merged``, ``num_healthy_runners`` and ``num_runner_failures_lifetime``
        (see ``fault_metrics``). Each call starts every runner's next window."""
        if self.num_runners == 0:
            per_runner = [self.local_runner.metrics()]
        else:
            per_runner = self._call_all("apply", runner_metrics)
        out = merge_metrics(per_runner, parallel=True)
        out["num_runners_merged"] = len(per_runner)
        out["num_healthy_runners"] = len(self._actors) if self.num_runners else 1
        out["num_runner_failures_lifetime"] = len(self._pool_failures)
        return out

    @property
    def _pool_failures(self) -> list[RunnerFailure]:
        return self._pool.failures if self._pool else []

    def fault_metrics(self) -> dict[str, Any]:
        """Health and failure counters of the group (see docs/scaling.md)."""
        return {
            "num_remote_runners": self.num_runners,
            "num_healthy_runners": len(self._actors),
            "num_runner_failures": len(self._pool_failures),
            "num_runner_restarts": sum(f.action == "restarted" for f in self._pool_failures),
            "missing_rows": sum(f.missing_rows for f in self._pool_failures),
            "failures": [f.to_dict() for f in self._pool_failures],
        }

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Sync connector statistics, then write the reference runner's checkpoint."""
        self.sync_connector_states()
        self.local_runner.save_checkpoint(path)

    def restore(self, path: str | os.PathLike[str]) -> None:
        """Load a checkpoint into every runner (remote ones get its files through the
        object store, so ``path`` need only exist on the driver)."""
        self.local_runner.restore(path)
        if self.num_runners == 0:
            return
        self._remote.checkpoint_ref = self._ray.put(checkpoint_files(path))
        self._remote.weights_ref = None
        self._inbox.clear()
        if self._actors:
            self._call_all("restore_files", self._remote.checkpoint_ref)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        env: Any,
        num_runners: int = 0,
        policy_mapping_fn: Callable[..., str] | None = None,
        callbacks: Callbacks | None = None,
        config_overrides: Mapping[str, Any] | None = None,
        runner_resources: Mapping[str, Any] | None = None,
        fault_tolerance: FaultTolerance | None = None,
    ) -> RunnerGroup:
        """A group whose runners are rebuilt from a checkpoint (``EnvRunner.from_checkpoint``)."""
        local = EnvRunner.from_checkpoint(
            path,
            env=env,
            policy_mapping_fn=policy_mapping_fn,
            callbacks=callbacks,
            config_overrides=config_overrides,
        )
        group = cls.__new__(cls)
        files = checkpoint_files(path) if num_runners else None
        spec = RunnerSpec(
            env, local.policies, policy_mapping_fn, local.config, callbacks, PipelineSpecs()
        )
        group._setup(local, spec, num_runners, runner_resources, fault_tolerance, files)
        return group

    # -- lifetime -------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every runner and release the actors."""
        if self._stopped:
            return
        self._stopped = True
        if self._pool is not None:
            self._pool.kill_all(grace_s=10)
        self.local_runner.stop()
        self._loggers.close()

    close = stop

    def __enter__(self) -> RunnerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RunnerGroup(num_runners={self.num_runners}, healthy={self.healthy_runner_indices})"


def runner_metrics(runner: EnvRunner) -> dict[str, Any]:
    """``runner.metrics()``, run where the runner is (a Ray actor)."""
    return runner.metrics()
