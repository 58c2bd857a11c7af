"""The recorded RNN state is exact on every path, checked by an oracle from the batches alone.

The oracle does not re-read the connector that keeps the state. The envs put into every
observation what the state must be: ``[uid, agent, k]``, with ``uid`` unique to the episode
(across sub-envs, workers and rebuilt envs), ``agent`` the acting agent's code and ``k`` the
number of turns that agent took before in this episode. ``OraclePolicy`` is a recurrent
policy whose output state is ``[uid, agent, count + 1]`` of the row it was called for
(``count`` read from its input state) and a second, int64 state ``[count + 1]``. So, for every
recorded row: the input state is the initial one exactly when ``k == 0``, and otherwise
carries this episode's uid, this agent and the count ``k``; a state from another episode, env
or agent, a zeroed, missing or shifted state, or one kept over a reset or a restart, breaks
one of these equalities. The oracle also checks ``state_in[t] == state_out[t-1]`` row by row
within each trajectory and across batches.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pettingzoo
import pytest
import torch

import rlconnect as rc
from rlconnect.errors import EnvError
from rlconnect.serve import PolicyClient, PolicyServer

BOX = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
INITIAL = [np.array([-1.0, -1.0, 0.0]), np.array([0], np.int64)]
_EPISODES = itertools.count()


def new_uid() -> float:
    """An id no other episode of this test run has (the process id keeps workers apart)."""
    return float(os.getpid() * 2**20 + next(_EPISODES))


class OraclePolicy(rc.Policy):
    """Recurrent and deterministic in its state: see the module docstring."""

    def get_initial_state(self) -> list[np.ndarray]:
        return [s.copy() for s in INITIAL]

    def compute_actions(self, input_batch: Any, explore: bool = True) -> rc.policy.PolicyOutput:
        obs = np.asarray(input_batch["obs"])
        count = np.asarray(input_batch["state_in_0"])[:, 2]
        out0 = np.column_stack([obs[:, 0], obs[:, 1], count + 1])
        out1 = np.asarray(input_batch["state_in_1"]) + 1
        return self.np_random.integers(0, 2, len(obs)), [out0, out1], {}


class UidEnv(gym.Env):
    """Episodes of 1-9 steps (ending terminated or truncated); observations ``[uid, 0, k]``.

    ``fail_in`` (episode number, step) makes that step raise."""

    observation_space = BOX
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_in: tuple[int, int] | None = None) -> None:
        self.fail_in = fail_in
        self.episode = -1
        self.rng = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.uid, self.k, self.episode = new_uid(), 0, self.episode + 1
        self.length = int(self.rng.integers(1, 10))
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.uid, 0.0, self.k])

    def step(self, action):
        if self.fail_in == (self.episode, self.k):
            raise RuntimeError("sub-env failed on purpose")
        self.k += 1
        end = self.k >= self.length
        return self._obs(), 1.0, end and self.length % 2 == 0, end and self.length % 2 == 1, {}


def make_uid_env(ctx: rc.EnvContext) -> gym.Env:
    return UidEnv()


def make_flaky_uid_env(ctx: rc.EnvContext) -> gym.Env:
    """Sub-env 1 raises at step 2 of its second episode, in its first build only (a rebuilt
    sub-env gets another seed)."""
    first_build = ctx.seed == 21 + ctx.vector_index
    return UidEnv(fail_in=(1, 2) if ctx.vector_index == 1 and first_build else None)


class StateOracle:
    """Checks the recorded states of successive batches of one runner (see the module)."""

    def __init__(self) -> None:
        self.last_out: dict[tuple[int, int], list[np.ndarray]] = {}
        self.rows = self.starts = self.carried = 0

    def check(self, batch: rc.SampleBatch | rc.MultiAgentBatch) -> None:
        if isinstance(batch, rc.MultiAgentBatch):
            for policy_batch in batch.policy_batches.values():
                self.check(policy_batch)
            return
        obs, k = batch["obs"], batch["obs"][:, 2]
        s_in = [batch["state_in_0"], batch["state_in_1"]]
        s_out = [batch["state_out_0"], batch["state_out_1"]]
        first = k == 0
        # what the policy was called with: the initial state exactly at a first turn...
        for s, init in zip(s_in, INITIAL, strict=True):
            assert s.dtype == init.dtype
            np.testing.assert_array_equal(s[first], np.broadcast_to(init, s[first].shape))
        # ... else the state of this episode's uid and this agent after k turns
        np.testing.assert_array_equal(s_in[0][~first, :2], obs[~first, :2])
        np.testing.assert_array_equal(s_in[0][:, 2], k)
        np.testing.assert_array_equal(s_in[1][:, 0], k)
        # what it returned for this row
        np.testing.assert_array_equal(s_out[0], np.column_stack([obs[:, :2], k + 1]))
        self._check_links(batch, s_in, s_out)
        self.rows += len(batch)
        self.starts += int(first.sum())

    def _check_links(self, batch: rc.SampleBatch, s_in: list, s_out: list) -> None:
        """``state_in[t] == state_out[t-1]`` within each trajectory and across batches."""
        agent = batch["agent_index"] if "agent_index" in batch else np.zeros(len(batch), int)
        for key in sorted(set(zip(batch["eps_id"].tolist(), agent.tolist(), strict=True))):
            rows = np.flatnonzero((batch["eps_id"] == key[0]) & (agent == key[1]))
            rows = rows[np.argsort(batch["t"][rows])]
            for a, b in zip(s_in, s_out, strict=True):
                np.testing.assert_array_equal(a[rows[1:]], b[rows[:-1]])
            if key in self.last_out:
                self.carried += 1
                for a, prev in zip(s_in, self.last_out[key], strict=True):
                    np.testing.assert_array_equal(a[rows[0]], prev)
            else:  # a trajectory seen for the first time starts at its first turn
                assert batch["obs"][rows[0], 2] == 0, f"trajectory {key} starts mid-way"
            self.last_out[key] = [b[rows[-1]] for b in s_out]


def oracle_runner(env: Any, *, n: int = 3, frag: int = 5, **cfg: Any) -> rc.EnvRunner:
    policy = OraclePolicy(BOX, gym.spaces.Discrete(2), seed=0)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=21, **cfg)
    return rc.EnvRunner(env, policy, config=config)


def sample_checked(runner: rc.EnvRunner, times: int, oracle: StateOracle | None = None):
    oracle = oracle or StateOracle()
    try:
        for _ in range(times):
            oracle.check(runner.sample())
    finally:
        runner.stop()
    return oracle


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"batch_mode": "complete_episodes"},
        {"frag": 1},
        {"num_env_workers": 2},
        {"num_env_workers": 2, "env_poll_size": 1},
        {"num_env_workers": 3, "env_poll_size": 2, "n": 4},
        {"remote_envs": True},
        {"sample_async": True},
    ],
    ids=[
        "in_process",
        "complete_episodes",
        "fragment_1",
        "workers",
        "poll_1",
        "poll_2_of_4",
        "remote_envs",
        "sample_async",
    ],
)
def test_states_are_exact_across_fragments_batches_workers_and_polls(cfg: dict) -> None:
    oracle = sample_checked(oracle_runner(make_uid_env, **cfg), 6)
    assert oracle.starts > 2 and oracle.rows >= 6 * 3
    if cfg.get("batch_mode") != "complete_episodes":
        assert oracle.carried > 0  # some trajectories went on across batches


def test_negative_control_a_shifted_state_is_caught() -> None:
    runner = oracle_runner(make_uid_env)
    batch = runner.sample()
    runner.stop()
    StateOracle().check(batch)
    shifted = batch.copy()
    shifted["state_in_0"] = np.roll(batch["state_in_0"], 1, axis=0)
    with pytest.raises(AssertionError):
        StateOracle().check(shifted)
    zeroed = batch.copy()
    zeroed["state_in_1"] = np.zeros_like(batch["state_in_1"])
    with pytest.raises(AssertionError):
        StateOracle().check(zeroed)


def test_states_survive_restore_set_weights_and_set_connector_states(tmp_path) -> None:
    runner = oracle_runner(make_uid_env, frag=4)
    oracle = StateOracle()
    try:
        oracle.check(runner.sample())
        runner.save_checkpoint(tmp_path / "ckpt")
        oracle.check(runner.sample())
        runner.restore(tmp_path / "ckpt")  # running episodes keep their state
        oracle.check(runner.sample())
        runner.set_weights(runner.get_weights())
        oracle.check(runner.sample())
        runner.set_connector_states(runner.get_connector_states())
        oracle.check(runner.sample())
    finally:
        runner.stop()
    assert oracle.carried >= 4


def test_a_restarted_sub_env_starts_from_the_initial_state() -> None:
    runner = oracle_runner(make_flaky_uid_env, frag=6, restart_failed_sub_environments=True)
    oracle = sample_checked(runner, 5)
    assert oracle.rows == 5 * 18


def test_a_replaced_worker_starts_its_episodes_from_the_initial_state() -> None:
    before = {p.pid for p in multiprocessing.active_children()}
    runner = oracle_runner(
        make_uid_env, n=4, frag=5, num_env_workers=2, restart_failed_sub_environments=True
    )
    oracle = StateOracle()
    try:
        oracle.check(runner.sample())
        workers = {p.name: p.pid for p in multiprocessing.active_children() if p.pid not in before}
        os.kill(workers["rlconnect-env-worker-1"], signal.SIGKILL)
        for _ in range(3):
            oracle.check(runner.sample())
        faulty = [m for m in runner.get_metrics() if m["episode_faulty"]]
    finally:
        runner.stop()
    assert sorted(m["env_id"] for m in faulty) == [2, 3]


# -- turn-based PettingZoo agents -----------------------------------------------------------


class TurnTaking(pettingzoo.AECEnv):
    """Agents ``a``, ``b``, ``c`` move in turn; each is done after 1-5 of its own turns, and
    all are done (some during another's turn) once 2-11 turns were taken in all."""

    metadata = {"name": "turn_taking_v0"}
    CODES = {"a": 1.0, "b": 2.0, "c": 3.0}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b", "c"]
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> gym.Space:
        return BOX

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.uid, self.CODES[agent], self.turns[agent]])

    def reset(self, seed=None, options=None) -> None:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.uid = new_uid()
        self.agents = list(self.possible_agents)
        self.turns = dict.fromkeys(self.agents, 0)
        self.lives = {a: int(self.rng.integers(1, 6)) for a in self.agents}
        self.cap = int(self.rng.integers(2, 12))
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict] = {a: {} for a in self.agents}
        self.agent_selection = "a"

    def step(self, action) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            self._was_dead_step(action)
            return
        self._clear_rewards()
        self.turns[mover] += 1
        self.rewards[mover] = 1.0
        self.terminations[mover] = self.turns[mover] >= self.lives[mover]
        if sum(self.turns.values()) >= self.cap:
            self.truncations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        live = [a for a in self.agents if not (self.terminations[a] or self.truncations[a])]
        order = self.possible_agents
        after = order[order.index(mover) + 1 :] + order[: order.index(mover) + 1]
        self.agent_selection = next((a for a in after if a in live), mover)
        self._deads_step_first()


