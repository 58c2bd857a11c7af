"""The EnvRunner: steps envs through connector pipelines and policies into batches.

How one step flows (the code is ``StepKernel.step`` in ``rlconnect.runner.kernel``)::

    rows = env.poll()                      # envs/: every env kind adapted to BaseEnv
    kernel.step(rows)
        screen          failed or bad sub-envs restarted or named; NaN/inf caught
        open episodes   first observations open episodes; lengths, returns, horizon
        per policy      data = agent_pipeline(rows)       # one batched call
          act           act(policy, data)                 # policy, action pipeline
                        env.send_actions(env_actions)
        env.all_actions_sent()             # an env stepping as one batch starts here
        per policy
          record        collectors[pid].add_rows(rows, outputs)   # one chunk
        finish          env-step log, callbacks, episode ends and resets
    # ...until the collectors hold a batch, then:
    collectors.build() -> postprocess_trajectory -> SampleBatch | MultiAgentBatch

The runner owns the loop and the public API; its parts get what they need, never the
runner: ``StepKernel`` (the step) with ``EpisodeTracker``, ``TrajectoryIds``,
``AgentTracker``; ``act`` (the one place a policy is called, shared
with ``Inference``); ``build_pipelines``; ``postprocess_batches``. Offline I/O, serving
and Ray plug in through ``rlconnect.runner.extensions`` (offline I/O: the config's
``offline`` section attaches itself).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    LearnerConnectorPipeline,
)
from rlconnect.connectors.pipeline import ConnectorPipeline
from rlconnect.envs.make import make_base_env
from rlconnect.episodes import Episode
from rlconnect.errors import RunnerStateError, describe_exception
from rlconnect.policy import Policy
from rlconnect.runner import bookkeeping
from rlconnect.runner.async_sampler import AsyncSampler
from rlconnect.runner.bookkeeping import EpisodeHooks
from rlconnect.runner.callbacks import Callbacks
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.extensions import BatchSink, BatchSource
from rlconnect.runner.inference import Inference
from rlconnect.runner.kernel import StepKernel
from rlconnect.runner.metrics import EpisodeLog, LoggerSet, MetricsLogger, PerfTimers, RunMetrics
from rlconnect.runner.pipelines import (
    DeferredLearning,
    PipelineSpec,
    PipelineSpecs,
    build_pipelines,
)
from rlconnect.runner.policy_set import CheckedMapping, policy_set
from rlconnect.runner.postprocess import postprocess_batches, state_digest
from rlconnect.runner.versions import mark_weights_lag, weights_versions

if TYPE_CHECKING:
    from rlconnect.runner.tensor_kernel import TensorKernel

__all__ = ["EnvRunner"]


class EnvRunner:
    """Samples experience from ``env`` with ``policies`` through connector pipelines.

    >>> import gymnasium as gym
    >>> import rlconnect as rc
    >>> env = gym.make("CartPole-v1")
    >>> policy = rc.RandomPolicy(env.observation_space, env.action_space)
    >>> config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0)
    >>> len(rc.EnvRunner("CartPole-v1", policy, config=config).sample())
    10
    """

    def __init__(
        self,
        env: Any,
        policies: Policy | Mapping[str, Policy],
        policy_mapping_fn: Callable[..., str] | None = None,
        config: RunnerConfig | None = None,
        callbacks: Callbacks | None = None,
        agent_pipelines: Mapping[str, PipelineSpec] | None = None,
        action_pipelines: Mapping[str, PipelineSpec] | None = None,
        learner_pipelines: Mapping[str, PipelineSpec] | None = None,
    ) -> None:
        self.config = config or RunnerConfig()
        if not isinstance(self.config, RunnerConfig):
            raise TypeError(f"config must be an rc.RunnerConfig, got {type(self.config).__name__}")
        self.callbacks = callbacks or Callbacks()
        cfg = self.config
        self.policies, mapping = policy_set(policies, policy_mapping_fn, cfg)
        #: the user's function, as given (the runner calls it through a check of its ids)
        self.policy_mapping_fn = mapping.fn if isinstance(mapping, CheckedMapping) else mapping
        self.env_spec = env  # what evaluate() builds its separate sub-envs from
        self.env = make_base_env(env, cfg.env_settings())
        self.num_envs = self.env.num_envs
        #: sub-envs a fragment counts: an ExternalEnv has one slot per concurrent episode
        #: but sizes batches as ``fragment_envs`` envs
        self.fragment_envs: int = getattr(self.env, "fragment_envs", self.num_envs)
        self.pipelines = build_pipelines(
            self.env,
            self.policies,
            mapping,
            cfg,
            PipelineSpecs(agent_pipelines, action_pipelines, learner_pipelines),
        )
        self.collectors = PolicyCollectorGroup(
            self.policies, self.num_envs, compress_observations=cfg.compress_observations
        )
        self.timers = PerfTimers()
        self.hooks = EpisodeHooks(self.callbacks, self, self.env, self.policies)
        self._kernel: StepKernel | TensorKernel = self._make_kernel(mapping)
        self._inference = Inference(self.policies, self.pipelines, mapping, self.num_envs)
        self._async: AsyncSampler | None = None
        self._closed = False
        self._failed: BaseException | None = None  # what made sample() raise midway
        self._sinks: list[BatchSink] = []
        self._source: BatchSource | None = None
        #: the tensor path's learner pipelines run before its read, and their flags' values
        self._folded: tuple[DeferredLearning, list[bool]] | None = None
        self._episode_log = EpisodeLog(bookkeeping.MAX_METRICS)  # (read now: tests lower it)
        self._run_metrics = RunMetrics(list(self.policies), self.timers)
        self._loggers = LoggerSet()
        self._attach()

    def _make_kernel(self, mapping: Callable[..., str]) -> StepKernel | TensorKernel:
        """The step: ``TensorKernel`` for a batched tensor simulator (its policies mapped
        once per agent by ``mapping``, here), ``StepKernel`` for every other env."""
        cfg, env = self.config, self.env
        if env.on_tensors:  # (imported here: the tensor path needs torch)
            from rlconnect.envs.tensor_envs import TensorEnv
            from rlconnect.runner.tensor_kernel import TensorKernel, refuse_tensor_features

            env = cast(TensorEnv, env)
            refuse_tensor_features(cfg, self.hooks, self.policies, self.pipelines)
            probe = Episode(-1, -1, mapping)
            agent_policy = {a: probe.policy_for(a) for a in env.agents}
            return TensorKernel(
                env, self.policies, self.pipelines, cfg, self.timers, self.hooks, agent_policy
            )
        return StepKernel(
            env, self.policies, self.pipelines, cfg, self.collectors, self.timers, self.hooks,
            mapping,
        )  # fmt: skip

    def _attach(self) -> None:
        """What plugs into a new runner: its inference, for an env that serves episodes it
        does not record (an ExternalEnv's), and the config's sections (offline output and
        input: ``rlconnect.runner.extensions``)."""
        self.env.attach_inference(self._inference)
        for section in self.config.sections():
            section.attach(self)

    # -- public API -----------------------------------------------------------------------
    def agent_pipeline(self, policy_id: str = DEFAULT_POLICY_ID) -> AgentConnectorPipeline:
        """The live agent pipeline of ``policy_id``, to edit in place with its ``ctx``
        (``pipe.append(rc.ClipReward(pipe.ctx, limit=1.0))``). An edit that would change
        the shape or dtype of what the policy sees raises ValueError there and then, naming
        the connector and both spaces; the pipeline stays as it was."""
        pipe = self.pipelines.agent[policy_id]
        pipe.feeds(f"policy {policy_id!r}", self.policies[policy_id].observation_space)
        return pipe

    def action_pipeline(self, policy_id: str = DEFAULT_POLICY_ID) -> ActionConnectorPipeline:
        """The live action pipeline of ``policy_id``, to edit in place with its ``ctx``; an
        edit that would change the shape or dtype of what the env takes is refused, as for
        ``agent_pipeline``."""
        return self.pipelines.action[policy_id]

    def learner_pipeline(self, policy_id: str = DEFAULT_POLICY_ID) -> LearnerConnectorPipeline:
        """The live learner pipeline of ``policy_id`` (empty unless given as
        ``learner_pipelines``), to inspect or edit in place with its ``ctx``. It runs on
        every batch of the policy that ``sample()`` returns, with this runner's policy;
        an edit is checked against the policy before it first runs."""
        return self.pipelines.learner[policy_id]

    @property
    def is_single_agent(self) -> bool:
        """True when batches come out as plain SampleBatches."""
        return not self.env.is_multi_agent and list(self.policies) == [DEFAULT_POLICY_ID]

    def add_batch_sink(self, sink: BatchSink) -> None:
        """Give every batch ``sample()`` returns from live sampling to ``sink(batch,
        agent_ids)`` first (see ``rlconnect.runner.extensions``)."""
        self._sinks.append(sink)

    def add_logger(self, logger: MetricsLogger) -> None:
        """Write one record of ``metrics()`` per ``sample()`` to ``logger`` (see
        ``rc.loggers``); ``stop()`` flushes and closes it. Loggers are not part of the
        config or a checkpoint. A logger that cannot write makes ``sample()`` raise
        ``rc.LoggerError`` after the batch is built: the batch is the error's ``batch``,
        and the runner samples on without that logger."""
        self._loggers.add(logger)

    def set_batch_source(self, source: BatchSource | None) -> None:
        """Make ``sample()`` return ``source.next()`` (None: sample the envs again). The
        source's batches are returned as they come: it runs the learner pipelines on them
        (``apply_learner_pipelines``) where its trajectories are still whole."""
        self._source = source

    def sample(self) -> SampleBatch | MultiAgentBatch:
        """One batch: exactly ``rollout_fragment_length * num_envs`` steps when truncating.

        Each policy batch then goes through its learner pipeline (``learner_pipeline``),
        with the runner's policy as it is now (a batch source, e.g. offline input, runs
        them itself: see ``set_batch_source``).

        If it raises midway (an env, policy, connector or callback error), the runner's
        episodes are left half-processed: every later call raises ``RunnerStateError``.
        A learner pipeline that raises loses that batch only: the episodes are whole and
        the runner samples on.
        """
        self._refuse_if_failed()
        if self.config.sample_async:
            if self._async is None:
                self._async = AsyncSampler(self._next_batch)
            out = self._async.next()
        else:
            out = self._next_batch(fold_learner=True)
        if self._source is None:
            t0 = time.perf_counter()
            out = self._learned(out)
            self.timers.learner += time.perf_counter() - t0
        mark_weights_lag(out, self.policies)  # against the versions of now
        self._count(out)
        if self._loggers:
            self._loggers.write(self.metrics(), out)
        return out

    def _count(self, out: SampleBatch | MultiAgentBatch) -> None:
        """The batch and the episodes ended so far into the ``metrics()`` window."""
        self._take_episodes()
        if isinstance(out, MultiAgentBatch):
            self._run_metrics.add_batch(out.env_steps(), out.agent_steps())
        else:
            self._run_metrics.add_batch(len(out), len(out))

    def _take_episodes(self) -> None:
        """Episode records of the step into ``get_metrics()``'s log and ``metrics()``."""
        self._kernel.episodes.hand_over(self._episode_log, self._run_metrics)

    def apply_learner_pipelines(
        self, out: SampleBatch | MultiAgentBatch
    ) -> SampleBatch | MultiAgentBatch:
        """Every policy batch of ``out`` through its learner pipeline, with the runner's
        policy as it is now (see ``PolicyPipelines.learn``); what ``sample()`` does to the
        batches it samples, for a batch source to do to the batches it hands out."""
        if isinstance(out, MultiAgentBatch):
            self.pipelines.learn(out.policy_batches, self.policies)
            return out
        pipe = self.pipelines.learner.get(DEFAULT_POLICY_ID)
        if pipe is None or not len(pipe):
            return out
        one = {DEFAULT_POLICY_ID: out}
        self.pipelines.learn(one, self.policies)
        return one[DEFAULT_POLICY_ID]

    def _learned(self, out: SampleBatch | MultiAgentBatch) -> SampleBatch | MultiAgentBatch:
        """``out`` through the learner pipelines, or what they made of it already, their
        checks read with the tensor path's one read (``DeferredLearning``)."""
        folded, self._folded = self._folded, None
        if folded is None:
            return self.apply_learner_pipelines(out)
        learning, values = folded
        learned = learning.result(values)
        if isinstance(out, MultiAgentBatch):
            return MultiAgentBatch(learned, out.env_steps())
        return learned.get(DEFAULT_POLICY_ID, out)

    def _next_batch(self, *, fold_learner: bool = False) -> SampleBatch | MultiAgentBatch:
        if self._source is not None:  # e.g. RunnerConfig(input=...): a batch source
            return self._source.next()
        return self._sample_guarded(fold_learner)

    def sample_envs(self) -> SampleBatch | MultiAgentBatch:
        """One batch sampled from the envs, whatever batch source is set."""
        return self._sample_guarded(False)

    def _sample_guarded(self, fold_learner: bool) -> SampleBatch | MultiAgentBatch:
        self._refuse_if_failed()
        self._folded = None
        t0 = time.perf_counter()
        try:
            return self._sample_envs(fold_learner)
        except BaseException as exc:  # whatever it was, the loop's state is now unknown
            self._failed = exc
            raise
        finally:
            self.timers.sampling += time.perf_counter() - t0

    @property
    def failure(self) -> BaseException | None:
        """What made ``sample()`` raise midway (every later call refuses), or None."""
        return self._failed

    def _refuse_if_failed(self) -> None:
        if self._failed is not None:
            raise RunnerStateError(
                f"this runner's sample() raised {describe_exception(self._failed)} midway, "
                "leaving its episodes half-processed; build a new runner (or restore one "
                "from a checkpoint)"
            ) from self._failed

    def _sample_envs(self, fold_learner: bool) -> SampleBatch | MultiAgentBatch:
        cfg, kernel = self.config, self._kernel
        for pipe in self.pipelines.agent.values():  # a lone runner's sync point
            pipe.start_sample()
        digests = {pid: state_digest(p) for pid, p in self.pipelines.agent.items()}
        agent_ids: dict[str, Any] = {}
        learned: dict[str, SampleBatch] = {}
        if self.env.on_tensors:
            learning = self._deferred_learning() if fold_learner else None
            sampled = cast("TensorKernel", kernel).sample(learning)
            batches, env_steps = sampled.batches, sampled.env_steps
            if learning is not None and sampled.learner_flags is not None:
                self._folded = (learning, sampled.learner_flags)
                learned = learning.learned
        else:
            kernel = cast(StepKernel, kernel)
            target = cfg.rollout_fragment_length * self.fragment_envs
            mode, count_by = cfg.batch_mode, cfg.count_steps_by
            kernel.run_until(mode, target, count_by)
            built, env_steps = self.collectors.build(mode, target, count_by)
            batches = postprocess_batches(built, self.hooks, kernel.trajectories.owner)
            agent_ids = self._agent_ids(built) if self._sinks else {}
            kernel.trajectories.forget_handed_out(self.collectors)
        for pid, b in [*batches.items(), *learned.items()]:
            b.meta["connector_state"] = digests[pid]
            b.meta["policy_id"] = pid
        out: SampleBatch | MultiAgentBatch
        if self.is_single_agent:
            out = batches.get(DEFAULT_POLICY_ID, SampleBatch())
        else:
            out = MultiAgentBatch(batches, env_steps)
        if self.callbacks.overrides("on_sample_end"):
            self.callbacks.on_sample_end(runner=self, samples=out)
        for sink in self._sinks:  # e.g. RunnerConfig(output=DIR): in finished files now
            sink(out, agent_ids)
        return out

    def _deferred_learning(self) -> DeferredLearning | None:
        """The learner pipelines to run before the tensor kernel's one read, or None (the
        pipelines then run after the batch is made, reading their checks once
        themselves): no member to run, an ``on_sample_end`` callback that may change the
        batches first, or restarts, where the read may drop rows a pipeline (and its
        state) must never see."""
        if not any(len(p) for p in self.pipelines.learner.values()):
            return None
        if self.callbacks.overrides("on_sample_end"):
            return None
        if self.config.restart_failed_sub_environments:
            return None
        return DeferredLearning(self.pipelines, self.policies)

    def _agent_ids(self, built: dict[str, tuple[SampleBatch, np.ndarray]]) -> dict[str, Any]:
        """The agent id (as a string) of every built row, per policy (multi-agent only)."""
        if self.is_single_agent or not isinstance(self._kernel, StepKernel):
            return {}
        owner = self._kernel.trajectories.owner
        out = {}
        for pid, (_, traj) in built.items():
            uniq, inverse = np.unique(traj, return_inverse=True)
            names = [owner(t)[0] for t in uniq.tolist()]
            labels = [str(t if a is None else a) for a, t in zip(names, uniq.tolist())]
            out[pid] = np.array(labels, dtype=object)[inverse.reshape(-1)]
        return out

    def start_episode_ids_at(self, first: int) -> None:
        """Number the episodes this runner starts from ``first`` on (before it samples).

        Episode ids are ``worker_index << 40`` plus a counter by default; a runner that
        replaces a failed one uses this so it never reuses its predecessor's ids.
        """
        if self._kernel.poll_index:
            raise ValueError("start_episode_ids_at must be called before the first sample()")
        self._kernel.episodes.next_id = int(first)

    def get_off_policy_metrics(self) -> list[dict[str, Any]]:
        """Off-policy estimates since the last call (and clear them): one record per policy
        and batch read from files, ``{"policy_id", "input", "is": {...}, "wis": {...}}``
        (see ``OfflineConfig.off_policy_estimation``)."""
        return self._source.take_metrics() if self._source is not None else []

    def get_metrics(self) -> list[dict[str, Any]]:
        """Per-episode records since the last call (and clear them)."""
        self._take_episodes()
        return self._episode_log.take()

    def metrics(self) -> dict[str, Any]:
        """The run's figures since the last call, JSON-ready (string keys, numbers or
        None): steps, episodes and their returns (also per policy and per agent), steps
        per second, and the seconds of each phase of sampling with the runner's own share
        (``time/overhead_share``). Apart from ``get_metrics()``: neither clears the
        other's. Each call starts a new window, whoever makes it (a logger calls it once
        per ``sample()``). Every key: ``docs/metrics.md``."""
        self._take_episodes()
        return self._run_metrics.take()

    def perf_stats(self) -> dict[str, Any]:
        """Mean milliseconds per step in each stage (``mean_learner_processing_ms``: the
        learner pipelines, which run once per batch, spread over the steps), plus
        ``connectors``: ms per step by name, for the members of all three kinds of pipeline."""
        stats: dict[str, Any] = dict(self.timers.means())
        conn: dict[str, float] = {}
        steps = max(self.timers.steps, 1)
        pipes: list[tuple[str, ConnectorPipeline]] = [
            *self.pipelines.agent.items(),
            *self.pipelines.action.items(),
            *self.pipelines.learner.items(),
        ]
        learner_ms = 0.0
        for pid, pipe in pipes:
            prefix = "" if len(self.policies) == 1 else f"{pid}/"
            for name, ms in pipe.timings().items():
                share = ms * pipe.calls / steps
                conn[prefix + name] = conn.get(prefix + name, 0.0) + share
                if isinstance(pipe, LearnerConnectorPipeline):
                    learner_ms += share
        stats["mean_learner_processing_ms"] = learner_ms
        if self.env.on_tensors:  # the tensor path: reads of the device
            stats["host_reads_per_poll"] = cast("TensorKernel", self._kernel).host_reads / steps
        stats["connectors"] = conn
        return stats

    def get_weights(self) -> dict[str, dict[str, np.ndarray]]:
        """Weights of every policy, by policy id."""
        return {pid: p.get_weights() for pid, p in self.policies.items()}

    def set_weights(
        self,
        weights: Mapping[str, Mapping[str, np.ndarray]],
        weights_seq: int | Mapping[str, int] | None = None,
    ) -> None:
        """Load weights by policy id (unknown ids are a ValueError). Each policy loaded
        counts a new version (``policy.weights_seq``); ``weights_seq`` (an int, or an int
        by policy id) sets the version instead: the learner's, so rows show their lag."""
        unknown = sorted(set(weights) - set(self.policies))
        if unknown:
            raise ValueError(
                f"weights for unknown policies {unknown}; known: {list(self.policies)}"
            )
        versions = weights_versions(weights, weights_seq)
        for pid, w in weights.items():
            self.policies[pid].set_weights(w)
            if pid in versions:
                self.policies[pid].weights_seq = versions[pid]

    def get_connector_states(self) -> dict[str, dict[str, Any]]:
        """Connector statistics by policy id: ``{"agent": {...}, "action": {...}}``."""
        return {
            pid: {
                "agent": self.pipelines.agent[pid].get_statistics(),
                "action": self.pipelines.action[pid].get_statistics(),
            }
            for pid in self.policies
        }

    def set_connector_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Load what ``get_connector_states`` returned (e.g. merged filters from a driver)."""
        for pid, st in states.items():
            if pid not in self.policies:
                raise ValueError(f"connector state for unknown policy {pid!r}")
            self.pipelines.agent[pid].set_statistics(st.get("agent", {}))
            self.pipelines.action[pid].set_statistics(st.get("action", {}))

    def stop(self) -> None:
        """Stop the background sampler (if any), close every sub-env, then flush and
        close the loggers (a logger that fails raises ``LoggerError`` after the rest)."""
        try:
            if self._async is not None:
                self._async.stop()
            if not self._closed:
                self._closed = True
                self.env.close()
        finally:
            self._loggers.close()

    close = stop

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- checkpoints, inference, evaluation (rlconnect.runner.checkpoint / inference /
    #    evaluation hold the code) -----------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write policies (spec, weights) and pipelines (with statistics) atomically to the
        folder ``path`` (layout: ``rlconnect.checkpoints.runner_format``)."""
        from rlconnect.runner.checkpoint import save_checkpoint

        save_checkpoint(self, path)

    def restore(self, path: str | os.PathLike[str]) -> None:
        """Load a checkpoint's weights and pipelines into this runner (same policy ids,
        spaces and architectures, else ``CheckpointError``; nothing changes on error)."""
        from rlconnect.runner.checkpoint import restore_runner

        restore_runner(self, path)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        *,
        env: Any,
        policy_mapping_fn: Callable[..., str] | None = None,
        callbacks: Callbacks | None = None,
        config_overrides: Mapping[str, Any] | None = None,
    ) -> EnvRunner:
        """Rebuild a runner on ``env`` from a checkpoint whose policies are of registered
        kinds (``rc.register_policy``); ``config_overrides`` replace saved config fields.
        ``env`` may also be ``"module:function"``, the command line's form."""
        from rlconnect.runner.checkpoint import runner_from_checkpoint

        return runner_from_checkpoint(
            cls,
            path,
            env=env,
            policy_mapping_fn=policy_mapping_fn,
            callbacks=callbacks,
            config_overrides=config_overrides,
        )

    def compute_single_action(
        self,
        obs: Any,
        *,
        policy_id: str = DEFAULT_POLICY_ID,
        explore: bool = False,
        agent_id: Any = DEFAULT_AGENT_ID,
        env_id: int | None = None,
    ) -> Any:
        """The env action for one raw observation, through the agent pipeline, the policy
        and the action pipeline in eval mode (see ``rlconnect.runner.inference``). A wrong
        observation (shape, structure, NaN or inf, dtype) raises ``EnvCheckError`` before
        any state changes, as a deployed policy's does."""
        out = self._inference.compute_actions(
            {agent_id: obs}, policy_id=policy_id, explore=explore, env_id=env_id
        )
        return out[agent_id]

    def compute_actions(
        self,
        obs_by_agent: Mapping[Any, Any],
        *,
        policy_id: str | None = None,
        explore: bool = False,
        env_id: int | None = None,
    ) -> dict[Any, Any]:
        """Env actions by agent id, like ``compute_single_action`` for several agents
        (``policy_id=None`` maps agents with ``policy_mapping_fn``)."""
        return self._inference.compute_actions(
            obs_by_agent, policy_id=policy_id, explore=explore, env_id=env_id
        )

    def evaluate(self, num_episodes: int = 10, *, env: Any = None) -> list[dict[str, Any]]:
        """Metric records of ``num_episodes`` whole episodes run in eval mode on separate
        sub-envs; nothing of them reaches training (see ``rlconnect.runner.evaluation``)."""
        from rlconnect.runner.evaluation import evaluate

        return evaluate(self, num_episodes, env=env)
