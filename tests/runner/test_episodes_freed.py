"""Ended episodes: freed once their rows are handed out, and cheap for the garbage collector
meanwhile."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym

import rlconnect as rc


def _cartpole_runner(callbacks: rc.Callbacks, fragment: int) -> rc.EnvRunner:
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=fragment, seed=0)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    return rc.EnvRunner("CartPole-v1", policy, config=config, callbacks=callbacks)


class _Ended(rc.Callbacks):
    """Weak references to every ended episode, per batch."""

    def __init__(self) -> None:
        self.refs: list[list[weakref.ref]] = [[]]

    def on_episode_end(self, *, episode, **kwargs) -> None:
        self.refs[-1].append(weakref.ref(episode))


def test_a_runner_frees_its_old_episodes():
    """The episodes of early batches go once their rows are handed out: nothing piles up."""
    ended = _Ended()
    runner = _cartpole_runner(ended, fragment=25)
    for _ in range(30):
        runner.sample()
        ended.refs.append([])
    runner.get_metrics()
    gc.collect()
    early = [r for refs in ended.refs[:20] for r in refs]
    assert early and all(r() is None for r in early)  # episodes of early batches: freed
    runner.stop()


class _Rewards(rc.Callbacks):
    """Each ended episode's ``agent_rewards`` dict, as the callback sees it."""

    def __init__(self) -> None:
        self.dicts: list[dict] = []

    def on_episode_end(self, *, episode, **kwargs) -> None:
        self.dicts.append(episode.agent_rewards)


def test_single_agent_reward_records_are_not_followed_by_the_garbage_collector():
    """Each ended episode's reward dicts (its own and its metric record's) use one shared
    ``(agent, policy)`` key: once the collector has seen that key's tuple hold only
    strings, the dicts are untracked, and a long run's records cost its passes nothing."""
    rewards = _Rewards()
    runner = _cartpole_runner(rewards, fragment=40)
    runner.sample()
    gc.collect()
    start = len(rewards.dicts)
    for _ in range(3):
        runner.sample()
    late, records = rewards.dicts[start:], runner.get_metrics()[-5:]
    assert late and records and all(len(r["agent_rewards"]) == 1 for r in records)
    assert not any(gc.is_tracked(d) for d in late)
    assert not any(gc.is_tracked(r["agent_rewards"]) for r in records)
    runner.stop()
