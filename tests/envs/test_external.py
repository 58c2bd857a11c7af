"""ExternalEnv: a simulator thread that asks for actions, sampled by the EnvRunner."""

from __future__ import annotations

import contextlib
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlconnect as rc
from rlconnect.envs import (
    BadObservationError,
    EpisodeError,
    ExternalEnv,
    ExternalMultiAgentEnv,
    TooManyEpisodesError,
    UnknownEpisodeError,
)
from rlconnect.errors import EnvError

OBS = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
ACT = gym.spaces.Discrete(3)
LOGGED = 2  # the action an off-policy step logs


def obs_of(ep: int, t: int, a: int) -> np.ndarray:
    return np.array([ep, t, a], np.float32)


class CounterSim(ExternalEnv):
    """Episodes of ``length`` steps; odd steps are logged (off-policy) with action 2.

    ``sent[ep]`` keeps what the simulator sent: (obs, action, reward, logged) per step.
    """

    def __init__(self, episodes=6, length=5, threads=1, off_policy=True, **kw) -> None:
        super().__init__(ACT, OBS, **kw)
        self.episodes, self.length, self.threads, self.off_policy = (
            episodes,
            length,
            threads,
            off_policy,
        )
        self.sent: dict[int, list] = {}

    def episode(self, ep: int) -> None:
        eid = self.start_episode()
        obs, steps = obs_of(ep, 0, -1), []
        for t in range(self.length):
            if self.off_policy and t % 2:
                a = LOGGED
                self.log_action(eid, obs, a)
            else:
                a = int(self.get_action(eid, obs))
            self.log_returns(eid, 0.5)
            self.log_returns(eid, 0.5 + a)  # summed until the next action
            steps.append((obs, a, 1.0 + a, self.off_policy and t % 2 == 1))
            obs = obs_of(ep, t + 1, a)
        self.end_episode(eid, obs)
        self.sent[ep] = [*steps, obs]

    def run(self) -> None:
        def work(k: int) -> None:
            with contextlib.suppress(EnvError):  # the runner stopped before all were sampled
                for ep in range(k, self.episodes, self.threads):
                    self.episode(ep)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(self.threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def make_runner(env, **cfg):
    policy = rc.MLPPolicy(OBS, ACT, seed=0)
    return rc.EnvRunner(lambda ctx: env, policy, config=rc.RunnerConfig(**cfg)), policy


def check_episode(batch: rc.SampleBatch, sent: list, policy=None) -> None:
    """Every row is exactly what the simulator sent (and log_action actions as given)."""
    steps, final = sent[:-1], sent[-1]
    assert len(batch) == len(steps)
    np.testing.assert_array_equal(batch["obs"], np.stack([s[0] for s in steps]))
    np.testing.assert_array_equal(batch["new_obs"][-1], final)
    np.testing.assert_array_equal(batch["new_obs"][:-1], batch["obs"][1:])
    np.testing.assert_array_equal(batch["actions"], [s[1] for s in steps])
    np.testing.assert_allclose(batch["rewards"], [s[2] for s in steps])
    assert batch["terminateds"].tolist() == [False] * (len(steps) - 1) + [True]
    assert not batch["truncateds"].any()
    if policy is not None:  # action_logp is the policy's log-prob of the recorded action
        logits = torch.as_tensor(batch["action_dist_inputs"])
        want = torch.log_softmax(logits, 1)[np.arange(len(batch)), batch["actions"]]
        np.testing.assert_allclose(batch["action_logp"], want.numpy(), rtol=1e-5, atol=1e-6)


def test_rows_match_what_the_simulator_sent_on_and_off_policy():
    env = CounterSim(episodes=6, length=5)
    runner, policy = make_runner(env, batch_mode="complete_episodes", rollout_fragment_length=30)
    batch = runner.sample()
    eps = batch.split_by_episode()
    assert len(eps) == 6
    for ep in eps:
        check_episode(ep, env.sent[int(ep["obs"][0, 0])], policy)
    logged = batch["obs"][:, 1] % 2 == 1
    assert (batch["actions"][logged] == LOGGED).all()
    metrics = runner.get_metrics()
    assert [m["episode_length"] for m in metrics] == [5] * 6
    runner.stop()


def test_logged_logp_differs_from_the_policys_own_sample():
    """Negative control: without the override, logged rows would keep the sampled logp."""
    env = CounterSim(episodes=8, length=4)
    runner, _ = make_runner(env, batch_mode="complete_episodes", rollout_fragment_length=32)
    batch = runner.sample()
    logged = batch["obs"][:, 1] % 2 == 1
    logits = torch.as_tensor(batch["action_dist_inputs"][logged])
    lp = torch.log_softmax(logits, 1)
    np.testing.assert_allclose(batch["action_logp"][logged], lp[:, LOGGED].numpy(), rtol=1e-5)
    assert not np.allclose(lp[:, 0].numpy(), lp[:, LOGGED].numpy())
    runner.stop()


@pytest.mark.parametrize("threads", [1, 4])
def test_truncate_mode_batches_have_exactly_fragment_steps(threads):
    env = CounterSim(episodes=12, length=5, threads=threads, max_concurrent=4)
    runner, policy = make_runner(env, rollout_fragment_length=7)
    batches = [runner.sample() for _ in range(8)]
    assert [len(b) for b in batches] == [7] * 8
    whole = rc.concat_samples(batches)
    for ep in whole.split_by_episode():
        if ep["terminateds"].any():
            check_episode(ep, env.sent[int(ep["obs"][0, 0])], policy)
    runner.stop()


def test_connectors_apply_to_external_rows_and_metrics_keep_env_rewards():
    env = CounterSim(episodes=4, length=3, off_policy=False)
    runner, _ = make_runner(
        env, batch_mode="complete_episodes", rollout_fragment_length=12, clip_rewards=1.0
    )
    batch = runner.sample()
    assert batch["rewards"].max() <= 1.0
    assert sum(m["episode_reward"] for m in runner.get_metrics()) == pytest.approx(
        sum(sum(s[2] for s in env.sent[e][:-1]) for e in range(4))
    )
    runner.stop()


class EvalSim(ExternalEnv):
    def run(self) -> None:
        for ep in range(4):
            training = ep % 2 == 0
            eid = self.start_episode(training_enabled=training)
            obs = obs_of(ep, 0, -1)
            for t in range(3):
                a = self.get_action(eid, obs)
                assert ACT.contains(int(a))
                self.log_returns(eid, 1.0)
                obs = obs_of(ep, t + 1, int(a))
            self.end_episode(eid, obs)


def test_episodes_without_training_are_served_but_not_recorded():
    env = EvalSim(ACT, OBS)
    runner, _ = make_runner(env, batch_mode="complete_episodes", rollout_fragment_length=6)
    batch = runner.sample()
    assert sorted(set(batch["obs"][:, 0].tolist())) == [0.0, 2.0]
    assert len(runner.get_metrics()) == 2
    runner.stop()


def test_episode_api_errors():
    env = ExternalEnv(ACT, OBS, max_concurrent=2)
    a = env.start_episode("a")
    with pytest.raises(EpisodeError, match="already in use"):
        env.start_episode("a")
    env.start_episode("b")
    with pytest.raises(TooManyEpisodesError, match="max_concurrent=2"):
        env.start_episode("c")
    with pytest.raises(UnknownEpisodeError, match="never started"):
        env.log_returns("zzz", 1.0)
    with pytest.raises(BadObservationError, match=r"shape \(2,\)"):
        env.log_action(a, np.zeros(2), 1)
    env.log_action(a, np.zeros(3), 1)
    env.end_episode(a, np.zeros(3))
    with pytest.raises(UnknownEpisodeError, match="has ended"):
        env.log_returns(a, 1.0)
    env.start_episode("c")  # a's slot is free again


class AbandonSim(ExternalEnv):
    def run(self) -> None:
        eid = self.start_episode("lost")
        for t in range(3):
            self.get_action(eid, obs_of(0, t, -1))
            self.log_returns(eid, 1.0)
        done = self.start_episode("done")  # nothing else is lost
        self.log_action(done, obs_of(1, 0, -1), 0)
        self.end_episode(done, obs_of(1, 1, 0))


def test_abandoned_episode_is_closed_truncated_after_the_timeout():
    env = AbandonSim(ACT, OBS, episode_timeout_s=0.3)
    runner, _ = make_runner(env, batch_mode="complete_episodes", rollout_fragment_length=4)
    batch = runner.sample()
    eps = {int(ep["obs"][0, 0]): ep for ep in batch.split_by_episode()}
    assert set(eps) == {0, 1}
    lost = eps[0]
    assert len(lost) == 3 and lost["truncateds"].tolist() == [False, False, True]
    assert not lost["terminateds"].any()
    assert lost["infos"][-1]["episode_timeout"] is True
    np.testing.assert_array_equal(lost["new_obs"][-1], lost["obs"][-1])
    assert env.timed_out_episodes == ["lost"]
    assert eps[1]["terminateds"].tolist() == [True]
    runner.stop()


class CrashSim(ExternalEnv):
    def run(self) -> None:
        raise RuntimeError("simulator crashed")


def test_a_crashing_simulator_fails_sample_with_its_error():
    runner, _ = make_runner(CrashSim(ACT, OBS))
    with pytest.raises(EnvError, match="simulator crashed"):
        runner.sample()


def test_external_env_needs_one_env():
    with pytest.raises(ValueError, match="num_envs=1"):
        make_runner(CounterSim(), num_envs=2)


class TwoAgentSim(ExternalMultiAgentEnv):
    """``a`` acts every step, ``b`` every second; ``b`` is rewarded every step."""

    def run(self) -> None:
        for ep in range(3):
            eid = self.start_episode()
            for t in range(4):
                obs = {"a": obs_of(ep, t, 0)}
                if t % 2 == 0:
                    obs["b"] = obs_of(ep, t, 1)
                if t == 1:
                    self.log_action(eid, obs, {"a": LOGGED})
                else:
                    acts = self.get_action(eid, obs)
                    assert set(acts) == set(obs)
                self.log_returns(eid, {"a": 1.0, "b": 10.0})
            self.end_episode(eid, {"a": obs_of(ep, 4, 0), "b": obs_of(ep, 4, 1)})


def test_multi_agent_external_env():
    env = TwoAgentSim(ACT, OBS, max_concurrent=2)
    policy = rc.MLPPolicy(OBS, ACT, seed=0)
    runner = rc.EnvRunner(
        env,
        {"pa": policy, "pb": rc.MLPPolicy(OBS, ACT, seed=1)},
        policy_mapping_fn=lambda agent, episode, **kw: "p" + agent,
        config=rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=12),
    )
    batch = runner.sample()
    assert isinstance(batch, rc.MultiAgentBatch)
    a, b = batch.policy_batches["pa"], batch.policy_batches["pb"]
    assert len(a) == 12 and len(b) == 6
    np.testing.assert_allclose(a["rewards"], 1.0)
    np.testing.assert_allclose(b["rewards"], 20.0)  # b's two steps of reward per action
    assert (a["actions"][a["obs"][:, 1] == 1] == LOGGED).all()
    assert b["terminateds"].tolist() == [False, True] * 3
    assert [m["agent_rewards"][("b", "pb")] for m in runner.get_metrics()] == [40.0] * 3
    runner.stop()


