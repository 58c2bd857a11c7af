"""``runner.metrics()``: the window since the last call, fed from the episode records and
the timers, apart from ``get_metrics()``; and ``merge_metrics`` (issue 54)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, TurnTakingEnv

import rlconnect as rc
from rlconnect.runner.metrics import PerfTimers, RunMetrics, merge_metrics

PHASES = (
    "time/env",
    "time/agent_connectors",
    "time/inference",
    "time/action_connectors",
    "time/recording",
    "time/learner_connectors",
)


def cartpole_runner(**cfg):
    env = gym.make("CartPole-v1")
    base = {"num_envs": 4, "rollout_fragment_length": 50, "seed": 0}
    return rc.EnvRunner(
        "CartPole-v1",
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=rc.RunnerConfig(**{**base, **cfg}),
    )


def test_metrics_match_the_episode_records_and_leave_them_to_get_metrics():
    runner = cartpole_runner()
    runner.sample()
    runner.sample()
    m = runner.metrics()
    records = runner.get_metrics()  # metrics() took nothing from get_metrics()
    rets = [r["episode_reward"] for r in records]
    lens = [r["episode_length"] for r in records]
    assert records and m["num_episodes"] == len(records)
    assert m["episode_return_mean"] == pytest.approx(np.mean(rets))
    assert (m["episode_return_min"], m["episode_return_max"]) == (min(rets), max(rets))
    assert m["episode_len_mean"] == pytest.approx(np.mean(lens))
    assert m["env_steps"] == m["agent_steps"] == 400 and m["num_batches"] == 2
    assert m["policy/default_policy/episode_return_mean"] == m["episode_return_mean"]
    assert m["agent/agent0/num_episodes"] == len(records)
    assert all(isinstance(k, str) for k in m)
    assert json.loads(json.dumps(m, allow_nan=False)) == m
    # get_metrics() took nothing from metrics(): the next window has the next episodes only
    runner.sample()
    later = runner.get_metrics()
    m2 = runner.metrics()
    assert m2["num_episodes"] == len(later) and m2["env_steps"] == 200
    assert m2["env_steps_lifetime"] == 600
    assert m2["num_episodes_lifetime"] == len(records) + len(later)


def test_an_empty_window_has_counts_of_zero_and_no_returns():
    runner = cartpole_runner()
    runner.sample()
    runner.metrics()
    m = runner.metrics()
    assert m["env_steps"] == m["num_episodes"] == 0
    assert m["episode_return_mean"] is None and m["env_steps_per_second"] is None
    assert m["time/overhead_share"] == 0.0 and m["env_steps_lifetime"] == 200
    assert set(m) == set(runner.metrics())  # the same keys every time


class ScaledRewards(rc.LearnerConnector):
    """A learner connector that needs no value function (a column of scaled rewards)."""

    def __call__(self, batch: rc.SampleBatch, policy: rc.Policy) -> rc.SampleBatch:
        batch["scaled"] = batch["rewards"] * 2.0
        return batch


def test_the_time_ledger_adds_up_to_the_sampling_time():
    env = gym.make("CartPole-v1")
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=rc.RunnerConfig(num_envs=4, rollout_fragment_length=32, seed=0),
        learner_pipelines={"default_policy": lambda ctx: [ScaledRewards(ctx)]},
    )
    runner.sample()
    m = runner.metrics()
    for key in PHASES:
        assert m[key] > 0, key
    parts = sum(m[k] for k in PHASES) + m["time/other"]
    assert parts == pytest.approx(m["time/sample"])
    own = (m["time/recording"] + m["time/other"]) / m["time/sample"]
    assert m["time/overhead_share"] == pytest.approx(own)
    assert 0 < m["time/overhead_share"] < 1
    assert m["env_steps_per_second"] == pytest.approx(128 / m["time/sample"])
    # perf_stats names the new phase too
    assert runner.perf_stats()["mean_recording_ms"] > 0


def test_multi_agent_returns_per_policy_and_per_agent():
    env = TurnTakingEnv()
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        {"pa": rc.RandomPolicy(space, act), "pb": rc.RandomPolicy(space, act)},
        lambda agent_id, episode, **kw: "pa" if agent_id == "a" else "pb",
        config=rc.RunnerConfig(rollout_fragment_length=6, batch_mode="complete_episodes"),
    )
    batch = runner.sample()
    m = runner.metrics()
    # one episode: agent_rewards {("a", "pa"): 6, ("b", "pb"): 3, ("c", "pb"): 4}
    assert m["episode_return_mean"] == 13.0 and m["num_episodes"] == 1
    assert m["policy/pa/episode_return_mean"] == 6.0
    assert m["policy/pb/episode_return_mean"] == 7.0  # a policy's agents summed
    assert [m[f"agent/{a}/episode_return_mean"] for a in "abc"] == [6.0, 3.0, 4.0]
    assert m["env_steps"] == batch.env_steps() == 6
    assert m["agent_steps"] == batch.agent_steps() == 11
    json.dumps(m)
    runner.sample()
    later = runner.metrics()  # agents seen once keep their keys
    assert {k for k in m if k.startswith("agent/")} <= set(later)


def test_faulty_episodes_are_counted_apart():
    def make(ctx):
        return CounterEnv(length=5, fail_at=7 if ctx.vector_index == 0 else None)

    env = CounterEnv()
    cfg = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=10, seed=0, restart_failed_sub_environments=True
    )
    runner = rc.EnvRunner(
        make, rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    runner.sample()
    records = runner.get_metrics()
    m = runner.metrics()
    good = [r["episode_reward"] for r in records if not r["episode_faulty"]]
    assert m["num_faulty_episodes"] == 1
    assert m["num_episodes"] == len(good)
    assert m["episode_return_mean"] == pytest.approx(np.mean(good))


def _window(returns, lengths, env_steps, seconds, **extra):
    metrics = RunMetrics(["p"], PerfTimers())
    metrics.add_episodes(
        {
            "episode_reward": r,
            "episode_length": n,
            "agent_rewards": {("x", "p"): r},
            "episode_faulty": False,
        }
        for r, n in zip(returns, lengths)
    )
    metrics.add_batch(env_steps, env_steps)
    out = metrics.take()
    out.update({"time/sample": seconds, "time/recording": seconds / 4, **extra})
    out["env_steps_per_second"] = env_steps / seconds
    return out


def test_merge_weights_means_by_episodes_and_adds_counts():
    a = _window([1.0, 3.0], [10, 30], env_steps=100, seconds=1.0)
    b = _window([10.0], [40], env_steps=300, seconds=2.0)
    empty = _window([], [], env_steps=0, seconds=0.5)
    m = merge_metrics([a, b, empty], parallel=True)
    assert m["num_episodes"] == 3 and m["env_steps"] == 400
    assert m["episode_return_mean"] == pytest.approx(14.0 / 3)
    assert m["agent/x/episode_return_mean"] == pytest.approx(14.0 / 3)
    assert m["episode_len_mean"] == pytest.approx(80 / 3)
    assert (m["episode_return_min"], m["episode_return_max"]) == (1.0, 10.0)
    assert m["env_steps_per_second"] == pytest.approx(100 + 150 + 0)  # side by side
    assert m["time/overhead_share"] == pytest.approx(0.25)
    after = merge_metrics([a, b], parallel=False)  # one after the other
    assert after["env_steps_per_second"] == pytest.approx(400 / 3.0)
    assert after["env_steps_lifetime"] == b["env_steps_lifetime"]
    assert merge_metrics([empty], parallel=True)["episode_return_mean"] is None


def test_async_sampling_loses_no_episode_between_the_two_readers():
    runner = cartpole_runner(sample_async=True)
    records, counted, steps = [], 0, 0
    for _ in range(4):
        steps += len(runner.sample())
        records += runner.get_metrics()
        counted += runner.metrics()["num_episodes"]
    runner.stop()
    records += runner.get_metrics()
    last = runner.metrics()
    counted += last["num_episodes"]
    assert counted == len(records) == last["num_episodes_lifetime"] > 0
    assert last["env_steps_lifetime"] == steps == 800


class _FakeClock:
    """``time.perf_counter`` stand-in: time passes only when an env steps (1 s each)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("polls", [40, 3000])
