"""Multi-agent semantics: joining, leaving, turns, rewards while not acting, episode ends."""

from __future__ import annotations

import numpy as np
import pytest
from cases import TurnTakingEnv, trajectories

import rlconnect as rc


def make_runner(frag=6, n=1, mapping=None, **cfg):
    env = TurnTakingEnv()
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    policies = {"pa": rc.RandomPolicy(space, act), "pb": rc.RandomPolicy(space, act)}
    calls = []

    def default_mapping(agent_id, episode, **kwargs):
        calls.append((episode.episode_id, agent_id))
        return "pa" if agent_id == "a" else "pb"

    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=0, **cfg)
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(), policies, mapping or default_mapping, config=config
    )
    return runner, calls


def by_agent(batch: rc.MultiAgentBatch) -> dict[int, rc.SampleBatch]:
    out = {}
    for pb in batch.policy_batches.values():
        for traj in trajectories(pb):
            out[int(traj["obs"][0, 0])] = traj  # obs[0] encodes the agent
    return out


def test_agents_join_leave_and_act_in_turns():
    runner, calls = make_runner(batch_mode="complete_episodes")
    batch = runner.sample()
    assert isinstance(batch, rc.MultiAgentBatch)
    assert batch.env_steps() == 6
    trajs = by_agent(batch)
    a, b, c = trajs[0], trajs[1], trajs[2]
    # a acts every step; the episode's __all__ termination marks its last row
    assert a["t"].tolist() == [0, 1, 2, 3, 4, 5]
    assert a["terminateds"].tolist() == [False] * 5 + [True]
    # b acts every second step: t jumps, rewards earned while not acting are summed
    assert b["t"].tolist() == [0, 2, 4]
    assert b["rewards"].tolist() == [1.0, 1.0, 1.0]
    # b got no final observation: its last row repeats its last obs, nothing made up
    np.testing.assert_array_equal(b["new_obs"][-1], b["obs"][-1])
    assert b["terminateds"][-1]
    # c joins at t=2 and leaves (terminated, with a final obs) at t=4
    assert c["t"].tolist() == [2, 3]
    assert c["new_obs"][-1].tolist() == [2.0, 4.0]
    assert c["terminateds"].tolist() == [False, True]
    for traj in (a, b, c):
        np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
    assert batch.agent_steps() == 6 + 3 + 2
    # the mapping fn is called once per agent per episode
    assert sorted(agent for _, agent in calls if _ >= 0) == ["a", "b", "c"]


def test_metrics_use_env_rewards_per_agent_and_policy():
    runner, _ = make_runner(batch_mode="complete_episodes", clip_rewards=0.25)
    batch = runner.sample()
    (m,) = runner.get_metrics()
    assert m["agent_rewards"] == {("a", "pa"): 6.0, ("b", "pb"): 3.0, ("c", "pb"): 4.0}
    assert m["episode_reward"] == 13.0
    # the batch holds the clipped rewards the policy trains on, b's closing row's too
    for pb in batch.policy_batches.values():
        assert pb["rewards"].max() == 0.25


@pytest.mark.parametrize("count_by", ["env_steps", "agent_steps"])
def test_truncated_fragments_are_exact_and_continuous(count_by):
    runner, _ = make_runner(frag=5, n=2, count_steps_by=count_by)
    seen: dict[tuple[int, int], np.ndarray] = {}
    for _ in range(5):
        batch = runner.sample()
        if count_by == "env_steps":
            assert batch.env_steps() == 10
        else:
            assert 10 <= batch.agent_steps() < 10 + 3
        for pb in batch.policy_batches.values():
            for traj in trajectories(pb):
                key = (int(traj["eps_id"][0]), int(traj["agent_index"][0]))
                np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
                if key in seen:
                    np.testing.assert_array_equal(seen[key], traj["obs"][0])
                seen[key] = traj["new_obs"][-1]


def test_observation_fn_sees_all_agents_of_a_step():
    seen = []

    def observation_fn(agent_obs, **kwargs):
        seen.append(sorted(agent_obs))
        return {k: v + 10 for k, v in agent_obs.items()}

    runner, _ = make_runner(observation_fn=observation_fn, batch_mode="complete_episodes")
    batch = runner.sample()
    assert ["a", "b"] in seen and ["a", "b", "c"] in seen
    assert batch.policy_batches["pa"]["obs"][:, 0].min() == 10


def test_postprocess_sees_other_agents_and_callbacks_fire():
    events = []

    class Recorder(rc.Callbacks):
        def on_episode_created(self, *, episode, **kw):
            events.append(("created", episode.episode_id))

        def on_episode_start(self, *, episode, **kw):
            events.append(("start", episode.episode_id))

        def on_episode_step(self, *, episode, **kw):
            events.append(("step", episode.length))

        def on_episode_end(self, *, episode, **kw):
            events.append(("end", episode.length))

        def on_postprocess_trajectory(self, *, agent_id, postprocessed_batch, **kw):
            events.append(("post", agent_id, len(postprocessed_batch)))

        def on_sample_end(self, *, samples, **kw):
            events.append(("sample_end", samples.env_steps()))

    class Marking(rc.RandomPolicy):
        def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
            batch["n_others"] = np.full(len(batch), len(other_agent_batches))
            return batch

    env = TurnTakingEnv()
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    config = rc.RunnerConfig(rollout_fragment_length=6, batch_mode="complete_episodes", seed=0)
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(), Marking(space, act), config=config, callbacks=Recorder()
    )
    batch = runner.sample()
    pb = batch.policy_batches["default_policy"]
    assert (pb["n_others"] == 2).all()
    kinds = [e[0] for e in events]
    assert kinds[:2] == ["created", "start"]
    assert kinds.count("step") == 6 and ("end", 6) in events
    assert sorted(e[1:] for e in events if e[0] == "post") == [("a", 6), ("b", 3), ("c", 2)]
    assert kinds[-1] == "sample_end"
