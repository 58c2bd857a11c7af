"""RunnerConfig(input=...): mixing sources, shuffling, postprocessing, connectors."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _record(path, steps=4, seed=0, **cfg):
    env = gym.make("CartPole-v1")
    config = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=25, seed=seed, output=str(path), **cfg
    )
    with rc.EnvRunner(
        "CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space), config=config
    ) as runner:
        written = [runner.sample() for _ in range(steps)]
    return rc.concat_samples(written)


def _reader(input_spec, policy=None, **cfg):
    config = rc.RunnerConfig(
        num_envs=1, rollout_fragment_length=10, seed=3, input=input_spec, **cfg
    )
    return rc.EnvRunner(
        "CartPole-v1", policy or rc.MLPPolicy(OBS, gym.spaces.Discrete(2)), config=config
    )


def test_mixed_input_follows_its_probabilities(tmp_path):
    _record(tmp_path / "a")
    spec = {"sampler": 0.3, str(tmp_path / "a"): 0.7}
    with _reader(spec) as runner:
        sources = [runner.sample().meta["input"] for _ in range(600)]
    share = sources.count("sampler") / len(sources)
    assert abs(share - 0.3) < 0.06  # binomial std 0.019: > 3 sigma
    assert set(sources) == set(spec)


def test_two_offline_sources_give_their_own_rows(tmp_path):
    a = _record(tmp_path / "a", seed=0)
    b = _record(tmp_path / "b", seed=100)
    spec = {str(tmp_path / "a" / "*.parquet"): 0.25, str(tmp_path / "b"): 0.75}
    with _reader(spec) as runner:
        got = [runner.sample() for _ in range(400)]
    from_a = [g for g in got if g.meta["input"].endswith(".parquet")]
    assert abs(len(from_a) / len(got) - 0.25) < 0.07
    rows_a = {x.tobytes() for x in a["obs"]}
    rows_b = {x.tobytes() for x in b["obs"]}
    for g in got[:50]:
        want = rows_a if g.meta["input"].endswith(".parquet") else rows_b
        assert all(x.tobytes() in want for x in g["obs"])
        assert len(g) == 10


def test_offline_input_returns_rows_in_order_and_loops(tmp_path):
    data = _record(tmp_path, steps=2)  # 100 rows
    with _reader(str(tmp_path)) as runner:
        got = rc.concat_samples([runner.sample() for _ in range(15)])  # 150 rows: loops
    np.testing.assert_array_equal(got["obs"][:100], data["obs"])
    np.testing.assert_array_equal(got["obs"][100:], data["obs"][:50])


def test_shuffle_buffer_draws_rows_at_random(tmp_path):
    data = _record(tmp_path, steps=4)  # 200 rows
    with _reader(str(tmp_path), shuffle_buffer_size=100) as runner:
        got = rc.concat_samples([runner.sample() for _ in range(10)])
    keys = {(int(e), int(t)) for e, t in zip(data["eps_id"], data["t"])}
    pairs = [(int(e), int(t)) for e, t in zip(got["eps_id"], got["t"])]
    assert set(pairs) <= keys  # rows come from the data ...
    assert len(set(pairs)) == len(pairs)  # ... each at most once in a pass ...
    first = data["eps_id"][:100].tolist()
    assert got["eps_id"].tolist() != first  # ... but not in order


def test_shuffle_needs_single_agent_input(tmp_path):
    _record(tmp_path)

    class TwoAgents(rc.MultiAgentEnv):
        possible_agents = ["a", "b"]
        observation_spaces = {"a": OBS, "b": OBS}
        action_spaces = {"a": gym.spaces.Discrete(2), "b": gym.spaces.Discrete(2)}

        def __init__(self, ctx=None):
            pass

        def reset(self, *, seed=None, options=None):
            return {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}, {}

        def step(self, actions):
            raise NotImplementedError

    config = rc.RunnerConfig(input=str(tmp_path), shuffle_buffer_size=10)
    policies = {"p": rc.RandomPolicy(OBS, gym.spaces.Discrete(2))}
    with pytest.raises(ValueError, match="shuffle_buffer_size"):
        rc.EnvRunner(TwoAgents, policies, lambda *a, **k: "p", config=config)


def test_missing_input_fails_when_the_runner_is_built(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        _reader(str(tmp_path / "nothing-here"))


class LengthPolicy(rc.MLPPolicy):
    """Adds ``traj_len``: the length of the trajectory piece it postprocessed."""

    def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
        batch["traj_len"] = np.full(len(batch), len(batch))
        return batch


def test_postprocess_inputs_runs_the_current_policy_per_trajectory(tmp_path):
    data = _record(tmp_path, steps=2)
    policy = LengthPolicy(OBS, gym.spaces.Discrete(2))
    with _reader(str(tmp_path), policy=policy, postprocess_inputs=True) as runner:
        got = rc.concat_samples([runner.sample() for _ in range(10)])
    # each written batch (50 rows) cut at episode changes; pieces are contiguous rows
    expect = []
    for start in (0, 50):
        eps = data["eps_id"][start : start + 50]
        change = np.flatnonzero(np.r_[True, eps[1:] != eps[:-1], True])
        for a, b in itertools.pairwise(change):
            expect += [b - a] * (b - a)
    np.testing.assert_array_equal(got["traj_len"], expect)
    with _reader(str(tmp_path), policy=LengthPolicy(OBS, gym.spaces.Discrete(2))) as runner:
        assert "traj_len" not in runner.sample()


def test_input_connectors_replay_the_agent_pipeline(tmp_path):
    data = _record(tmp_path, steps=2)
    stacked = gym.spaces.Box(-np.inf, np.inf, (2, 4), np.float32)
    policy = rc.MLPPolicy(stacked, gym.spaces.Discrete(2))
    with _reader(str(tmp_path), policy=policy, framestack=2, input_connectors=True) as runner:
        got = rc.concat_samples([runner.sample() for _ in range(10)])
    assert got["obs"].shape == (100, 2, 4)
    np.testing.assert_array_equal(got["obs"][:, -1], data["obs"])
    np.testing.assert_array_equal(got["new_obs"][:, -1], data["new_obs"])
    np.testing.assert_array_equal(got["new_obs"][:, 0], data["obs"])
    # the older frame: the previous obs within a trajectory piece, else the first frame
    first = np.r_[True, data["eps_id"][1:] != data["eps_id"][:-1]]
    first[50] = True  # a new written batch starts a new piece
    prev = np.where(first[:, None], data["obs"], np.roll(data["obs"], 1, axis=0))
    np.testing.assert_array_equal(got["obs"][:, 0], prev)


def test_input_connectors_leave_live_statistics_alone(tmp_path):
    _record(tmp_path, steps=2)
    with _reader(
        str(tmp_path), observation_filter="MeanStdFilter", input_connectors=True
    ) as runner:
        before = runner.get_connector_states()
        batch = runner.sample()
        after = runner.get_connector_states()
    assert str(before) == str(after)
    assert batch["obs"].dtype == np.float32
