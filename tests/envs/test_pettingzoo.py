"""PettingZoo adapters: real Parallel and AEC envs, directly and through the runner."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("pygame")  # pettingzoo.classic imports it (pygame-ce)

import gymnasium as gym
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.classic import connect_four_v3, rps_v2, tictactoe_v3
from pettingzoo.utils.env_logger import EnvLogger

import rlconnect as rc
from rlconnect.envs.make import make_base_env
from rlconnect.envs.multi_agent import MultiAgentEnvs
from rlconnect.envs.pettingzoo import PettingZooAECEnv, PettingZooParallelEnv, from_pettingzoo
from rlconnect.spaces import flatten_batch, flatten_space, stack_samples

EnvLogger.suppress_output()  # tictactoe warns on every illegal move of a random policy

AEC_CREATORS = {
    "tictactoe": tictactoe_v3.env,
    "connect_four": connect_four_v3.env,
    "rps": lambda: rps_v2.env(max_cycles=4),
}


def legal(obs: dict, rng: np.random.Generator) -> int:
    return int(rng.choice(np.flatnonzero(obs["action_mask"])))


def canonical_returns(env: Any, seed: int, choose) -> tuple[dict, list]:
    """PettingZoo's reference loop: per-agent sum of ``last()`` rewards and the moves."""
    env.reset(seed=seed)
    returns: dict = defaultdict(float)
    moves = []
    for agent in env.agent_iter():
        obs, rew, term, trunc, _ = env.last()
        returns[agent] += rew
        if term or trunc:
            env.step(None)
            continue
        action = choose(agent, obs)
        moves.append((agent, action))
        env.step(action)
    return dict(returns), moves


def run_adapter(env: PettingZooAECEnv, seed: int, choose) -> dict:
    """Play one episode through the adapter, recording what the runner would see."""
    obs, infos = env.reset(seed=seed)
    assert set(infos) == set(obs)
    log: dict[str, Any] = {"returns": defaultdict(float), "moves": [], "done": {}, "steps": 0}
    while True:
        (agent,) = [a for a in obs if a not in log["done"]]  # one agent acts at a time
        assert agent == env.env.agent_selection
        action = choose(agent, obs[agent])
        log["moves"].append((agent, action))
        obs, rew, te, tr, infos = env.step({agent: action})
        log["steps"] += 1
        assert "__all__" in te
        assert "__all__" in tr
        for a, r in rew.items():
            log["returns"][a] += r
        for a in obs:
            assert a in rew
            assert a in infos
            assert a not in log["done"], f"{a} got an observation after it was done"
            assert env.observation_spaces[a].contains(obs[a])
            if te[a] or tr[a]:
                log["done"][a] = (te[a], tr[a])
        if te["__all__"] or tr["__all__"]:
            assert te["__all__"] != tr["__all__"]
            assert not env.env.agents
            log["end"] = (te["__all__"], tr["__all__"])
            return log
        live = [a for a in obs if not (te[a] or tr[a])]
        assert len(live) == 1


# -- import without pettingzoo -------------------------------------------------------------
def test_module_imports_without_pettingzoo_and_names_the_extra():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["pettingzoo"] = None  # make `import pettingzoo` fail
        import rlconnect.envs.pettingzoo as m
        try:
            m.from_pettingzoo(object())
        except ImportError as e:
            assert "pip install rlconnect[pettingzoo]" in str(e), e
            print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_from_pettingzoo_rejects_other_objects_and_is_idempotent():
    with pytest.raises(TypeError, match="ParallelEnv or AECEnv"):
        from_pettingzoo(object())
    env = from_pettingzoo(tictactoe_v3.env())
    assert isinstance(env, rc.MultiAgentEnv)
    assert from_pettingzoo(env) is env
    assert isinstance(from_pettingzoo(rps_v2.parallel_env()), PettingZooParallelEnv)


# -- AEC, directly -------------------------------------------------------------------------
def test_aec_spaces_and_reset_give_the_selected_agent_only():
    env = from_pettingzoo(tictactoe_v3.env())
    assert isinstance(env, PettingZooAECEnv)
    assert env.possible_agents == ["player_1", "player_2"]
    assert set(env.observation_spaces) == set(env.action_spaces) == {"player_1", "player_2"}
    assert isinstance(env.observation_spaces["player_1"], gym.spaces.Dict)
    assert env.action_spaces["player_2"] == gym.spaces.Discrete(9)
    obs, infos = env.reset(seed=0)
    assert list(obs) == ["player_1"]
    assert list(infos) == ["player_1"]
    np.testing.assert_array_equal(obs["player_1"]["action_mask"], np.ones(9))