@pytest.mark.parametrize("cfg", [{}, {"num_env_workers": 2}], ids=["in_process", "workers"])
def test_turn_based_agents_each_get_their_own_previous_state(cfg: dict) -> None:
    runner = oracle_runner(lambda ctx: TurnTaking(), frag=4, **cfg)
    oracle = sample_checked(runner, 6)
    assert oracle.starts > 10 and oracle.carried > 0


# -- the LSTM policy: recomputing from the stored states reproduces the batch -----------------


def turn_based_env(ctx: rc.EnvContext) -> TurnTaking:
    return TurnTaking()


@pytest.mark.parametrize(
    ("env", "cfg"),
    [
        ("CartPole-v1", {}),
        ("CartPole-v1", {"num_env_workers": 2, "env_poll_size": 1}),
        (turn_based_env, {"observation_filter": "MeanStdFilter"}),  # uids of unit scale
    ],
    ids=["in_process", "poll_1", "turn_based"],
)
def test_lstm_recomputation_from_stored_states_reproduces_the_batch(env: Any, cfg: dict) -> None:
    obs_space = gym.spaces.Box(-10, 10, (3,)) if callable(env) else gym.make(env).observation_space
    policy = rc.LSTMPolicy(obs_space, gym.spaces.Discrete(2), vf_head=True, seed=3)
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=30, seed=3, **cfg)
    runner = rc.EnvRunner(env, policy, config=config)
    try:
        samples = [runner.sample() for _ in range(2)]
    finally:
        runner.stop()
    for sample in samples:
        batches = getattr(sample, "policy_batches", {"default_policy": sample}).values()
        for batch in batches:  # a multi-agent policy batch: pieces per agent_index too
            seq = rc.chop_into_sequences(batch, 7)
            with torch.no_grad():
                dist, _, values = policy.model.forward_sequences(
                    torch.from_numpy(seq["obs"]),
                    [torch.from_numpy(seq["state_in_0"]), torch.from_numpy(seq["state_in_1"])],
                    torch.from_numpy(seq.mask),
                )
            unpadded = seq.unpad(dist.numpy())
            np.testing.assert_allclose(unpadded, batch["action_dist_inputs"], rtol=0, atol=1e-5)
            np.testing.assert_allclose(
                seq.unpad(values.numpy()), batch["vf_preds"], rtol=0, atol=1e-5
            )


