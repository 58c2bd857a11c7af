"""Env adapters come from a registry a user's own env type can join."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.envs import EnvSettings, GymEnvs, make_base_env, register_env_adapter
from rlconnect.envs import make as make_module


@pytest.fixture(autouse=True)
def _no_leftover_registrations():
    before = list(make_module._REGISTERED)
    yield
    make_module._REGISTERED[:] = before


class Simulator:
    """A user's own simulator type, neither gymnasium nor rlconnect."""

    def __init__(self, level: int) -> None:
        self.level = level


class SimulatorEnv(gym.Env):
    observation_space = gym.spaces.Box(-1e3, 1e3, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, level: int) -> None:
        self.level, self.t = level, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.array([self.level], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.level], np.float32), float(self.level), self.t >= 3, False, {}


def simulator_adapter(sim: Simulator, settings: EnvSettings) -> rc.BaseEnv:
    def creator(ctx: rc.EnvContext) -> gym.Env:
        return SimulatorEnv(sim.level + ctx.vector_index)

    return GymEnvs(creator, settings.num_envs, seed=settings.seed)


def test_a_user_type_joins_and_the_runner_uses_it():
    with pytest.raises(TypeError, match="register_env_adapter"):
        make_base_env(Simulator(5))
    register_env_adapter(Simulator, simulator_adapter)
    env = make_base_env(Simulator(5), num_envs=2, seed=0)
    assert isinstance(env, GymEnvs) and env.num_envs == 2
    policy = rc.RandomPolicy(SimulatorEnv.observation_space, SimulatorEnv.action_space, seed=0)
    runner = rc.EnvRunner(
        Simulator(5), policy, config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=3)
    )
    batch = runner.sample()
    assert sorted(set(batch["rewards"].tolist())) == [5.0, 6.0]  # sub-envs 0 and 1


def test_a_predicate_can_take_over_a_kind_rlconnect_knows():
    seen: list[tuple[str, int]] = []

    def from_prefixed_id(env_id: str, settings: EnvSettings) -> rc.BaseEnv:
        seen.append((env_id, settings.num_envs))
        return make_base_env(env_id.removeprefix("mine:"), num_envs=settings.num_envs)

    register_env_adapter(
        lambda env: isinstance(env, str) and env.startswith("mine:"), from_prefixed_id
    )
    env = make_base_env("mine:CartPole-v1", num_envs=2)
    assert isinstance(env, GymEnvs) and seen == [("mine:CartPole-v1", 2)]
    make_base_env("CartPole-v1")  # other ids still take the built-in route
    assert len(seen) == 1


def test_the_latest_registration_wins():
    register_env_adapter(Simulator, lambda sim, s: "first")
    register_env_adapter(Simulator, lambda sim, s: "second")
    assert make_base_env(Simulator(0)) == "second"


def test_a_bad_registration_is_refused():
    with pytest.raises(TypeError, match="register_env_adapter"):
        register_env_adapter(Simulator, "not a factory")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="register_env_adapter"):
        register_env_adapter(3, simulator_adapter)  # type: ignore[arg-type]
