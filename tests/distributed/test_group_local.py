"""RunnerGroup with num_runners=0: the local runner samples and Ray is never imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import gymnasium as gym
import rlconnect as rc
from rlconnect.distributed import RunnerGroup
env = gym.make("CartPole-v1")
policy = rc.RandomPolicy(env.observation_space, env.action_space)
config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=4, seed=0)
group = RunnerGroup("CartPole-v1", policy, config=config, num_runners=0)
assert len(group.sample()) == 8
assert [len(b) for b in group.sample_async(num_batches=2)] == [8, 8]
group.sync_connector_states()
assert group.foreach_runner(lambda r: r.num_envs) == [2]
group.stop()
print("ray" in sys.modules)
"""


def test_zero_runners_sample_locally_without_importing_ray():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_bad_num_runners_is_a_named_error():
    import gymnasium as gym

    import rlconnect as rc
    from rlconnect.distributed import RunnerGroup

    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="num_runners"):
        RunnerGroup("CartPole-v1", policy, num_runners=-1)
    with pytest.raises(ValueError, match="max_runner_restarts"):
        RunnerGroup("CartPole-v1", policy, max_runner_restarts=-2)
