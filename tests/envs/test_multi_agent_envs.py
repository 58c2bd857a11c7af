"""MultiAgentEnvs.poll: one poll's rows read from the sub-envs' dicts, observations checked
and stacked at once when every agent shares a space, bad ones named by env and agent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.envs.multi_agent import MultiAgentEnvs

BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
OTHER = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


class Scripted(rc.MultiAgentEnv):
    """Agents a, b, c; ``script[t]`` (per step) replaces parts of the default dicts."""

    def __init__(self, index: int, script: dict, spaces: dict | None = None) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.observation_spaces = spaces or dict.fromkeys(self.possible_agents, BOX)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.index, self.script, self.t = index, script, 0
        self.received: list[dict] = []

    def _obs(self, agent: str) -> np.ndarray:
        size = self.observation_spaces[agent].shape[0]
        return np.full(size, self.index + 0.1 * self.t, np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {a: self._obs(a) for a in self.possible_agents}, {"a": {"start": self.index}}

    def step(self, actions):
        self.received.append(dict(actions))
        self.t += 1
        out = {
            "obs": {a: self._obs(a) for a in self.possible_agents},
            "rew": dict.fromkeys(self.possible_agents, float(self.index)),
            "te": {"__all__": False},
            "tr": {"__all__": False},
            "inf": {},
        }
        out.update(self.script.get((self.index, self.t), {}))
        return out["obs"], out["rew"], out["te"], out["tr"], out["inf"]


def _envs(script: dict, n: int = 3, spaces: dict | None = None) -> MultiAgentEnvs:
    return MultiAgentEnvs(lambda ctx: Scripted(ctx.vector_index, script, spaces), n, seed=0)


def _act_all(env: MultiAgentEnvs, rows) -> None:
    live = ~(rows.terminateds | rows.truncateds)
    ids = rows.env_ids[live]
    agents = tuple(a for a, keep in zip(rows.agent_ids, live) if keep)
    env.send_actions(ids, agents, np.arange(len(ids)) % 2)


def test_a_poll_gives_every_observed_agent_a_row_stacked_once():
    env = _envs({})
    first = env.poll()
    assert first.stacked and first.obs.shape == (9, 2) and first.obs.dtype == np.float32
    assert first.is_first.all() and not first.stepped.size
    assert first.infos[0] == {"start": 0} and first.infos[3] == {"start": 1}
    _act_all(env, first)
    rows = env.poll()
    assert [e.received[0] for e in env.envs] == [
        {"a": 0, "b": 1, "c": 0},
        {"a": 1, "b": 0, "c": 1},
        {"a": 0, "b": 1, "c": 0},
    ]
    assert rows.env_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rows.agent_ids == ("a", "b", "c") * 3
    np.testing.assert_allclose(rows.obs[:, 0], np.repeat([0.1, 1.1, 2.1], 3), rtol=1e-6)
    assert rows.rewards.tolist() == [0.0] * 3 + [1.0] * 3 + [2.0] * 3
    assert not rows.terminateds.any() and not rows.truncateds.any() and not rows.is_first.any()
    assert rows.stepped.tolist() == [0, 1, 2] and rows.done_envs == {} and not rows.errors


def test_agents_flags_extra_rewards_and_episode_ends_come_from_the_dicts():
    script = {
        (1, 1): {
            "obs": {"a": np.zeros(2, np.float32)},
            "rew": {"a": 1.0, "b": 2.5},
            "te": {"a": False, "c": True, "__all__": False},
            "inf": {"a": {"x": 1}},
        },
        (2, 1): {"te": {"b": True, "__all__": True}, "tr": {"__all__": False}},
    }
    env = _envs(script)
    _act_all(env, env.poll())
    rows = env.poll()
    assert rows.agent_ids == ("a", "b", "c", "a", "a", "b", "c")
    assert rows.env_ids.tolist() == [0, 0, 0, 1, 2, 2, 2]
    assert rows.terminateds.tolist() == [False] * 5 + [True, False]
    assert rows.infos[3] == {"x": 1}
    extra = {
        (x.env_id, x.agent_id): (x.reward, x.terminated, x.truncated) for x in rows.extra_rewards
    }
    assert extra == {(1, "b"): (2.5, False, False), (1, "c"): (0.0, True, False)}
    assert rows.done_envs == {2: (True, False)}


def test_a_sub_env_whose_observed_agents_all_ended_steps_with_no_actions_next():
    script = {(0, 1): {"obs": {"a": np.zeros(2, np.float32)}, "te": {"a": True, "__all__": False}}}
    env = _envs(script, n=1)
    _act_all(env, env.poll())
    rows = env.poll()
    assert rows.terminateds.tolist() == [True]
    rows = env.poll()  # nobody was sent an action: stepped with {} all the same
    assert env.envs[0].received[-1] == {} and rows.stepped.tolist() == [0]


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (np.zeros(5, np.float32), r"env 1 / agent 'b': wrong shape \(5,\)"),
        (np.zeros(2, np.complex64), r"env 1 / agent 'b': wrong dtype complex64"),
    ],
)
def test_a_bad_observation_fails_its_sub_env_only_named_by_agent(shared, bad, message):
    spaces = None if shared else {"a": OTHER, "b": BOX, "c": BOX}
    obs = {"a": np.zeros(2 if shared else 3, np.float32), "b": bad, "c": np.zeros(2, np.float32)}
    env = _envs({(1, 1): {"obs": obs}}, spaces=spaces)
    _act_all(env, env.poll())
    rows = env.poll()
    assert list(rows.errors) == [1]
    with pytest.raises(rc.EnvCheckError, match=message):
        raise rows.errors[1]
    assert rows.env_ids.tolist() == [0, 0, 0, 2, 2, 2] and rows.stepped.tolist() == [0, 2]
    assert rows.stacked == shared
    firsts = [rows.obs[k][0] for k in range(6)]
    np.testing.assert_allclose(firsts, [0.1] * 3 + [2.1] * 3, rtol=1e-6)


def test_actions_sent_in_parts_for_one_sub_env_all_arrive():
    """Actions for one sub-env's agents come in one call (one dict) or in several (one
    per policy): the sub-env steps with all of them."""
    env = _envs({}, n=2)
    env.poll()
    env.send_actions(np.array([1, 1]), ("a", "b"), np.array([1, 0]))
    env.send_actions(np.array([1]), ("c",), [1])
    env.send_actions(np.array([0, 0, 0]), ("a", "b", "c"), np.array([0, 1, 0]))
    env.send_actions(np.array([], dtype=np.int64), (), np.array([]))
    env.poll()
    assert [e.received[0] for e in env.envs] == [{"a": 0, "b": 1, "c": 0}, {"a": 1, "b": 0, "c": 1}]