def test_aec_tictactoe_win_reaches_both_players_and_removal_steps_make_no_rows():
    env = from_pettingzoo(tictactoe_v3.env())
    env.reset(seed=0)
    turns = []
    # player_1 takes the left column (0, 1, 2); player_2 plays 3 and 4
    for move in [0, 3, 1, 4]:
        agent = env.env.agent_selection
        obs, rew, te, tr, _ = env.step({agent: move})
        turns.append(agent)
        (nxt,) = obs
        assert nxt != agent  # strict alternation
        assert rew == {nxt: 0.0}
        assert te == {nxt: False, "__all__": False}
        assert tr == {nxt: False, "__all__": False}
    assert turns == ["player_1", "player_2"] * 2
    obs, rew, te, tr, infos = env.step({"player_1": 2})
    # both players' final observations and rewards, no more rows, one call = one move
    assert set(obs) == set(infos) == {"player_1", "player_2"}
    assert rew == {"player_1": 1.0, "player_2": -1.0}
    assert te == {"player_1": True, "player_2": True, "__all__": True}
    assert tr == {"player_1": False, "player_2": False, "__all__": False}
    board = obs["player_1"]["observation"]
    assert board[:, :, 0].sum() == 3  # the final board, with the winning mark on it
    assert board[:, :, 1].sum() == 2
    np.testing.assert_array_equal(obs["player_2"]["observation"][:, :, 1], board[:, :, 0])
    assert env.env.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"player_2": 5})


def test_aec_illegal_move_sets_both_flags_and_terminates_the_episode():
    env = from_pettingzoo(tictactoe_v3.env())
    env.reset(seed=0)
    env.step({"player_1": 4})
    obs, rew, te, tr, _ = env.step({"player_2": 4})  # occupied square
    assert set(obs) == {"player_1", "player_2"}
    assert rew == {"player_1": 0.0, "player_2": -1.0}
    assert te["player_1"]
    assert tr["player_1"]  # TerminateIllegalWrapper sets both
    assert te["__all__"]
    assert not tr["__all__"]


def test_aec_step_checks_the_acting_agent():
    env = from_pettingzoo(tictactoe_v3.env())
    env.reset(seed=0)
    with pytest.raises(ValueError, match="player_1"):
        env.step({"player_2": 0})
    with pytest.raises(ValueError, match="player_1"):
        env.step({"player_1": 0, "player_2": 1})


def test_aec_rps_rewards_of_waiting_agent_come_without_observation_and_truncate():
    env = from_pettingzoo(rps_v2.env(max_cycles=2))
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["player_0"]
    obs, rew, te, tr, _ = env.step({"player_0": 1})
    assert list(obs) == ["player_1"]
    assert rew == {"player_1": 0.0}
    # player_1 finishes round 1: player_0 (who observes next) loses, player_1 wins
    obs, rew, te, tr, _ = env.step({"player_1": 2})
    assert list(obs) == ["player_0"]
    assert rew == {"player_0": -1.0, "player_1": 1.0}  # player_1's reward has no obs
    assert not te["__all__"]
    assert not tr["__all__"]
    env.step({"player_0": 1})
    obs, rew, te, tr, _ = env.step({"player_1": 2})  # max_cycles reached
    assert set(obs) == {"player_0", "player_1"}
    assert rew == {"player_0": -1.0, "player_1": 1.0}
    assert tr == {"player_0": True, "player_1": True, "__all__": True}
    assert te == {"player_0": False, "player_1": False, "__all__": False}