def test_timings_of_a_share_of_polls_estimate_all_of_them(polls, monkeypatch):
    """The clock is read on the first polls and a weighted random eighth of the rest
    (``rlconnect._timing``): a short run is measured, a long one estimated within a few
    per cent; the phases never get time that was not spent."""
    import time

    import rlconnect.runner.kernel as kernel

    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(kernel, "_clock", clock)

    class SlowEnv(CounterEnv):
        def step(self, action):
            clock.now += 1.0
            return super().step(action)

    space = SlowEnv().observation_space
    runner = rc.EnvRunner(
        lambda ctx: SlowEnv(),
        rc.RandomPolicy(space, SlowEnv().action_space),
        config=rc.RunnerConfig(num_envs=1, rollout_fragment_length=polls, seed=0),
    )
    runner.sample()
    m = runner.metrics()
    steps = clock.now  # one env step per second: the env's true time
    assert m["time/sample"] == steps
    if polls <= 64:
        assert m["time/env"] == steps  # every poll timed
    else:
        assert m["time/env"] == pytest.approx(steps, rel=0.1), (m["time/env"], steps)
        assert m["time/env"] != steps  # (estimated: a share of polls was timed)
    assert m["time/inference"] == m["time/agent_connectors"] == m["time/recording"] == 0.0
    assert runner.perf_stats()["mean_env_wait_ms"] == pytest.approx(
        1000.0 * m["time/env"] / runner.timers.steps
    )