class FakeInference:
    """A ``ServedInference`` that records what the env asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def compute_actions(self, obs_by_agent, *, explore, env_id):
        self.calls.append(
            ("act", {a: o.tolist() for a, o in obs_by_agent.items()}, explore, env_id)
        )
        return dict.fromkeys(obs_by_agent, 1)

    def reset(self, env_id):
        self.calls.append(("reset", env_id))


class UntrainedSim(ExternalEnv):
    """One episode that is served but not recorded; ``got`` keeps its answer."""

    got: list

    def run(self) -> None:
        eid = self.start_episode("eval", training_enabled=False)
        try:
            self.got.append(self.get_action(eid, np.ones(3, np.float32)))
        except EnvError as exc:
            self.got.append(exc)
        self.end_episode(eid, np.zeros(3, np.float32))


def _drive(inference: FakeInference | None) -> UntrainedSim:
    """An UntrainedSim whose adapter is polled (as a runner would) until its run() ends."""
    env = UntrainedSim(ACT, OBS)
    env.got = []
    adapter = rc.envs.ExternalEnvAdapter(env)
    if inference is not None:
        adapter.attach_inference(inference)
    with contextlib.suppress(EnvError):  # raised once run() has returned
        while True:
            adapter.poll()
    env.join()
    return env


def test_untrained_episodes_ask_the_attached_inference_not_the_runner():
    """The adapter hands its work the ``ServedInference`` it was attached: served actions in
    eval mode under the episode's own env id, and that id's reset when the episode ends."""
    inference = FakeInference()
    assert _drive(inference).got == [1]
    assert inference.calls == [
        ("act", {rc.DEFAULT_AGENT_ID: [1.0, 1.0, 1.0]}, False, -2),
        ("reset", -2),
    ]


def test_an_adapter_no_runner_drives_cannot_serve_untrained_episodes():
    (got,) = _drive(None).got
    assert isinstance(got, EnvError) and "no runner drives this ExternalEnv" in str(got)


@pytest.mark.parametrize("reward", [True, "1.5", np.array(["2"]), 10**400, None, [1.0, 2.0]])
def test_a_reward_must_be_a_real_number(reward):
    """Numpy reads ``True`` and ``"1.5"`` as numbers; an episode's reward is never one."""
    env = ExternalEnv(ACT, OBS)
    eid = env.start_episode()
    with pytest.raises(rc.envs.BadRewardError, match="is not a number"):
        env.log_returns(eid, reward)
    env.log_returns(eid, np.array([7], np.uint64))  # a size-one array of a number is one
    env.log_returns(eid, 10**30)


def test_multi_agent_calls_are_checked_whole_before_anything_is_kept():
    env = TwoAgentSim(ACT, OBS)
    eid = env.start_episode()
    with pytest.raises(EpisodeError, match="observations must be a non-empty dict"):
        env.log_action(eid, [np.zeros(3)], {"a": 0})
    with pytest.raises(EpisodeError, match="one action per observing agent"):
        env.log_action(eid, {"a": np.zeros(3)}, {"b": 0})
    with pytest.raises(EpisodeError, match="the info of agent 'a' must be a dict, got int"):
        env.log_returns(eid, {"a": 1.0}, {"a": 5})
    with pytest.raises(EpisodeError, match="rewards must be a non-empty dict"):
        env.log_returns(eid, 1.0)
    env.log_action(eid, {"a": np.zeros(3)}, {"a": 0})
    assert env.hub.queued == 1  # only the good call was queued