@pytest.mark.parametrize("name", sorted(AEC_CREATORS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aec_adapter_matches_pettingzoo_reference_loop(name, seed):
    """Per-agent reward sums, move order and step count equal PettingZoo's agent_iter loop."""
    make = AEC_CREATORS[name]
    rng = np.random.default_rng(seed)
    moves: list = []

    def choose_ref(agent, obs):
        action = legal(obs, rng) if isinstance(obs, dict) else int(rng.integers(3))
        moves.append(action)
        return action

    ref_returns, ref_moves = canonical_returns(make(), seed, choose_ref)
    replay = iter(moves)
    log = run_adapter(from_pettingzoo(make()), seed, lambda a, o: next(replay))
    assert log["moves"] == ref_moves
    assert log["steps"] == len(ref_moves)  # removal steps are not steps
    assert dict(log["returns"]) == pytest.approx(ref_returns)
    assert set(log["done"]) == set(ref_returns)  # every agent got a final row
    if name == "rps":
        assert log["end"] == (False, True)
    else:
        assert log["end"] == (True, False)


# -- Parallel, directly --------------------------------------------------------------------
def test_parallel_rps_passes_dicts_through_and_truncates():
    env = from_pettingzoo(rps_v2.parallel_env(max_cycles=3))
    assert isinstance(env, PettingZooParallelEnv)
    assert env.possible_agents == ["player_0", "player_1"]
    assert env.action_spaces["player_0"] == gym.spaces.Discrete(3)
    obs, infos = env.reset(seed=0)
    assert set(obs) == set(infos) == {"player_0", "player_1"}
    for k in range(3):
        obs, rew, te, tr, _ = env.step({"player_0": 1, "player_1": 2})
        assert set(obs) == {"player_0", "player_1"}
        assert rew == {"player_0": -1, "player_1": 1}
        assert not te["__all__"]
        assert tr["__all__"] == (k == 2)
        assert tr["player_0"] == tr["player_1"] == (k == 2)
    assert env.env.agents == []


class Staggered(ParallelEnv):
    """A tiny ParallelEnv whose agents finish at different times, the last by time limit."""

    metadata = {"name": "staggered_v0"}

    def __init__(self, limit: int = 3):
        self.possible_agents = ["a", "b", "c"]
        self.limit = limit
        self._space = gym.spaces.Box(0, 10, (1,), np.float32)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _obs(self):
        return np.array([self.t], np.float32)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs() for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents)
        self.t += 1
        te = {a: (a == "a" and self.t == 1) or (a == "b" and self.t == 2) for a in self.agents}
        tr = {a: self.t >= self.limit and not te[a] for a in self.agents}
        obs = {a: self._obs() for a in self.agents}
        rew = dict.fromkeys(self.agents, 1.0)
        self.agents = [a for a in self.agents if not (te[a] or tr[a])]
        return obs, rew, te, tr, {a: {} for a in obs}


def test_parallel_agents_finishing_at_different_times():
    env = from_pettingzoo(Staggered(limit=3))
    env.reset()
    obs, _, te, tr, _ = env.step({"a": 0, "b": 0, "c": 0})
    assert set(obs) == {"a", "b", "c"}  # a's final observation
    assert te == {"a": True, "b": False, "c": False, "__all__": False}
    obs, _, te, _, _ = env.step({"b": 0, "c": 0})
    assert set(obs) == {"b", "c"}
    assert te["b"]
    assert not te["__all__"]
    obs, _, te, tr, _ = env.step({"c": 0})
    assert set(obs) == {"c"}
    assert tr == {"c": True, "__all__": True}
    assert te == {"c": False, "__all__": False}


class KeepsReporting(Staggered):
    """Staggered, but done agents stay listed and keep their observations, flags, infos
    and (for "a") a reward in every later step's dicts."""

    def step(self, actions):
        self.t += 1
        te = {a: (a == "a" and self.t >= 1) or (a == "b" and self.t >= 2) for a in "abc"}
        tr = {a: self.t >= self.limit and not te[a] for a in "abc"}
        rew = {"a": 5.0 if self.t > 1 else 1.0, "b": 0.0, "c": 1.0}
        if self.t >= self.limit:
            self.agents = []
        return {a: self._obs() for a in "abc"}, rew, te, tr, {a: {"t": self.t} for a in "abc"}


def test_parallel_agents_reported_done_are_dropped_from_later_steps():
    env = from_pettingzoo(KeepsReporting(limit=3))
    env.reset()
    obs, rew, te, tr, infos = env.step({"a": 0, "b": 0, "c": 0})
    assert set(obs) == set(infos) == {"a", "b", "c"}
    assert te == {"a": True, "b": False, "c": False, "__all__": False}
    obs, rew, te, tr, infos = env.step({"b": 0, "c": 0})
    assert set(obs) == set(infos) == {"b", "c"}  # a is done: only its later reward is kept
    assert rew == {"a": 5.0, "b": 0.0, "c": 1.0}
    assert te == {"b": True, "c": False, "__all__": False}
    obs, rew, te, tr, infos = env.step({"c": 0})
    assert set(obs) == set(infos) == {"c"}
    assert rew == {"a": 5.0, "c": 1.0}  # b's reward of 0 is left out with its flags
    assert te == {"c": False, "__all__": False} and tr == {"c": True, "__all__": True}


def test_parallel_all_terminated_ends_the_episode_as_terminated():
    env = from_pettingzoo(Staggered(limit=10))
    env.reset()
    env.step({"a": 0, "b": 0, "c": 0})
    env.env.limit = 2  # c is cut at the step where b terminates: truncated wins
    _, _, te, tr, _ = env.step({"b": 0, "c": 0})
    assert tr["__all__"]
    assert not te["__all__"]


# -- through make_base_env and the runner --------------------------------------------------
def test_make_base_env_wraps_instances_and_creators():
    base = make_base_env(tictactoe_v3.env())
    assert isinstance(base, MultiAgentEnvs)
    assert isinstance(base.envs[0], PettingZooAECEnv)
    base = make_base_env(lambda ctx: rps_v2.parallel_env(), num_envs=2, seed=0)
    assert isinstance(base, MultiAgentEnvs)
    assert all(isinstance(e, PettingZooParallelEnv) for e in base.envs)
    assert base.observation_space("player_1") == gym.spaces.Discrete(4)


class MaskedRandomPolicy(rc.RandomPolicy):
    """Random legal moves, reading the action mask out of the flattened Dict observation."""

    def __init__(self, raw_space: gym.spaces.Dict, action_space, *, seed=None):
        super().__init__(flatten_space(raw_space), action_space, seed=seed)
        probe = {
            k: (np.ones if k == "action_mask" else np.zeros)(s.shape, s.dtype)
            for k, s in raw_space.spaces.items()
        }
        flat = flatten_batch(raw_space, stack_samples(raw_space, [probe]))[0]
        self.mask_idx = np.flatnonzero(flat)
        assert len(self.mask_idx) == action_space.n

    def compute_actions(self, input_batch, explore=True):
        masks = np.asarray(input_batch["obs"])[:, self.mask_idx] > 0
        actions = np.array([self.np_random.choice(np.flatnonzero(m)) for m in masks])
        return actions, [], {}


def two_player_runner(make, agents, policy_cls, frag=20, **cfg):
    raw = make()
    policies = {}
    for i, a in enumerate(agents):
        ospace, aspace = raw.observation_space(a), raw.action_space(a)
        if policy_cls is rc.RandomPolicy:  # FlattenObservations: one-hot / concatenated
            policies[a] = rc.RandomPolicy(flatten_space(ospace), aspace, seed=i)
        else:
            policies[a] = policy_cls(ospace, aspace, seed=i)
    config = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=frag, seed=0, batch_mode="complete_episodes", **cfg
    )
    return rc.EnvRunner(
        lambda ctx: make(),
        policies,
        policy_mapping_fn=lambda agent_id, episode, **kw: agent_id,
        config=config,
    )


