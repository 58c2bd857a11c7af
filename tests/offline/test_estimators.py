"""Off-policy estimation against cases with a known answer, with negative controls.

Data is recorded by a runner (``RunnerConfig(output=DIR)``) with a behaviour policy of
fixed action probabilities, read back with ``rc.read_batches`` and evaluated for a target
policy of other fixed probabilities, whose value is computed in closed form.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlconnect as rc
from rlconnect.offline import estimate_off_policy

OBS = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
ACT = gym.spaces.Discrete(2)


class FixedLogits(torch.nn.Module):
    """Action probabilities ``probs`` at every step (a stateless policy)."""

    def __init__(self, probs):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.log(torch.tensor(probs, dtype=torch.float32)))

    def forward(self, obs):
        return self.logits.expand(obs.shape[0], -1)


def fixed_policy(p0):
    return rc.TorchPolicy(FixedLogits([p0, 1 - p0]), OBS, ACT)


class Chain(gym.Env):
    """``steps`` decisions; step ``t`` pays ``rewards[t][action]`` (+ noise in the bandit)."""

    observation_space, action_space = OBS, ACT

    def __init__(self, rewards, noise=0.0):
        self.rewards, self.noise, self.t = np.asarray(rewards), noise, 0

    def _obs(self):
        return np.eye(2, dtype=np.float32)[min(self.t, 1)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        r = self.rewards[self.t][int(action)] + self.noise * self.np_random.standard_normal()
        self.t += 1
        return self._obs(), float(r), self.t >= len(self.rewards), False, {}


def true_value(rewards, p0, gamma):
    rewards = np.asarray(rewards)
    per_step = rewards[:, 0] * p0 + rewards[:, 1] * (1 - p0)
    return float((per_step * gamma ** np.arange(len(rewards))).sum())


def record(tmp_path, rewards, behaviour_p0, steps, noise=0.0):
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=100, seed=0, output=str(tmp_path))
    with rc.EnvRunner(
        lambda ctx: Chain(rewards, noise), fixed_policy(behaviour_p0), config=config
    ) as runner:
        for _ in range(steps):
            runner.sample()
    return list(rc.read_batches(tmp_path))


CASES = {
    # a two-armed bandit with noisy rewards
    "bandit": {"rewards": [[1.0, 0.0]], "gamma": 1.0, "noise": 0.5},
    # a two-step MDP with discounting: the arm that pays later is better
    "two_step": {"rewards": [[1.0, 0.0], [0.0, 2.0]], "gamma": 0.9, "noise": 0.0},
}


@pytest.mark.parametrize("case", list(CASES))
def test_estimators_match_the_known_value(tmp_path, case):
    c = CASES[case]
    behaviour_p0, target_p0 = 0.7, 0.2
    batches = record(tmp_path, c["rewards"], behaviour_p0, steps=8, noise=c["noise"])
    est = estimate_off_policy(batches, fixed_policy(target_p0), gamma=c["gamma"])
    want = true_value(c["rewards"], target_p0, c["gamma"])
    behaviour = true_value(c["rewards"], behaviour_p0, c["gamma"])
    assert abs(want - behaviour) > 0.3  # the two policies are far apart
    for name in ("is", "wis"):
        m = est[name]
        assert m["num_episodes"] >= 1000
        tol = max(4 * m["v_target_stderr"], 0.02)
        assert abs(m["v_target"] - want) < tol, (name, m, want)
        assert abs(m["v_behavior"] - behaviour) < 0.1
        assert m["v_gain"] == pytest.approx(m["v_target"] / m["v_behavior"])

    # negative control: with the behaviour's probabilities wrong (claimed to be the
    # target's), the ratios are all 1 and the estimate is the behaviour's value instead
    target = fixed_policy(target_p0)
    for b in batches:
        b["action_logp"] = np.log(np.where(b["actions"] == 0, target_p0, 1 - target_p0))
    wrong = estimate_off_policy(batches, target, gamma=c["gamma"])
    for name in ("is", "wis"):
        assert abs(wrong[name]["v_target"] - want) > 0.25
        assert abs(wrong[name]["v_target"] - behaviour) < 0.1


def test_callable_targets_and_errors():
    logged = rc.SampleBatch(
        {
            "eps_id": np.arange(4),
            "t": np.zeros(4, np.int64),
            "actions": np.array([0, 1, 0, 1]),
            "rewards": np.array([1.0, 0.0, 1.0, 0.0]),
            "action_logp": np.log(np.full(4, 0.5)),
            "terminateds": np.ones(4, bool),
            "truncateds": np.zeros(4, bool),
        }
    )
    always_0 = lambda b: np.where(b["actions"] == 0, 0.0, -np.inf)  # noqa: E731
    est = estimate_off_policy([logged], always_0)
    assert est["is"]["v_target"] == pytest.approx(1.0)
    assert est["wis"]["v_target"] == pytest.approx(1.0)
    del logged["action_logp"]
    with pytest.raises(ValueError, match="action_logp"):
        estimate_off_policy([logged], always_0)
    with pytest.raises(ValueError, match="unknown estimators"):
        estimate_off_policy([logged], always_0, estimators=["dr"])
    from rlconnect.offline.estimators import target_logp

    with pytest.raises(TypeError, match="log-probabilities"):
        target_logp(rc.RandomPolicy(OBS, ACT), logged)


def test_the_runner_reports_estimates_as_metrics_when_reading_files(tmp_path):
    rewards, gamma = [[1.0, 0.0]], 1.0
    record(tmp_path, rewards, behaviour_p0=0.3, steps=6, noise=0.5)
    target_p0 = 0.8
    config = rc.RunnerConfig(
        num_envs=4,
        rollout_fragment_length=100,
        seed=0,
        input=str(tmp_path),
        off_policy_estimation=("is", "wis"),
        off_policy_gamma=gamma,
    )
    runner = rc.EnvRunner(lambda ctx: Chain(rewards), fixed_policy(target_p0), config=config)
    for _ in range(3):
        runner.sample()
    records = runner.get_off_policy_metrics()
    assert len(records) == 3 and runner.get_off_policy_metrics() == []
    truth = true_value(rewards, target_p0, gamma)
    behaviour = true_value(rewards, 0.3, gamma)
    for name in ("is", "wis"):
        mean = np.mean([r[name]["v_target"] for r in records])
        assert abs(mean - truth) < 0.15
        assert abs(mean - behaviour) > 0.3  # negative control: not the behaviour's value
    assert {r["input"] for r in records} == {str(tmp_path)}


def test_estimation_config_is_validated():
    with pytest.raises(ValueError, match="needs input= files"):
        rc.RunnerConfig(off_policy_estimation=("is",))
    with pytest.raises(ValueError, match="unknown"):
        rc.RunnerConfig(input="x/*.parquet", off_policy_estimation=("dr",))
