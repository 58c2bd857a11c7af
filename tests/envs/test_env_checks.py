"""check_env: bad observations from gymnasium envs are named by env id, agent id and field."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc


class BadObsEnv(gym.Env):
    """A uint8 image-like obs in [0, 200]; ``bad`` decides what goes wrong and when."""

    observation_space = gym.spaces.Box(0, 200, (3, 2), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bad: str | None = None, at_step: int = 2) -> None:
        self.bad, self.at_step, self.t = bad, at_step, 0

    def _obs(self) -> np.ndarray:
        obs = np.full((3, 2), self.t % 50, np.uint8)
        if self.bad is None or self.t != self.at_step:
            return obs
        if self.bad == "shape":
            return np.zeros((3, 3), np.uint8)
        if self.bad == "scalar":
            return np.uint8(1)  # would broadcast silently into a (3, 2) slot
        if self.bad == "dtype":
            return obs.astype(np.float32) + 0.5  # floats for an integer space
        if self.bad == "bounds":
            obs[1, 0] = 201
            return obs
        raise AssertionError(self.bad)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 20, False, {}


def sample_with(make, n=3, **cfg):
    policy = rc.RandomPolicy(BadObsEnv.observation_space, BadObsEnv.action_space)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=10, seed=0, **cfg)
    runner = rc.EnvRunner(make, policy, config=config)
    return runner.sample()


EXPECTED = {
    "shape": r"obs does not fit .*agent0'?: wrong shape \(3, 3\)",
    "scalar": r"obs does not fit .*agent0'?: wrong shape \(\)",
    "dtype": r"obs does not fit .*agent0'?: wrong dtype float32",
    "bounds": r"obs: values outside \[0, 200\] \(e\.g\. 201\)",
}


@pytest.mark.parametrize("bad", sorted(EXPECTED))
@pytest.mark.parametrize("at_step", [0, 2])  # in the reset obs, or a step's
def test_one_bad_sub_env_is_named(bad, at_step):
    def make(ctx):
        return BadObsEnv(bad if ctx.vector_index == 1 else None, at_step)

    with pytest.raises(rc.EnvCheckError, match=EXPECTED[bad]) as info:
        sample_with(make)
    msg = str(info.value)
    assert "env 1 / agent 'agent0'" in msg and "obs" in msg
    assert "env 0 /" not in msg and "env 2 /" not in msg


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_a_bad_sub_env_in_a_worker_is_named_by_its_global_index(bad):
    """A worker's dense poll checks what its sub-envs return as the runner's process does,
    and names the sub-env by its index in the runner (the worker holds sub-envs 2 and 3)."""

    def make(ctx):
        return BadObsEnv(bad if ctx.vector_index == 3 else None, 2)

    with pytest.raises(rc.EnvCheckError, match=EXPECTED[bad]) as info:
        sample_with(make, n=4, num_env_workers=2)
    msg = str(info.value)
    assert "env 3 / agent 'agent0'" in msg
    assert "env 1 /" not in msg and "env 2 /" not in msg


@pytest.mark.parametrize("bad", sorted(EXPECTED))
def test_every_sub_env_bad(bad):
    with pytest.raises(rc.EnvCheckError, match=EXPECTED[bad]) as info:
        sample_with(lambda ctx: BadObsEnv(bad), n=2)
    msg = str(info.value)
    assert "env 0 / agent 'agent0'" in msg and "env 1 / agent 'agent0'" in msg and "obs" in msg


def test_a_gym_id_with_a_wrong_observation_is_caught():
    class Shifted(gym.ObservationWrapper):
        def observation(self, obs):
            return obs + np.float32(1e9) * (obs[0] > 0)  # far outside the position bounds

    def make(ctx):
        return Shifted(gym.make("CartPole-v1"))

    env = make(None)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    runner = rc.EnvRunner(make, policy, config=rc.RunnerConfig(num_envs=2, seed=1))
    with pytest.raises(rc.EnvCheckError, match=r"obs: values outside the bounds .*agent0"):
        runner.sample()


def test_good_envs_pass_and_casts_within_a_kind_are_fine():
    class Float64Env(BadObsEnv):
        observation_space = gym.spaces.Box(0, 200, (3, 2), np.float32)

        def _obs(self):
            return super()._obs().astype(np.float64)  # float64 for a float32 space: cast

    policy = rc.RandomPolicy(Float64Env.observation_space, Float64Env.action_space)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0)
    batch = rc.EnvRunner(lambda ctx: Float64Env(), policy, config=config).sample()
    assert batch["obs"].dtype == np.float32 and batch["obs"].shape == (20, 3, 2)
    assert len(sample_with(lambda ctx: BadObsEnv())) == 30


def test_check_env_false_skips_the_checks():
    batch = sample_with(lambda ctx: BadObsEnv("bounds"), n=2, check_env=False)
    assert batch["obs"].max() == 201