def episodes_of(batch: rc.MultiAgentBatch) -> dict[int, dict[str, rc.SampleBatch]]:
    out: dict[int, dict[str, rc.SampleBatch]] = defaultdict(dict)
    for pid, sb in batch.policy_batches.items():
        for ep in np.unique(sb["eps_id"]).tolist():
            idx = np.flatnonzero(sb["eps_id"] == ep)
            assert np.all(np.diff(idx) == 1), "an agent's trajectory is contiguous"
            out[ep][pid] = sb[int(idx[0]) : int(idx[-1]) + 1]
    return out


def replay_returns(make, moves: list[tuple[str, int]]) -> tuple[dict, int]:
    """Replay the moves in a fresh env with PettingZoo's own loop."""
    it = iter(moves)

    def choose(agent, obs):
        who, action = next(it)
        assert who == agent, "turn order differs from PettingZoo's"
        return action

    returns, ref_moves = canonical_returns(make(), 0, choose)
    assert next(it, None) is None
    return returns, len(ref_moves)


@pytest.mark.parametrize(
    ("name", "policy_cls"),
    [
        ("tictactoe", MaskedRandomPolicy),  # wins, losses and draws
        ("tictactoe", rc.RandomPolicy),  # mostly illegal-move endings (both flags set)
        ("connect_four", MaskedRandomPolicy),
        ("rps", rc.RandomPolicy),  # rewards during the other's turn, truncation
    ],
)
def test_runner_on_aec_env_matches_the_env(name, policy_cls):
    make = AEC_CREATORS[name]
    agents = make().possible_agents
    runner = two_player_runner(make, agents, policy_cls)
    batch = runner.sample()
    assert isinstance(batch, rc.MultiAgentBatch)
    metrics = {m["episode_id"]: m for m in runner.get_metrics()}
    episodes = episodes_of(batch)
    assert episodes
    assert set(episodes) <= set(metrics)
    env_steps = 0
    outcomes = set()
    for ep, trajs in episodes.items():
        assert set(trajs) == set(agents), "both players have rows in every episode"
        moves = []
        for a, traj in trajs.items():
            # continuity within the trajectory and exactly one terminal row, the last
            np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
            done = traj["terminateds"] | traj["truncateds"]
            assert done[-1]
            assert not done[:-1].any()
            moves += [(int(t), a, int(act)) for t, act in zip(traj["t"], traj["actions"])]
        moves.sort()
        assert [t for t, _, _ in moves] == list(range(len(moves))), "one move per env step"
        returns, n_moves = replay_returns(make, [(a, act) for _, a, act in moves])
        assert n_moves == len(moves) == metrics[ep]["episode_length"]
        env_steps += n_moves
        for a, traj in trajs.items():
            assert float(traj["rewards"].sum()) == pytest.approx(returns[a])
            assert metrics[ep]["agent_rewards"][(a, a)] == pytest.approx(returns[a])
        outcomes.add(tuple(returns[a] for a in agents))
    assert batch.env_steps() == env_steps
    if name == "tictactoe" and policy_cls is MaskedRandomPolicy:
        assert outcomes & {(1.0, -1.0), (-1.0, 1.0)}, outcomes


