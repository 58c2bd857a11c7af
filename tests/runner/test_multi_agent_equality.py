"""The runner's multi-agent rows equal a slow reference built from the env's own dicts.

``RandomAgents`` lets five agents join, wait, act, get rewards while waiting or absent,
end with or without a final observation, rejoin, and ends its episodes at random (with
little ``churn`` the same agents act together for many steps in a row, so polls repeat
their layout until one of them changes); every dict it returns and every action it
receives is logged. ``reference`` replays that log one
step and one agent at a time into the transitions the runner's semantics promise (see
docs/multi-agent.md), and the episode returns; the runner, three sub-envs and three
policies, must give exactly these.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

AGENTS = [f"a{i}" for i in range(5)]
POLICIES = {"a0": "p0", "a1": "p1", "a2": "p2", "a3": "p0", "a4": "p1"}
SPACE = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
Transition = tuple[str, tuple, int, float, bool, bool, tuple]


class RandomAgents(rc.MultiAgentEnv):
    """Agents that come and go at random (seeded by the sub-env's index); obs of agent
    ``a{k}`` at step ``t`` of episode ``e`` is ``[e, t, k]``; ``log`` holds every reset's
    obs and every step's actions and dicts."""

    possible_agents = AGENTS
    observation_spaces = dict.fromkeys(AGENTS, SPACE)
    action_spaces = dict.fromkeys(AGENTS, gym.spaces.Discrete(3))

    def __init__(self, index: int, churn: float = 1.0) -> None:
        self.rng = np.random.default_rng(1000 + index)
        self.churn = churn  # scales the chances to join, end and wait
        self.log: list[tuple] = []
        self.episode = -1

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.episode, self.t, int(agent[1:])], np.float32)

    def reset(self, *, seed=None, options=None):
        self.episode += 1
        self.t = 0
        first = [a for a in AGENTS if self.rng.random() < 0.5] or [AGENTS[0]]
        self.present = set(first)
        obs = {a: self._obs(a) for a in first}
        self.expect = set(first)
        self.log.append(("reset", obs))
        return obs, {}

    def _reward(self, rew: dict, agent: str, chance: float) -> None:
        if self.rng.random() < chance:
            rew[agent] = float(self.rng.integers(-2, 3))

    def step(self, actions):
        assert set(actions) == self.expect, (set(actions), self.expect)
        self.t += 1
        obs: dict[str, Any] = {}
        rew: dict[str, float] = {}
        te: dict[str, bool] = {}
        tr: dict[str, bool] = {}
        for a in AGENTS:
            u = self.rng.random()
            if a not in self.present:
                if u < 0.15 * self.churn:  # joins (again, after it ended)
                    self.present.add(a)
                    obs[a] = self._obs(a)
                self._reward(rew, a, 0.05)  # absent: counts for the episode only
                continue
            self._reward(rew, a, 0.5)
            if u < 0.1 * self.churn:  # ends, with or without a final observation
                te[a], tr[a] = (True, False) if self.rng.random() < 0.5 else (False, True)
                if self.rng.random() < 0.5:
                    obs[a] = self._obs(a)
                self.present.discard(a)
            elif u < 1 - 0.25 * self.churn:
                obs[a] = self._obs(a)
            # else: waits, without an observation
        over = self.rng.random() < 0.05 or self.t >= 40
        ends = (True, False) if self.rng.random() < 0.5 else (False, True)
        te["__all__"], tr["__all__"] = ends if over else (False, False)
        self.expect = set() if over else {a for a in obs if not (te.get(a) or tr.get(a))}
        self.log.append(("step", dict(actions), obs, rew, te, tr))
        return obs, rew, te, tr, {}


def _key(obs: Any) -> tuple:
    return tuple(np.asarray(obs).tolist())


