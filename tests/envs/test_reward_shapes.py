"""Rewards of other shapes: an array of size one is taken as its scalar,
anything else raises ``rc.EnvCheckError`` naming the sub-env, the field and the agent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class WrappedReward(gym.Env):
    """Rewards ``shape_of(t)``-shaped arrays holding ``t`` (t = step in the episode)."""

    observation_space = BOX
    action_space = gym.spaces.Discrete(2)

    def __init__(self, shape: tuple[int, ...] = (1,), *, bad_at: int | None = None) -> None:
        self.shape, self.bad_at, self.t = shape, bad_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        shape = (3,) if self.t == self.bad_at else self.shape
        return np.zeros(2, np.float32), np.full(shape, float(self.t)), self.t >= 4, False, {}


def _runner(env, *, num_envs: int = 1, **cfg) -> rc.EnvRunner:
    policy = rc.RandomPolicy(BOX, gym.spaces.Discrete(2), seed=0)
    config = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=8, seed=0, **cfg)
    return rc.EnvRunner(env, policy, config=config)


# 3: the dense fast path; 1: one sub-env; workers: checked in the worker's dense poll
CASES = [{"num_envs": 1}, {"num_envs": 3}, {"num_envs": 3, "num_env_workers": 1}]


@pytest.mark.parametrize("cfg", CASES)
@pytest.mark.parametrize("shape", [(1,), (1, 1), ()])
def test_size_one_rewards_are_scalars(cfg: dict, shape: tuple[int, ...]):
    num_envs = cfg["num_envs"]
    runner = _runner(lambda ctx: WrappedReward(shape), **cfg)
    batch = runner.sample()
    assert batch["rewards"].shape == (8 * num_envs,)
    # every episode is t = 1..4: each row's reward is its step in the episode
    assert sorted(set(batch["rewards"].tolist())) == [1.0, 2.0, 3.0, 4.0]
    assert [m["episode_reward"] for m in runner.get_metrics()] == [10.0] * (2 * num_envs)


@pytest.mark.parametrize("cfg", CASES)
def test_other_reward_shapes_name_the_sub_env_and_field(cfg: dict):
    num_envs = cfg["num_envs"]

    def make(ctx: rc.EnvContext) -> gym.Env:
        return WrappedReward(bad_at=2 if ctx.vector_index == num_envs - 1 else None)

    with pytest.raises(rc.EnvCheckError) as err:
        _runner(make, **cfg).sample()
    text = str(err.value)
    assert f"env {num_envs - 1} /" in text and "reward" in text and "shape (3,)" in text


def test_a_bad_reward_with_restarts_drops_the_episode():
    made = []

    def make(ctx: rc.EnvContext) -> gym.Env:
        made.append(ctx.vector_index)
        return WrappedReward(bad_at=3 if made.count(0) == 1 and ctx.vector_index == 0 else None)

    runner = _runner(make, num_envs=2, restart_failed_sub_environments=True)
    batch = runner.sample()
    assert len(batch) == 16 and made.count(0) == 2  # sub-env 0 was rebuilt once
    metrics = runner.get_metrics()
    faulty = [m for m in metrics if m["episode_faulty"]]
    assert [(m["env_id"], m["episode_length"]) for m in faulty] == [(0, 2)]
    assert all(m["episode_reward"] == 10.0 for m in metrics if not m["episode_faulty"])


class TwoAgents(rc.MultiAgentEnv):
    """Agents "a" and "b"; "b" is rewarded without an observation at step 2."""

    possible_agents = ["a", "b"]

    def __init__(self, shape: tuple[int, ...] = (1,)) -> None:
        self.observation_spaces = dict.fromkeys(self.possible_agents, BOX)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.shape, self.t = shape, 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}, {}

    def step(self, actions):
        self.t += 1
        done = self.t >= 3
        obs = {"a": np.zeros(2, np.float32)}
        if self.t != 2:
            obs["b"] = np.zeros(2, np.float32)
        rewards = {"a": np.full(self.shape, 1.0), "b": np.full(self.shape, 2.0)}
        flags = {"__all__": done}
        return obs, rewards, flags, {"__all__": False}, {}


def _ma_runner(shape: tuple[int, ...]) -> rc.EnvRunner:
    policy = rc.RandomPolicy(BOX, gym.spaces.Discrete(2), seed=0)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=6, seed=0)
    return rc.EnvRunner(
        lambda ctx: TwoAgents(shape),
        {"shared": policy},
        config=config,
        policy_mapping_fn=lambda agent_id, episode, **kw: "shared",
    )


def test_multi_agent_size_one_rewards_are_scalars():
    runner = _ma_runner((1,))
    batch = runner.sample().policy_batches["shared"]
    by_agent = {a: batch["rewards"][batch["agent_index"] == i].tolist() for i, a in enumerate("ab")}
    assert set(by_agent["a"]) == {1.0}
    # "b": rewarded at step 2 without an observation, so its last row holds both rewards
    assert sorted(set(by_agent["b"])) == [2.0, 4.0]
    first = runner.get_metrics()[0]
    assert first["agent_rewards"] == {("a", "shared"): 3.0, ("b", "shared"): 6.0}


def test_multi_agent_other_reward_shapes_name_env_agent_and_field():
    with pytest.raises(rc.EnvCheckError) as err:
        _ma_runner((2,)).sample()
    text = str(err.value)
    assert "env 0 / agent 'a'" in text and "reward" in text and "shape (2,)" in text


class ColumnRewards(gym.vector.VectorWrapper):
    """A vector env whose rewards come as a ``(N, k)`` column block."""

    def __init__(self, env: gym.vector.VectorEnv, k: int) -> None:
        super().__init__(env)
        self.k = k

    def step(self, actions):
        obs, rew, term, trunc, info = self.env.step(actions)
        return obs, np.repeat(np.asarray(rew)[:, None], self.k, axis=1), term, trunc, info


def _venv(k: int) -> gym.vector.VectorEnv:
    inner = gym.vector.SyncVectorEnv([lambda: WrappedReward(())] * 2)
    return ColumnRewards(inner, k)


def test_vector_env_column_rewards_are_scalars():
    runner = _runner(_venv(1), num_envs=2)
    batch = runner.sample()
    assert batch["rewards"].shape == (16,)
    assert sorted(set(batch["rewards"].tolist())) == [1.0, 2.0, 3.0, 4.0]
    assert [m["episode_reward"] for m in runner.get_metrics()] == [10.0] * 4


def test_vector_env_other_reward_shapes_name_the_sub_env_and_field():
    with pytest.raises(rc.EnvCheckError) as err:
        _runner(_venv(2), num_envs=2).sample()
    assert "env 0 /" in str(err.value) and "reward" in str(err.value)


class ArrayRewardSim(rc.ExternalEnv):
    """Logs each step's reward as two size-one arrays; then one of shape (2,)."""

    def __init__(self) -> None:
        super().__init__(gym.spaces.Discrete(2), BOX, max_concurrent=1)
        self.refused: list[str] = []

    def run(self) -> None:
        for _ in range(2):
            eid = self.start_episode()
            for _ in range(3):
                self.get_action(eid, np.zeros(2, np.float32))
                self.log_returns(eid, np.array([1.5]))
                self.log_returns(eid, np.float32(0.5))
            try:
                self.log_returns(eid, np.ones(2))
            except rc.envs.EpisodeError as exc:
                self.refused.append(str(exc))
            self.end_episode(eid, np.zeros(2, np.float32))


def test_external_env_rewards_of_size_one_add_up_and_others_are_named():
    sim = ArrayRewardSim()
    policy = rc.RandomPolicy(BOX, gym.spaces.Discrete(2), seed=0)
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=6)
    runner = rc.EnvRunner(lambda ctx: sim, policy, config=config)
    try:
        batch = runner.sample()
    finally:
        runner.stop()
    assert batch["rewards"].tolist() == [2.0] * 6
    assert len(sim.refused) == 2 and "is not a number or an array of size one" in sim.refused[0]