def test_runner_on_parallel_env_matches_the_env():
    make = lambda: rps_v2.parallel_env(max_cycles=5)  # noqa: E731
    runner = two_player_runner(make, ["player_0", "player_1"], rc.RandomPolicy, frag=10)
    batch = runner.sample()
    metrics = {m["episode_id"]: m for m in runner.get_metrics()}
    episodes = episodes_of(batch)
    for ep, trajs in episodes.items():
        p0, p1 = trajs["player_0"], trajs["player_1"]
        assert len(p0) == len(p1) == 5 == metrics[ep]["episode_length"]
        for traj in (p0, p1):
            np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
            assert traj["truncateds"][-1]
            assert not traj["truncateds"][:-1].any()
            assert not traj["terminateds"].any()
        # each agent observes the other's last move; recompute rps rewards from the actions
        np.testing.assert_array_equal(p0["new_obs"].argmax(-1), p1["actions"])  # one-hot
        np.testing.assert_array_equal(p1["new_obs"].argmax(-1), p0["actions"])
        a, b = p0["actions"], p1["actions"]
        lower_wins = np.where(a < b, 1.0, -1.0)
        higher_wins = -lower_wins
        r0 = np.where(a == b, 0.0, np.where((a + b) % 2 == 0, lower_wins, higher_wins))
        np.testing.assert_array_equal(p0["rewards"], r0)
        np.testing.assert_array_equal(p1["rewards"], -r0)
        assert metrics[ep]["agent_rewards"][("player_0", "player_0")] == r0.sum()
        assert metrics[ep]["agent_rewards"][("player_1", "player_1")] == -r0.sum()


class NoResetCounter(AECEnv):
    """An AECEnv that gives the mover 1 per move but never restarts its cumulative reward
    when it acts (like tictactoe, which only rewards at the end): the adapter does it."""

    metadata = {"name": "no_reset_counter_v0"}

    def __init__(self, moves: int = 3):
        self.possible_agents = ["x", "y"]
        self.moves = moves

    def observation_space(self, agent):
        return gym.spaces.Discrete(10)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def observe(self, agent):
        return self.t

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "x"

    def step(self, action):
        if self.terminations[self.agent_selection]:
            self._was_dead_step(action)
            return
        self._clear_rewards()
        self.rewards[self.agent_selection] = 1.0
        self.t += 1
        if self.t >= 2 * self.moves:
            self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self.agent_selection = "y" if self.agent_selection == "x" else "x"


def test_aec_counts_rewards_once_when_the_env_does_not_restart_cumulative_rewards():
    env = from_pettingzoo(NoResetCounter(moves=3))
    log = run_adapter(env, 0, lambda a, o: 0)
    assert log["steps"] == 6
    assert dict(log["returns"]) == {"x": 3.0, "y": 3.0}
    assert log["end"] == (True, False)