def test_inference_under_an_env_id_carries_the_lstm_state_from_call_to_call() -> None:
    """As for an episode served step by step: the runner's compute_single_action under one
    env_id equals feeding the policy its own state back; without env_id each call is a
    fresh episode start."""
    env = gym.make("CartPole-v1")
    policy = rc.LSTMPolicy(env.observation_space, env.action_space, cell_size=8, seed=5)
    runner = rc.EnvRunner("CartPole-v1", policy, config=rc.RunnerConfig(seed=0))
    observations = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    state = policy.get_initial_state()
    carried, fresh, by_hand, from_start = [], [], [], []
    for obs in observations:
        action, state, _ = policy.compute_single_action(obs, state, explore=False)
        by_hand.append(int(action))
        from_start.append(int(policy.compute_single_action(obs, explore=False)[0]))
        carried.append(int(runner.compute_single_action(obs, env_id=100)))
        fresh.append(int(runner.compute_single_action(obs)))
    runner.stop()
    assert carried == by_hand
    assert fresh == from_start
    assert carried != fresh  # the state matters for these weights


def test_served_episodes_each_keep_their_own_state() -> None:
    """Episodes served over HTTP to concurrent clients: each keeps its own state."""
    config = rc.RunnerConfig(batch_mode="complete_episodes", rollout_fragment_length=1)
    server = PolicyServer(OraclePolicy(BOX, gym.spaces.Discrete(2), seed=0), config=config, port=0)
    batches: list[rc.SampleBatch] = []

    def sample() -> None:
        while True:
            try:
                batches.append(server.runner.sample())
            except EnvError:  # the server was stopped
                return

    def play(length: int) -> None:
        client = PolicyClient(server.url)
        eid, uid = client.start_episode(), new_uid()
        for k in range(length):
            client.get_action(eid, np.array([uid, 0.0, k]))
            client.log_returns(eid, 1.0)
        client.end_episode(eid, np.array([uid, 0.0, length]))
        client.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    players = [threading.Thread(target=play, args=(n,)) for n in (5, 7, 3, 6)]
    for p in players:
        p.start()
    for p in players:
        p.join(30)
    deadline = time.monotonic() + 30
    while sum(len(b) for b in list(batches)) < 21 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop()
    sampler.join(10)
    oracle = StateOracle()
    for batch in list(batches):
        oracle.check(batch)
    assert oracle.rows == 21 and oracle.starts == 4
