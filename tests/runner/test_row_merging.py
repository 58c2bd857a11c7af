"""Rows kept in chunks and merged in bulk give the same batches however often they merge,
and episodes made after a poll's actions are those made before."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, EpisodeLog, TurnTakingEnv

import rlconnect as rc
from rlconnect.collectors import env_steps, store


def _run(env, policy_fn, samples: int, **cfg):
    callbacks = EpisodeLog()
    runner = rc.EnvRunner(env, policy_fn(), config=rc.RunnerConfig(**cfg), callbacks=callbacks)
    out = [runner.sample() for _ in range(samples)], runner.get_metrics(), callbacks.events
    runner.stop()
    return out


def _assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x.keys()) == list(y.keys())
        for k in x:
            if k == "infos":
                assert [dict(i) for i in x[k]] == [dict(i) for i in y[k]]
            else:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
                assert np.asarray(x[k]).dtype == np.asarray(y[k]).dtype, k
        assert x.meta.get("connector_state") == y.meta.get("connector_state")


def _cartpole_mlp():
    env = gym.make("CartPole-v1")
    return rc.MLPPolicy(env.observation_space, env.action_space, seed=3)


def _counter_random():
    env = CounterEnv()
    return rc.RandomPolicy(env.observation_space, env.action_space, seed=1)


def _stacked_random():
    obs = gym.spaces.Box(-1e6, 1e6, (2, 3), np.float32)
    return rc.RandomPolicy(obs, CounterEnv().action_space, seed=1)


CASES = {
    "cartpole-n1": ("CartPole-v1", _cartpole_mlp, {"num_envs": 1, "rollout_fragment_length": 300}),
    "cartpole-n5-filter": (
        "CartPole-v1",
        _cartpole_mlp,
        {
            "num_envs": 5,
            "rollout_fragment_length": 70,
            "observation_filter": "MeanStdFilter",
            "clip_rewards": 0.5,
            "keep_raw_obs": True,
            "record_env_actions": True,
        },
    ),
    "cartpole-agent-steps-greedy": (
        "CartPole-v1",
        _cartpole_mlp,
        {
            "num_envs": 4,
            "rollout_fragment_length": 40,
            "count_steps_by": "agent_steps",
            "explore": False,
        },
    ),
    "cartpole-complete": (
        "CartPole-v1",
        _cartpole_mlp,
        {"num_envs": 3, "rollout_fragment_length": 50, "batch_mode": "complete_episodes"},
    ),
    "counter-horizon": (
        lambda ctx: CounterEnv(length=7),
        _counter_random,
        {"num_envs": 4, "rollout_fragment_length": 9, "horizon": 4},
    ),
    "counter-truncating-framestack": (
        lambda ctx: CounterEnv(length=3, truncate=True),
        _stacked_random,
        {"num_envs": 2, "rollout_fragment_length": 5, "framestack": 2},
    ),
}


def _failing_sub_env(ctx):
    return CounterEnv(length=6, fail_at=17 if ctx.vector_index == 1 else None)


CASES["counter-failing-sub-env"] = (
    _failing_sub_env,
    _counter_random,
    {"num_envs": 3, "rollout_fragment_length": 8, "restart_failed_sub_environments": True},
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_merging_often_gives_the_same_batches(case, monkeypatch):
    """Chunks merged every 3 polls (many merges, mid-episode and across batches) give
    exactly the batches, metrics and callbacks of the default merging."""
    env, policy_fn, cfg = CASES[case]
    reference = _run(env, policy_fn, 4, seed=11, **cfg)
    monkeypatch.setattr(store, "MERGE_EVERY", 3)
    monkeypatch.setattr(env_steps, "MERGE_EVERY", 3)
    often = _run(env, policy_fn, 4, seed=11, **cfg)
    _assert_same_batches(often[0], reference[0])
    assert often[1] == reference[1]  # episode metrics
    assert often[2] == reference[2]  # callbacks, in order
    if "failing" in case:  # the faulty episode's rows were dropped from merged chunks
        assert any(m["episode_faulty"] for m in reference[1])


class _CreatedLog(EpisodeLog):
    """EpisodeLog that also logs ``on_episode_created``: the runner then makes a new
    episode's object before it acts on the poll, not after."""

    def on_episode_created(self, *, episode, env_index, **kwargs) -> None:
        self.events.append(("created", env_index, episode.episode_id))


def test_episodes_made_after_the_actions_equal_those_made_before():
    """One policy, one agent: new episodes' objects (and the mapping function's call) come
    after the poll's actions; batches, metrics, callbacks, mapping calls and the episodes
    postprocessing sees are those of the order with ``on_episode_created``."""
    seen: dict[str, list] = {"late": [], "early": []}

    class Post(rc.RandomPolicy):
        def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
            seen[self.mode].append((episode.episode_id, int(batch["eps_id"][0]), len(batch)))
            return batch

    def run(mode: str, callbacks: EpisodeLog):
        calls: list[int] = []

        def mapping(agent_id, episode, **kwargs):
            calls.append(episode.episode_id)
            return "default_policy"

        policy = Post(CounterEnv().observation_space, CounterEnv().action_space, seed=1)
        policy.mode = mode
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=6, seed=5)
        runner = rc.EnvRunner(lambda ctx: CounterEnv(length=4), policy, mapping, config, callbacks)
        out = [runner.sample() for _ in range(3)], runner.get_metrics(), calls
        runner.stop()
        return out

    late_log, log = EpisodeLog(), _CreatedLog()
    late, early = run("late", late_log), run("early", log)
    _assert_same_batches(late[0], early[0])
    assert late[1] == early[1] and late[1]
    assert late[2] == early[2] and len(late[2]) == len({*late[2]})  # once per episode
    assert [e for e in log.events if e[0] != "created"] == late_log.events
    created = [e[2] for e in log.events if e[0] == "created"]
    assert created == [e[2] for e in log.events if e[0] == "start"]
    assert (
        seen["late"] == seen["early"] and seen["late"] and all(a == b for a, b, _ in seen["late"])
    )


def _turn_taking(samples: int):
    env = TurnTakingEnv()
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    policies = {
        "pa": rc.RandomPolicy(space, act, seed=1),
        "pb": rc.RandomPolicy(space, act, seed=2),
    }
    config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=7, seed=0)
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        policies,
        lambda agent_id, episode, **kw: "pa" if agent_id == "a" else "pb",
        config=config,
    )
    out = [runner.sample() for _ in range(samples)], runner.get_metrics()
    runner.stop()
    return out


def test_multi_agent_rows_merged_often_give_the_same_batches(monkeypatch):
    """Agents joining, leaving and rewarded while not acting (closing rows recorded on
    their own): the same per-policy batches however often the chunks merge."""
    reference = _turn_taking(5)
    monkeypatch.setattr(store, "MERGE_EVERY", 2)
    monkeypatch.setattr(env_steps, "MERGE_EVERY", 2)
    often = _turn_taking(5)
    assert often[1] == reference[1]
    for a, b in zip(often[0], reference[0]):
        assert a.policy_batches.keys() == b.policy_batches.keys() == {"pa", "pb"}
        for pid in a.policy_batches:
            _assert_same_batches([a.policy_batches[pid]], [b.policy_batches[pid]])
