"""The remote runner: an EnvRunner inside a Ray actor, and how each one is built.

Nothing here imports Ray; ``pool.py`` wraps :class:`RemoteRunner` with ``ray.remote``.
Remote runner ``k`` (1..K) gets ``seed + k * num_envs`` and ``worker_index=k``, so its
sub-env ``j`` is seeded ``seed + k * num_envs + j`` (``EnvRunner`` seeds sub-env ``i`` with
``seed + i``) and its episode ids start at ``k << 40``. A restarted runner (incarnation
``r > 0``) gets a fresh seed derived from ``(seed, k, r)`` so it never replays its
predecessor's data, and episode ids from ``(k << 40) + (r << 32)`` so they stay unique.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from rlconnect.checkpoints.files import write_folder
from rlconnect.distributed.sync import ConnectorDeltas, pop_connector_deltas
from rlconnect.runner import EnvRunner, RunnerConfig
from rlconnect.runner.pipelines import PipelineSpecs

__all__ = ["RemoteRunner", "RunnerSpec", "runner_seed"]


def runner_seed(seed: int | None, index: int, num_envs: int, incarnation: int = 0) -> int | None:
    """Base seed of remote runner ``index`` (its sub-env ``j`` gets this + ``j``)."""
    if seed is None:
        return None
    if incarnation == 0:
        return seed + index * num_envs
    state = np.random.SeedSequence([seed, index, incarnation]).generate_state(1)[0]
    return int(state) % (2**31)


@attrs.frozen
class RunnerSpec:
    """Everything needed to (re)build remote runner ``k`` in any process."""

    env: Any
    policies: Any
    policy_mapping_fn: Callable[..., str] | None
    config: RunnerConfig
    callbacks: Any
    #: ``EnvRunner``'s ``agent_pipelines`` / ``action_pipelines`` / ``learner_pipelines``
    #: (by policy id): callables ``ctx -> pipeline`` that pickle, so every runner builds
    #: its own pipelines
    pipelines: PipelineSpecs = attrs.field(factory=PipelineSpecs)

    def config_for(self, index: int, incarnation: int = 0) -> RunnerConfig:
        """The config of runner ``index``: its worker index and a seed that differs per index
        and per restart (``incarnation``), so no two runners replay the same episodes."""
        seed = runner_seed(self.config.seed, index, self.config.num_envs, incarnation)
        changes = {"seed": seed, "worker_index": index}
        return attrs.evolve(self.config, **changes)

    def build(self, index: int, incarnation: int = 0) -> EnvRunner:
        """A new EnvRunner for index ``index`` from the spec's env, policies, pipelines and
        callbacks."""
        runner = EnvRunner(
            self.env,
            self.policies,
            policy_mapping_fn=self.policy_mapping_fn,
            config=self.config_for(index, incarnation),
            callbacks=self.callbacks,
            agent_pipelines=self.pipelines.agent,
            action_pipelines=self.pipelines.action,
            learner_pipelines=self.pipelines.learner,
        )
        if incarnation:
            # a restarted runner must not reuse its predecessor's episode ids
            runner.start_episode_ids_at((index << 40) + (incarnation << 32))
        return runner


class RemoteRunner:
    """One remote runner; every public method is a Ray actor method."""

    def __init__(self, spec: RunnerSpec, index: int, incarnation: int = 0) -> None:
        self.index = index
        self.incarnation = incarnation
        self.runner = spec.build(index, incarnation)

    def sample(self) -> tuple[Any, ConnectorDeltas]:
        """One batch and the connector deltas of its data (reset here, atomically)."""
        batch = self.runner.sample()
        return batch, pop_connector_deltas(self.runner)

    def get_weights(self) -> dict[str, Any]:
        """The runner's policy weights, for the driver to check or re-broadcast."""
        return self.runner.get_weights()

    def set_weights(
        self, weights: Mapping[str, Any], weights_seq: Mapping[str, int] | None = None
    ) -> None:
        """Load the driver's weights (and their versions) into the runner's policies."""
        self.runner.set_weights(weights, weights_seq)

    def get_connector_states(self) -> dict[str, Any]:
        """The runner's connector statistics (e.g. filter deltas) for the driver to merge."""
        return self.runner.get_connector_states()

    def set_connector_states(self, states: Mapping[str, Any]) -> None:
        """Load the connector statistics the driver merged from every runner."""
        self.runner.set_connector_states(states)

    def get_metrics(self) -> list[dict[str, Any]]:
        """The episode metrics finished since the last call (taken and cleared)."""
        return self.runner.get_metrics()

    def restore_files(self, files: Mapping[str, bytes]) -> None:
        """Restore from a checkpoint shipped as bytes (the driver's path may not exist here)."""
        tmp = tempfile.mkdtemp(prefix="rlconnect-restore-")
        try:
            write_folder(files, os.path.join(tmp, "ckpt"))
            self.runner.restore(os.path.join(tmp, "ckpt"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def apply(self, fn: Callable[[EnvRunner], Any]) -> Any:
        """``fn(runner)`` inside the actor's process; its result comes back to the driver."""
        return fn(self.runner)

    def ready(self) -> int:
        """The actor's process id, once it is built."""
        return os.getpid()

    def stop(self) -> None:
        """Stop the runner and release its envs (the actor itself stays until killed)."""
        self.runner.stop()
