"""The last transition of an agent that ends without a final observation of its own: its
columns mean what they mean in every other transition (``rewards`` after the agent
pipeline, ``new_prev_*`` what the agent would be fed next), checked against a hand
computation."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from cases import trajectories

import rlconnect as rc

LIMIT = 30.0  # ClipReward's limit: the rows' rewards stay under it, the closing ones not


class WaitingAgent(rc.MultiAgentEnv):
    """``a`` acts at every step; ``b`` at every step up to t=4 (``turns=False``: the agents
    act together) or at even steps only (t = 0, 2, 4: in turns), and never after t=4. At
    step t ``b`` is rewarded ``2**t``, also while it waits, ``a`` 1. ``end`` says how
    ``b``'s trajectory ends, with no observation of its own after t=4:

    - ``"all"``: the episode ends (``__all__`` terminated) at t=6, only ``a`` observing;
    - ``"leave"``: ``b`` is terminated at t=5 while it waits; the episode ends at t=6;
    - ``"horizon"``: the runner's horizon (5) truncates the episode at t=5.
    """

    possible_agents = ["a", "b"]

    def __init__(self, end: str, turns: bool) -> None:
        box = gym.spaces.Box(-100, 100, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(3))
        self.end, self.turns = end, turns
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        waits = self.t > 4 or (self.turns and self.t % 2)
        agents = ["a"] if waits else ["a", "b"]
        return {a: np.array([ord(a) - ord("a"), self.t], np.float32) for a in agents}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, actions: dict):
        self.t += 1
        rewards: dict[str, Any] = {"a": 1.0}
        if not (self.end == "leave" and self.t > 5):
            rewards["b"] = float(2**self.t)
        term: dict[str, Any] = {"__all__": self.t >= 6}
        if self.end == "leave" and self.t == 5:
            term["b"] = True
        return self._obs(), rewards, term, {"__all__": False}, {}


class TurnPolicy(rc.RandomPolicy):
    """Acts ``(t // 2) % 3`` at step t (``obs[:, 1]``)."""

    def compute_actions(self, input_batch, explore=True):
        t = np.asarray(input_batch["obs"])[:, 1].astype(np.int64)
        return (t // 2) % 3, [], {}


def _pipeline(order: str, limit: float = LIMIT):
    def make(ctx):
        members = {
            "prev": [rc.PrevActionsRewards(ctx)],
            "prev_clip": [rc.PrevActionsRewards(ctx), rc.ClipReward(ctx, limit=limit)],
            "clip_prev": [rc.ClipReward(ctx, limit=limit), rc.PrevActionsRewards(ctx)],
        }[order]
        return rc.AgentConnectorPipeline(ctx, members)

    return make


def _b_trajectory(end: str, turns: bool, order: str) -> rc.SampleBatch:
    env = WaitingAgent(end, turns)
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    config = rc.RunnerConfig(
        rollout_fragment_length=6,
        batch_mode="complete_episodes",
        horizon=5 if end == "horizon" else None,
        seed=0,
    )
    runner = rc.EnvRunner(
        lambda ctx: WaitingAgent(end, turns),
        TurnPolicy(space, act),
        config=config,
        agent_pipelines={"default_policy": _pipeline(order)},
        learner_pipelines={"default_policy": lambda ctx: [rc.NStepReturns(ctx, n=2)]},
    )
    try:
        batch = runner.sample()
    finally:
        runner.stop()
    pb = batch.policy_batches["default_policy"]
    (b,) = [tr for tr in trajectories(pb) if tr["obs"][0, 0] == 1 and tr["eps_id"][0] == 0]
    return b


@pytest.mark.parametrize("end", ["all", "leave", "horizon"])
@pytest.mark.parametrize("turns", [True, False])
@pytest.mark.parametrize("order", ["prev", "prev_clip", "clip_prev"])
def test_closing_transition_holds_what_the_agent_would_be_fed_next(end, turns, order):
    b = _b_trajectory(end, turns, order)
    # by hand: b's steps, its actions there, the rewards it got since its previous step
    steps = [0, 2, 4] if turns else [0, 1, 2, 3, 4]
    acts = [(t // 2) % 3 for t in steps]
    got = [sum(2.0**s for s in range(p + 1, t + 1)) for p, t in pairwise(steps)]
    assert max(got) < LIMIT  # (the rows' rewards are not clipped; the closing ones are)
    closing = {"all": 32.0 + 64.0, "leave": 32.0, "horizon": 32.0}[end]  # t = 5 (and 6)
    clip = order != "prev"
    recorded = min(closing, LIMIT) if clip else closing  # what every row records
    fed = min(closing, LIMIT) if order == "clip_prev" else closing  # what b would see
    rewards = [*got, recorded]
    assert b["t"].tolist() == steps
    assert b["actions"].tolist() == acts
    assert b["prev_actions"].tolist() == [0, *acts[:-1]]
    assert b["prev_rewards"].tolist() == [0.0, *got]
    assert b["rewards"].tolist() == rewards
    # what b is, or would be, fed at its next step: its last action, the reward since
    assert b["new_prev_actions"].tolist() == acts
    assert b["new_prev_rewards"].tolist() == [*got, fed]
    assert b["new_prev_rewards"].dtype == b["prev_rewards"].dtype == np.float32
    assert b["new_prev_actions"].dtype == b["prev_actions"].dtype
    # no observation is made up: the last one stands for the next
    np.testing.assert_array_equal(b["new_obs"][-1], b["obs"][-1])
    np.testing.assert_array_equal(b["new_obs"][:-1], b["obs"][1:])
    n = len(steps)
    assert b["terminateds"].tolist() == [False] * (n - 1) + [end != "horizon"]
    assert b["truncateds"].tolist() == [False] * (n - 1) + [end == "horizon"]
    assert list(b["infos"][-1]) == []
    # n-step targets (n=2) bootstrap from the same inputs
    reach = [min(i + 1, n - 1) for i in range(n)]
    assert b["n_step_new_prev_actions"].tolist() == [acts[k] for k in reach]
    assert b["n_step_new_prev_rewards"].tolist() == [[*got, fed][k] for k in reach]
    want = [r + (0.99 * rewards[i + 1] if i + 1 < n else 0.0) for i, r in enumerate(rewards)]
    assert b["n_step_rewards"].tolist() == pytest.approx(want)


class Moves(rc.RandomPolicy):
    """Plays ``moves`` in order, one per call (one agent moves per poll in turns)."""

    def __init__(self, *args, moves: list[int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moves = iter(moves)

    def compute_actions(self, input_batch, explore=True):
        return np.array([next(self.moves) for _ in range(len(input_batch["obs"]))]), [], {}


@pytest.mark.parametrize("order", ["prev", "prev_clip"])
def test_turn_based_pettingzoo_agent_waiting_at_the_horizon(order):
    """rock-paper-scissors in turns (PettingZoo AEC): the horizon cuts the episode after
    player_1's second move, while player_0 holds the turn; player_1, waiting for its own
    turn, closes with the second round's reward (a tie) and its second move."""
    pytest.importorskip("pygame")  # (pettingzoo.classic imports it)
    rps_v2 = pytest.importorskip("pettingzoo.classic.rps_v2")
    raw = rps_v2.env()
    ospace, aspace = raw.observation_space("player_0"), raw.action_space("player_0")
    # rock (0) loses to paper (1): player_1 gets +1 at t=2; scissors (2) ties at t=4
    policy = Moves(ospace, aspace, moves=[0, 1, 2, 2])
    runner = rc.EnvRunner(
        lambda ctx: rps_v2.env(),
        policy,
        config=rc.RunnerConfig(
            rollout_fragment_length=4, batch_mode="complete_episodes", horizon=4, seed=0
        ),
        agent_pipelines={"default_policy": _pipeline(order, limit=0.5)},
    )
    try:
        pb = runner.sample().policy_batches["default_policy"]
    finally:
        runner.stop()
    p1 = pb.take(np.flatnonzero((pb["eps_id"] == pb["eps_id"][0]) & (pb["agent_index"] == 1)))
    assert p1["t"].tolist() == [1, 3] and p1["actions"].tolist() == [1, 2]
    won = 0.5 if order == "prev_clip" else 1.0
    assert p1["rewards"].tolist() == [won, 0.0]
    assert p1["prev_rewards"].tolist() == [0.0, 1.0]
    assert p1["new_prev_actions"].tolist() == [1, 2]  # (copied from its last row: [1, 1])
    assert p1["new_prev_rewards"].tolist() == [1.0, 0.0]  # (copied: [1.0, 1.0])
    assert p1["truncateds"].tolist() == [False, True]
    assert not p1["terminateds"].any()


class ValuesSeen(rc.MLPPolicy):
    """An MLPPolicy that keeps the input of every ``compute_values`` call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.values_inputs: list[dict[str, Any]] = []

    def compute_values(self, input_batch):
        self.values_inputs.append({k: np.array(v) for k, v in input_batch.items()})
        return super().compute_values(input_batch)


def test_gae_bootstraps_a_closing_agent_cut_by_the_horizon_from_its_next_inputs():
    """``b`` waits for its turn when the horizon truncates the episode: GAE bootstraps its
    last transition from its last observation, with its last action and the reward since
    (unclipped: PrevActionsRewards sees it before ClipReward) as the policy's next inputs."""
    env = WaitingAgent("horizon", turns=True)
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    policy = ValuesSeen(space, act, hiddens=(8,), vf_head=True, seed=0)
    runner = rc.EnvRunner(
        lambda ctx: WaitingAgent("horizon", turns=True),
        policy,
        config=rc.RunnerConfig(
            rollout_fragment_length=5, batch_mode="complete_episodes", horizon=5, seed=0
        ),
        agent_pipelines={"default_policy": _pipeline("prev_clip")},
        learner_pipelines={"default_policy": lambda ctx: [rc.GAE(ctx)]},
    )
    try:
        pb = runner.sample().policy_batches["default_policy"]
    finally:
        runner.stop()
    boot = policy.values_inputs[-1]  # the one call: the rows' values are recorded already
    first = pb["eps_id"] == pb["eps_id"][0]
    b = pb.take(np.flatnonzero(first & (pb["obs"][:, 0] == 1)))
    assert b["truncateds"].tolist() == [False, False, True]
    (k,) = np.flatnonzero(boot["obs"][:, 0] == 1)  # b's row among the bootstrapped ones
    np.testing.assert_array_equal(boot["obs"][k], b["obs"][-1])
    assert boot["prev_actions"][k] == b["actions"][-1]
    assert boot["prev_rewards"][k] == 32.0 and b["rewards"][-1] == LIMIT
