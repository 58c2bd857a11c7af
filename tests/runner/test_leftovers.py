"""What building a batch leaves to free is let go of a few items per poll, never piling up."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym

import rlconnect as rc
from rlconnect.runner.leftovers import Leftovers


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


def test_a_runner_frees_its_old_episodes_and_blocks_a_few_per_poll():
    env = gym.make("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=4, rollout_fragment_length=25, seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1", rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    leftovers = runner._kernel.recorder.leftovers
    assert not leftovers.hold  # gymnasium envs: freed at once, as EnvPool's are not
    leftovers.hold = True
    runner.sample()
    early = [weakref.ref(ep) for _, ep in runner._kernel.trajectories._owners.values()]
    sizes = []
    for _ in range(30):
        runner.sample()
        sizes.append(len(leftovers))
    runner.get_metrics()
    runner.stop()
    gc.collect()
    assert early and all(r() is None for r in early)  # episodes of the first batch: freed
    assert max(sizes) < 600  # a batch leaves ~200 items: they do not pile up
