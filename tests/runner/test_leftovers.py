"""What building a batch leaves to free is let go of a few items per poll, never piling up."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym
import pytest

import rlconnect as rc
from rlconnect.runner.leftovers import Leftovers
from rlconnect.testing import recording


class _Thing:
    pass


def test_release_lets_go_of_a_share_of_what_is_held():
    held = Leftovers(per_poll=4)
    things = [_Thing() for _ in range(100)]
    refs = [weakref.ref(t) for t in things]
    held.put(things)
    del things
    held.release()
    assert len(held) == 96  # 4 (a 32nd of 100 is less)
    held.put([_Thing() for _ in range(1000)])
    held.release()
    assert len(held) == 1096 - 34  # a 32nd of 1096
    for _ in range(200):
        held.release()
    assert len(held) == 0
    assert all(r() is None for r in refs)  # held only there: freed
    passing = Leftovers(hold=False)
    passing.put([_Thing()])
    assert len(passing) == 0


class _Ended(rc.Callbacks):
    """Weak references to every ended episode, per batch."""

    def __init__(self) -> None:
        self.refs: list[list[weakref.ref]] = [[]]

    def on_episode_end(self, *, episode, **kwargs) -> None:
        self.refs[-1].append(weakref.ref(episode))


@pytest.mark.parametrize("steps_while_recording", [False, True])
def test_a_runner_frees_its_old_episodes(steps_while_recording):
    """Held a few per poll (an env stepping while the runner records) or freed at once,
    the episodes of early batches go: nothing piles up."""
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=4, rollout_fragment_length=25, seed=0)
    ended = _Ended()
    with recording(steps_while_recording=steps_while_recording):
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
