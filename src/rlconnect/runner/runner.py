"""The EnvRunner: steps envs through connector pipelines and policies into batches.

The loop only; env adaptation lives in ``envs/``, trajectory storage in ``collectors/``,
preprocessing in ``connectors/``, per-agent bookkeeping in ``runner/agents.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID, MultiAgentBatch, SampleBatch
from rlconnect.collectors import PolicyCollectorGroup
from rlconnect.connectors import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorContext,
    default_action_pipeline,
    default_agent_pipeline,
)
from rlconnect.connectors.agent.mean_std_filter import refreeze_filters
from rlconnect.envs.make import make_base_env
from rlconnect.episodes import Episode
from rlconnect.errors import RunnerStateError, describe_exception
from rlconnect.policy import Policy
from rlconnect.runner.async_sampler import AsyncSampler
from rlconnect.runner.callbacks import Callbacks
from rlconnect.runner.config import RunnerConfig
from rlconnect.runner.metrics import PerfTimers
from rlconnect.runner.postprocess import postprocess_batches, state_digest
from rlconnect.runner.stepper import Stepper
from rlconnect.spaces import describe_space

__all__ = ["EnvRunner"]

PipelineSpec = Any  # a pipeline, or a callable ctx -> pipeline


def _default_mapping(policy_ids: list[str]) -> Callable[..., str]:
    only = policy_ids[0]

    def mapping(agent_id: Any, episode: Episode, **kwargs: Any) -> str:
        return only

    return mapping


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
    ) -> None:
        self.config = config or RunnerConfig()
        if not isinstance(self.config, RunnerConfig):
            raise TypeError(f"config must be an rc.RunnerConfig, got {type(self.config).__name__}")
        self.callbacks = callbacks or Callbacks()
        cfg = self.config
        self.policies: dict[str, Policy] = (
            {DEFAULT_POLICY_ID: policies} if isinstance(policies, Policy) else dict(policies)
        )
        if not self.policies or not all(isinstance(p, Policy) for p in self.policies.values()):
            raise TypeError("policies must be an rc.Policy or a non-empty dict of them")
        if policy_mapping_fn is None:
            if len(self.policies) > 1:
                raise ValueError(
                    f"{len(self.policies)} policies need a policy_mapping_fn(agent_id, episode)"
                )
            policy_mapping_fn = _default_mapping(list(self.policies))
        self.policy_mapping_fn = policy_mapping_fn
        self._env_spec = env  # what evaluate() builds its separate sub-envs from
        self.env = make_base_env(
            env,
            num_envs=cfg.num_envs,
            seed=cfg.seed,
            env_config=cfg.env_config,
            worker_index=cfg.worker_index,
            remote_envs=cfg.remote_envs,
            preset=cfg.preset,
            sub_env_timeout_s=cfg.sub_env_timeout_s,
            num_env_workers=cfg.num_env_workers,
            env_poll_size=cfg.env_poll_size,
            horizon=cfg.horizon,
            soft_horizon=cfg.soft_horizon,
        )
        self.num_envs = self.env.num_envs
        #: sub-envs a fragment counts: an ExternalEnv has one slot per concurrent episode
        #: but sizes batches as ``fragment_envs`` envs
        self.fragment_envs: int = getattr(self.env, "fragment_envs", self.num_envs)
        if cfg.seed is not None:
            seeds = np.random.SeedSequence([cfg.seed, cfg.worker_index]).spawn(len(self.policies))
            for p, ss in zip(self.policies.values(), seeds):
                p.seed(int(ss.generate_state(1)[0] % (2**31)))
        self._agent_pipes: dict[str, AgentConnectorPipeline] = {}
        self._action_pipes: dict[str, ActionConnectorPipeline] = {}
        for pid, policy in self.policies.items():
            self._build_pipelines(pid, policy, agent_pipelines or {}, action_pipelines or {})
        self.collectors = PolicyCollectorGroup(
            self.policies, self.num_envs, compress_observations=cfg.compress_observations
        )
        self.timers = PerfTimers()
        self._dense_path = True  # the fast path for dense polls; tests turn it off to compare
        self._metrics: list[dict[str, Any]] = []
        self._stepper = Stepper(self)
        self._async: AsyncSampler | None = None
        self._closed = False
        self._failed: BaseException | None = None  # what made sample() raise midway
        self._off_policy_metrics: list[dict[str, Any]] = []
        self._output: Any = None  # offline I/O (rlconnect.offline.runner_io)
        self._input: Any = None
        if cfg.output is not None or cfg.input != "sampler":
            from rlconnect.offline.runner_io import attach_offline_io

            self._output, self._input = attach_offline_io(self)

    # -- construction ---------------------------------------------------------------------
    def _env_obs_space(self, pid: str) -> gym.Space:
        """The raw observation space of the agents mapped to ``pid``."""
        if not self.env.is_multi_agent:
            return self.env.observation_space(DEFAULT_AGENT_ID)
        probe = Episode(-1, -1, self.policy_mapping_fn, worker=self)
        for agent in self.env.possible_agents:
            if probe.policy_for(agent) == pid:
                return self.env.observation_space(agent)
        return self.policies[pid].observation_space

    def _env_action_space(self, pid: str) -> gym.Space:
        if not self.env.is_multi_agent:
            return self.env.action_space(DEFAULT_AGENT_ID)
        probe = Episode(-1, -1, self.policy_mapping_fn, worker=self)
        for agent in self.env.possible_agents:
            if probe.policy_for(agent) == pid:
                return self.env.action_space(agent)
        return self.policies[pid].action_space

    def _build_pipelines(
        self,
        pid: str,
        policy: Policy,
        agent_specs: Mapping[str, PipelineSpec],
        action_specs: Mapping[str, PipelineSpec],
    ) -> None:
        cfg = self.config
        ctx = ConnectorContext.from_policy(
            policy,
            cfg.connector_config(),
            observation_space=self._env_obs_space(pid),
            policy_id=pid,
        )
        ctx.action_space = self._env_action_space(pid)
        ctx.is_training = cfg.explore
        agent = agent_specs.get(pid)
        action = action_specs.get(pid)
        agent_pipe = agent(ctx) if callable(agent) and not hasattr(agent, "output_space") else agent
        action_ctx = ConnectorContext(
            ctx.observation_space,
            ctx.action_space,
            dict(ctx.config),
            ctx.is_training,
            list(ctx.initial_states),
            pid,
        )
        action_pipe = (
            action(action_ctx)
            if callable(action) and not hasattr(action, "output_space")
            else action
        )
        agent_pipe = agent_pipe if agent_pipe is not None else default_agent_pipeline(ctx)
        action_pipe = (
            action_pipe if action_pipe is not None else default_action_pipeline(action_ctx)
        )
        out, want = agent_pipe.output_space, policy.observation_space
        if getattr(out, "shape", None) != getattr(want, "shape", None) or getattr(
            out, "dtype", None
        ) != getattr(want, "dtype", None):
            raise ValueError(
                f"policy {pid!r} expects observations {describe_space(want)} but its agent "
                f"pipeline ({' -> '.join(agent_pipe.names) or 'empty'}) outputs "
                f"{describe_space(out)}; build the policy for the pipeline's output space"
            )
        if not cfg.explore:
            agent_pipe.in_eval()
            action_pipe.in_eval()
        self._agent_pipes[pid] = agent_pipe
        self._action_pipes[pid] = action_pipe

    # -- public API -----------------------------------------------------------------------
    def agent_pipeline(self, policy_id: str = DEFAULT_POLICY_ID) -> AgentConnectorPipeline:
        """The live agent pipeline of ``policy_id`` (edit it in place)."""
        return self._agent_pipes[policy_id]

    def action_pipeline(self, policy_id: str = DEFAULT_POLICY_ID) -> ActionConnectorPipeline:
        """The live action pipeline of ``policy_id`` (edit it in place)."""
        return self._action_pipes[policy_id]

    @property
    def is_single_agent(self) -> bool:
        """True when batches come out as plain SampleBatches."""
        return not self.env.is_multi_agent and list(self.policies) == [DEFAULT_POLICY_ID]

    def sample(self) -> SampleBatch | MultiAgentBatch:
        """One batch: exactly ``rollout_fragment_length * num_envs`` steps when truncating.

        If it raises midway (an env, policy, connector or callback error), the runner's
        episodes are left half-processed: every later call raises ``RunnerStateError``.
        """
        self._refuse_if_failed()
        if self.config.sample_async:
            if self._async is None:
                self._async = AsyncSampler(self._sample_sync)
            return self._async.next()
        return self._sample_sync()

    def _sample_sync(self, live: bool = False) -> SampleBatch | MultiAgentBatch:
        if self._input is not None and not live:  # RunnerConfig(input=...): draw a source
            return self._input.next()
        self._refuse_if_failed()
        try:
            return self._sample_envs()
        except BaseException as exc:  # whatever it was, the loop's state is now unknown
            self._failed = exc
            raise

    def _refuse_if_failed(self) -> None:
        if self._failed is not None:
            raise RunnerStateError(
                f"this runner's sample() raised {describe_exception(self._failed)} midway, "
                "leaving its episodes half-processed; build a new runner (or restore one "
                "from a checkpoint)"
            ) from self._failed

    def _sample_envs(self) -> SampleBatch | MultiAgentBatch:
        cfg = self.config
        target = cfg.rollout_fragment_length * self.fragment_envs
        mode, count_by = cfg.batch_mode.value, cfg.count_steps_by.value
        refreeze_filters(self._agent_pipes.values())  # a lone runner's sync point
        digests = {pid: state_digest(p) for pid, p in self._agent_pipes.items()}
        self._stepper.run_until_ready(mode, target, count_by)
        built, env_steps = self.collectors.build(mode, target, count_by)
        batches = postprocess_batches(self, built)
        agent_ids = self._output.agent_ids(built) if self._output is not None else None
        self._stepper.forget_closed_trajectories()
        for pid, b in batches.items():
            b.meta["connector_state"] = digests[pid]
            b.meta["policy_id"] = pid
        out: SampleBatch | MultiAgentBatch
        if self.is_single_agent:
            out = batches.get(DEFAULT_POLICY_ID, SampleBatch())
        else:
            out = MultiAgentBatch(batches, env_steps)
        if self.callbacks.overrides("on_sample_end"):
            self.callbacks.on_sample_end(runner=self, samples=out)
        if self._output is not None:  # RunnerConfig(output=DIR): in finished files now
            self._output.write(out, agent_ids)
        return out

    def start_episode_ids_at(self, first: int) -> None:
        """Number the episodes this runner starts from ``first`` on (before it samples).

        Episode ids are ``worker_index << 40`` plus a counter by default; a runner that
        replaces a failed one uses this so it never reuses its predecessor's ids.
        """
        if self._stepper.poll_index:
            raise ValueError("start_episode_ids_at must be called before the first sample()")
        self._stepper._next_eps = int(first)

    def get_off_policy_metrics(self) -> list[dict[str, Any]]:
        """Off-policy estimates since the last call (and clear them): one record per policy
        and batch read from files, ``{"policy_id", "input", "is": {...}, "wis": {...}}``
        (see ``RunnerConfig.off_policy_estimation``)."""
        out, self._off_policy_metrics = self._off_policy_metrics, []
        return out

    def get_metrics(self) -> list[dict[str, Any]]:
        """Per-episode records since the last call (and clear them)."""
        out, self._metrics = self._metrics, []
        return out

    def perf_stats(self) -> dict[str, Any]:
        """Mean milliseconds per step in each stage, plus ``connectors``: ms per step by name."""
        stats = self.timers.means()
        conn: dict[str, float] = {}
        steps = max(self.timers.steps, 1)
        for pid, pipe in [*self._agent_pipes.items(), *self._action_pipes.items()]:
            prefix = "" if len(self.policies) == 1 else f"{pid}/"
            for name, ms in pipe.timings().items():
                calls = pipe._calls
                conn[prefix + name] = conn.get(prefix + name, 0.0) + ms * calls / steps
        stats["connectors"] = conn
        return stats

    def get_weights(self) -> dict[str, dict[str, np.ndarray]]:
        """Weights of every policy, by policy id."""
        return {pid: p.get_weights() for pid, p in self.policies.items()}

    def set_weights(self, weights: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Load weights by policy id (unknown ids are a ValueError)."""
        unknown = sorted(set(weights) - set(self.policies))
        if unknown:
            raise ValueError(
                f"weights for unknown policies {unknown}; known: {list(self.policies)}"
            )
        for pid, w in weights.items():
            self.policies[pid].set_weights(w)

    def get_connector_states(self) -> dict[str, dict[str, Any]]:
        """Connector statistics by policy id: ``{"agent": {...}, "action": {...}}``."""
        return {
            pid: {
                "agent": self._agent_pipes[pid].get_statistics(),
                "action": self._action_pipes[pid].get_statistics(),
            }
            for pid in self.policies
        }

    def set_connector_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Load what ``get_connector_states`` returned (e.g. merged filters from a driver)."""
        for pid, st in states.items():
            if pid not in self.policies:
                raise ValueError(f"connector state for unknown policy {pid!r}")
            self._agent_pipes[pid].set_statistics(st.get("agent", {}))
            self._action_pipes[pid].set_statistics(st.get("action", {}))

    def stop(self) -> None:
        """Stop the background sampler (if any) and close every sub-env."""
        if self._async is not None:
            self._async.stop()
        if not self._closed:
            self._closed = True
            self.env.close()

    close = stop

    def __enter__(self) -> EnvRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- checkpoints, inference, evaluation (rlconnect.runner.checkpoint / inference /
    #    evaluation hold the code) -----------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write policies (spec, weights) and pipelines (with statistics) atomically to the
        folder ``path`` (layout: ``rlconnect.runner.checkpoint_format``)."""
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
        kinds (``rc.register_policy``); ``config_overrides`` replace saved config fields."""
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
        and the action pipeline in eval mode (see ``rlconnect.runner.inference``)."""
        from rlconnect.runner.inference import compute_actions

        out = compute_actions(
            self, {agent_id: obs}, policy_id=policy_id, explore=explore, env_id=env_id
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
        from rlconnect.runner.inference import compute_actions

        return compute_actions(
            self, obs_by_agent, policy_id=policy_id, explore=explore, env_id=env_id
        )

    def evaluate(self, num_episodes: int = 10, *, env: Any = None) -> list[dict[str, Any]]:
        """Metric records of ``num_episodes`` whole episodes run in eval mode on separate
        sub-envs; nothing of them reaches training (see ``rlconnect.runner.evaluation``)."""
        from rlconnect.runner.evaluation import evaluate

        return evaluate(self, num_episodes, env=env)
