"""Episodes that end at the same poll end together, each with its metric record, its
callback and its connectors' reset, in the order of its sub-env."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, EpisodeLog

import rlconnect as rc


class _ResetLog(rc.AgentConnector):
    """Passes rows through; records every per-episode reset it is told about."""

    def __init__(self, ctx, log: list[int]) -> None:
        super().__init__(ctx)
        self.log = log

    def __call__(self, data):
        return data

    def reset(self, env_id: int) -> None:
        self.log.append(env_id)


def _counter(ctx):
    return CounterEnv(length=3 + ctx.vector_index % 2)  # sub-envs 0, 2 (and 1, 3) end together


def _run(env, callbacks: bool, samples: int = 4, **cfg):
    log = EpisodeLog() if callbacks else None
    space = CounterEnv() if env is _counter else gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=12, seed=5, **cfg)
    runner = rc.EnvRunner(
        env,
        rc.RandomPolicy(space.observation_space, space.action_space, seed=2),
        config=config,
        callbacks=log,
    )
    resets: list[int] = []
    runner.agent_pipeline().append(_ResetLog(runner.agent_pipeline().ctx, resets))
    batches = [runner.sample() for _ in range(samples)]
    out = (batches, runner.get_metrics(), log.events if log else None, resets)
    runner.stop()
    return out


_ENVPOOL = pytest.param(
    "envpool:CartPole-v1",
    marks=pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="no envpool"),
)


@pytest.mark.parametrize("env", [_counter, "CartPole-v1", _ENVPOOL])
@pytest.mark.parametrize("callbacks", [False, True])
@pytest.mark.parametrize("cfg", [{}, {"horizon": 4}, {"batch_mode": "complete_episodes"}])
def test_episodes_ended_together_are_each_reported_and_reset(env, callbacks, cfg):
    batches, metrics, events, resets = _run(env, callbacks, **cfg)
    ended = [m["env_id"] for m in metrics]
    assert ended and resets == ended  # every ended episode's sub-env, in the order they ended
    if callbacks:  # one on_episode_end per metric record, in the same order, same totals
        ends = [e[1:] for e in events if e[0] == "end"]
        assert ends == [
            (m["env_id"], m["episode_id"], m["episode_length"], m["episode_reward"])
            for m in metrics
        ]
    lengths = {m["episode_id"]: m["episode_length"] for m in metrics}
    for b in batches:  # an episode's last step in a batch is its last step (t from 0)
        for eps, t, last in zip(b["eps_id"], b["t"], b["terminateds"] | b["truncateds"]):
            if last and int(eps) in lengths:
                assert t + 1 == lengths[int(eps)]
    if env is _counter and not cfg:  # several episodes end at one poll, in env order
        assert ended[:4] == [0, 2, 1, 3]
        assert [m["episode_length"] for m in metrics[:4]] == [3, 3, 4, 4]


def test_only_connectors_with_per_episode_state_are_reset():
    env = CounterEnv()
    stacked = gym.spaces.Box(-1e6, 1e6, (2, 3), np.float32)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, framestack=2)
    runner = rc.EnvRunner(CounterEnv, rc.RandomPolicy(stacked, env.action_space), config=config)
    resets = runner.pipelines.episode_resets()
    frame_stack = runner.agent_pipeline()["FrameStack"]
    assert [r.__self__ for r in resets] == [frame_stack]  # ConvertToNumpy keeps none
    runner.action_pipeline()[0].reset = lambda env_id: None  # patched on the instance: kept
    assert len(runner.pipelines.episode_resets()) == 2
    runner.stop()