def reference(log: list[tuple]) -> list[tuple[list[Transition], dict[str, float]]]:
    """Every completed episode of ``log``: its transitions (sorted) and each agent's
    return, one agent at a time, from the env's dicts."""
    episodes: list[tuple[list[Transition], dict[str, float]]] = []
    open_: dict[str, dict[str, Any]] = {}
    out: list[Transition] = []
    returns: dict[str, float] = defaultdict(float)
    for entry in log:
        if entry[0] == "reset":
            out, returns = [], defaultdict(float)
            open_ = {a: {"obs": o, "pending": 0.0} for a, o in entry[1].items()}
            continue
        _, actions, obs, rew, te, tr = entry
        for a, act in actions.items():
            open_[a]["action"] = int(act)
        for a, r in rew.items():
            returns[a] += r
            if a in open_ and a not in obs:
                open_[a]["pending"] += r
        all_flags = (te["__all__"], tr["__all__"])
        over = any(all_flags)
        for a in AGENTS:
            flags = (te.get(a, False), tr.get(a, False))
            if a in obs and a in open_:
                st = open_.pop(a)
                if over and not any(flags):
                    flags = all_flags
                reward = st["pending"] + rew.get(a, 0.0)
                out.append((a, _key(st["obs"]), st["action"], reward, *flags, _key(obs[a])))
                if not any(flags):
                    open_[a] = {"obs": obs[a], "pending": 0.0}
            elif a in obs:  # joins: its first row (its reward before it is nobody's)
                if not (over or any(flags)):
                    open_[a] = {"obs": obs[a], "pending": 0.0}
            elif a in open_ and any(flags):  # ends without an observation
                st = open_.pop(a)
                out.append(
                    (a, _key(st["obs"]), st["action"], st["pending"], *flags, _key(st["obs"]))
                )
        if over:
            for a, st in sorted(open_.items()):
                out.append(
                    (a, _key(st["obs"]), st["action"], st["pending"], *all_flags, _key(st["obs"]))
                )
            open_ = {}
            episodes.append((sorted(out), dict(returns)))
    return episodes


def runner_transitions(batches: list[rc.MultiAgentBatch]) -> dict[tuple[int, int], list]:
    """(env id, episode number) -> the batches' transitions of that episode, sorted."""
    out: dict[tuple[int, int], list] = defaultdict(list)
    for batch in batches:
        for pid, sb in batch.policy_batches.items():
            for k in range(len(sb)):
                obs, new_obs = sb["obs"][k], sb["new_obs"][k]
                agent = f"a{int(obs[2])}"
                assert POLICIES[agent] == pid, (agent, pid)
                out[int(sb["env_id"][k]), int(obs[0])].append(
                    (
                        agent,
                        _key(obs),
                        int(sb["actions"][k]),
                        float(sb["rewards"][k]),
                        bool(sb["terminateds"][k]),
                        bool(sb["truncateds"][k]),
                        _key(new_obs),
                    )
                )
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("batch_mode", ["complete_episodes", "truncate_episodes"])
@pytest.mark.parametrize(("num_envs", "churn"), [(3, 1.0), (1, 0.1), (3, 0.1)])
def test_runner_rows_equal_the_reference_built_from_the_envs_dicts(batch_mode, num_envs, churn):
    envs: dict[int, RandomAgents] = {}

    def make(ctx):
        return envs.setdefault(ctx.vector_index, RandomAgents(ctx.vector_index, churn))

    policies = {p: rc.RandomPolicy(SPACE, gym.spaces.Discrete(3), seed=k) for k, p in
                enumerate(sorted(set(POLICIES.values())))}  # fmt: skip
    config = rc.RunnerConfig(
        num_envs=num_envs,
        rollout_fragment_length=25,
        seed=0,
        batch_mode=batch_mode,
        check_env=True,
    )
    runner = rc.EnvRunner(
        make, policies, lambda agent_id, episode, **kw: POLICIES[agent_id], config=config
    )
    batches = [runner.sample() for _ in range(6)]
    metrics = runner.get_metrics()
    runner.stop()
    got = runner_transitions(batches)
    ended: dict[int, list[dict]] = defaultdict(list)
    for m in metrics:
        ended[m["env_id"]].append(m)
    checked = 0
    for e, env in envs.items():
        ref = reference(env.log)
        assert len(ended[e]) <= len(ref)
        for number, (m, (transitions, returns)) in enumerate(zip(ended[e], ref)):
            assert got.get((e, number), []) == transitions, (e, number)
            have = {a: r for (a, _), r in m["agent_rewards"].items() if r}
            assert have == {a: r for a, r in returns.items() if r}
            assert m["episode_reward"] == sum(returns.values())  # (integer rewards: exact)
            checked += len(transitions)
    # every episode the batches hold rows of ended (nothing recorded past the last end)
    assert all(number < len(ended[e]) for e, number in got) or batch_mode == "truncate_episodes"
    assert checked > 100 * num_envs  # joins, waits, rejoins and ends of every kind happened
