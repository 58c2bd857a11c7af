"""What building a batch leaves (ended episodes) is freed: nothing piles up over batches."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym

import rlconnect as rc


class _Ended(rc.Callbacks):
    """Weak references to every ended episode, per batch."""

    def __init__(self) -> None:
        self.refs: list[list[weakref.ref]] = [[]]

    def on_episode_end(self, *, episode, **kwargs) -> None:
        self.refs[-1].append(weakref.ref(episode))


def test_a_runner_frees_its_old_episodes():
    """The episodes of early batches go once their rows are handed out: nothing piles up."""
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=4, rollout_fragment_length=25, seed=0)
    ended = _Ended()
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=cfg,
        callbacks=ended,
    )
    for _ in range(30):
        runner.sample()
        ended.refs.append([])
    runner.get_metrics()
    gc.collect()
    early = [r for refs in ended.refs[:20] for r in refs]
    assert early and all(r() is None for r in early)  # episodes of early batches: freed
    runner.stop()
