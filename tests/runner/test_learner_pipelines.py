"""Learner pipelines in the runner, on batches the runner really built: every way a
trajectory ends (termination, truncation by the horizon, cut at the batch boundary), in
the runner's process, with env workers and asynchronous polls, a recurrent policy and
turn-based agents under two policies, compared with plain per-trajectory references."""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces.utils import flatten_space

import rlconnect as rc
from rlconnect.cli.describe import describe_path

GAMMA, LAMBDA = 0.97, 0.9
CARTPOLE = gym.make("CartPole-v1")
OBS, ACT = CARTPOLE.observation_space, CARTPOLE.action_space


def gae_pipeline(ctx: rc.ConnectorContext) -> list[rc.LearnerConnector]:
    return [
        rc.GAE(ctx, gamma=GAMMA, lambda_=LAMBDA),
        rc.DiscountedReturns(ctx, gamma=GAMMA),
    ]


# -- plain references: one trajectory at a time, one row at a time ------------------------
def trajectories(batch: rc.SampleBatch) -> list[np.ndarray]:
    """Row indices of each trajectory: runs of one (eps_id, agent_index)."""
    key = list(zip(batch["eps_id"].tolist(), np.broadcast_to(batch["agent_index"], len(batch))))
    out, start = [], 0
    for i in range(1, len(key) + 1):
        if i == len(key) or key[i] != key[start]:
            out.append(np.arange(start, i))
            start = i
    return out


def bootstrap(batch: rc.SampleBatch, policy: rc.Policy, last: int) -> float:
    """The value after a trajectory's last row: 0 after a termination, else V(new_obs)
    from that row's state_out (recurrent)."""
    if batch["terminateds"][last]:
        return 0.0
    row = {"obs": batch["new_obs"][last : last + 1]}
    for i in range(policy.num_state_tensors()):
        row[f"state_in_{i}"] = batch[f"state_out_{i}"][last : last + 1]
    return float(policy.compute_values(row)[0])


def reference(batch: rc.SampleBatch, policy: rc.Policy) -> dict[str, np.ndarray]:
    adv, ret = np.zeros(len(batch)), np.zeros(len(batch))
    rewards, values = batch["rewards"].astype(np.float64), batch["vf_preds"].astype(np.float64)
    for rows in trajectories(batch):
        boot = bootstrap(batch, policy, int(rows[-1]))
        running_adv, running_ret = 0.0, boot
        for k in range(len(rows) - 1, -1, -1):
            t = rows[k]
            next_value = values[rows[k + 1]] if k + 1 < len(rows) else boot
            delta = rewards[t] + GAMMA * next_value - values[t]
            running_adv = delta + GAMMA * LAMBDA * running_adv
            running_ret = rewards[t] + GAMMA * running_ret
            adv[t], ret[t] = running_adv, running_ret
    return {"advantages": adv, "value_targets": adv + values, "returns": ret}


def ends(batches: list[rc.SampleBatch]) -> dict[str, int]:
    """How the trajectories of ``batches`` end: terminations, truncations, cuts."""
    count = {"terminated": 0, "truncated": 0, "cut": 0}
    for b in batches:
        for rows in trajectories(b):
            last = int(rows[-1])
            if b["terminateds"][last]:
                count["terminated"] += 1
            elif b["truncateds"][last]:
                count["truncated"] += 1
            else:
                count["cut"] += 1
    return count


def check(batches: list[rc.SampleBatch], policy: rc.Policy) -> None:
    for b in batches:
        want = reference(b, policy)
        for col, value in want.items():
            assert b[col].dtype == np.float32, col
            np.testing.assert_allclose(b[col], value, rtol=1e-4, atol=1e-4, err_msg=col)
    assert all(ends(batches).values()), ends(batches)  # every kind of end was checked


def cartpole_runner(policy: rc.Policy | None = None, **cfg: Any) -> rc.EnvRunner:
    base = {"num_envs": 3, "rollout_fragment_length": 25, "seed": 0, "horizon": 18}
    return rc.EnvRunner(
        "CartPole-v1",
        policy or rc.MLPPolicy(OBS, ACT, hiddens=(16,), vf_head=True, seed=0),
        config=rc.RunnerConfig(**{**base, **cfg}),
        learner_pipelines={"default_policy": gae_pipeline},
    )


@pytest.mark.parametrize(
    "cfg",
    [{}, {"num_env_workers": 2}, {"num_env_workers": 3, "env_poll_size": 1}],
    ids=["in-process", "env-workers", "async-polls"],
)
def test_gae_and_returns_equal_per_trajectory_references(cfg):
    runner = cartpole_runner(**cfg)
    try:
        batches = [runner.sample() for _ in range(4)]
        check(batches, runner.policies["default_policy"])
    finally:
        runner.stop()


def test_sample_async_batches_get_the_learning_signal_too():
    runner = cartpole_runner(sample_async=True)
    try:
        batches = [runner.sample() for _ in range(4)]  # the policy is not changed meanwhile
        check(batches, runner.policies["default_policy"])
    finally:
        runner.stop()


def test_recurrent_policy_bootstraps_from_state_out():
    policy = rc.LSTMPolicy(OBS, ACT, hiddens=(8,), cell_size=8, vf_head=True, seed=1)
    runner = cartpole_runner(policy, num_envs=2)
    try:
        batches = [runner.sample() for _ in range(4)]
        check(batches, policy)
        # a state_out of zeros would give other bootstrap values: the state mattered
        b = batches[-1]
        last = [int(r[-1]) for r in trajectories(b) if not b["terminateds"][r[-1]]]
        zero = {"obs": b["new_obs"][last], "state_in_0": 0 * b["state_out_0"][last]}
        zero["state_in_1"] = 0 * b["state_out_1"][last]
        with_state = {"obs": b["new_obs"][last], "state_in_0": b["state_out_0"][last]}
        with_state["state_in_1"] = b["state_out_1"][last]
        assert not np.allclose(policy.compute_values(zero), policy.compute_values(with_state))
    finally:
        runner.stop()


def test_turn_based_agents_under_two_policies():
    from pettingzoo.classic import tictactoe_v3
    from pettingzoo.utils.env_logger import EnvLogger

    EnvLogger.suppress_output()
    raw = tictactoe_v3.env()
    policies = {}
    for i, a in enumerate(raw.possible_agents):  # what FlattenObservations outputs
        flat = flatten_space(raw.observation_space(a))
        obs = gym.spaces.Box(0.0, 1.0, flat.shape, np.float32)
        policies[a] = rc.MLPPolicy(obs, raw.action_space(a), vf_head=True, seed=i)
    config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=7, seed=0, horizon=5)
    runner = rc.EnvRunner(
        lambda ctx: tictactoe_v3.env(),
        policies,
        policy_mapping_fn=lambda agent_id, episode, **kw: agent_id,
        config=config,
        learner_pipelines=dict.fromkeys(policies, gae_pipeline),
    )
    try:
        per_policy: dict[str, list[rc.SampleBatch]] = {a: [] for a in policies}
        for _ in range(6):
            out = runner.sample()
            assert isinstance(out, rc.MultiAgentBatch)
            for pid, b in out.policy_batches.items():
                per_policy[pid].append(b)
    finally:
        runner.stop()
    for pid, batches in per_policy.items():
        check(batches, policies[pid])  # discounting per own turn, per agent trajectory


def test_a_policy_without_what_the_pipeline_needs_is_refused_at_construction():
    with pytest.raises(ValueError, match="GAE") as info:
        rc.EnvRunner(
            "CartPole-v1",
            rc.MLPPolicy(OBS, ACT, hiddens=(8,)),  # no value head
            learner_pipelines={"default_policy": gae_pipeline},
        )
    assert "default_policy" in str(info.value) and "vf_head" in str(info.value)
    with pytest.raises(ValueError, match=r"not one of the runner.s policies"):
        rc.EnvRunner("CartPole-v1", rc.RandomPolicy(OBS, ACT), learner_pipelines={"x": []})


def test_live_pipeline_is_empty_by_default_editable_and_checked():
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(OBS, ACT, hiddens=(8,), vf_head=True, seed=0),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0),
    )
    try:
        pipe = runner.learner_pipeline()
        assert isinstance(pipe, rc.LearnerConnectorPipeline) and len(pipe) == 0
        assert "advantages" not in runner.sample()
        pipe.append(rc.GAE(pipe.ctx))
        pipe.append(rc.NormalizeAdvantages(pipe.ctx))
        batch = runner.sample()
        assert abs(float(batch["advantages"].mean())) < 1e-5
        assert abs(float(batch["advantages"].std()) - 1.0) < 1e-3
        np.testing.assert_allclose(
            batch["value_targets"] - batch["vf_preds"],
            reference_advantages(batch, runner.policies["default_policy"]),
            rtol=1e-4,
            atol=1e-4,
        )
    finally:
        runner.stop()


def reference_advantages(batch: rc.SampleBatch, policy: rc.Policy) -> np.ndarray:
    """Un-normalised GAE(0.99, 0.95) of ``batch``."""
    global GAMMA, LAMBDA
    saved = GAMMA, LAMBDA
    GAMMA, LAMBDA = 0.99, 0.95
    try:
        return reference(batch, policy)["advantages"]
    finally:
        GAMMA, LAMBDA = saved


def test_checkpoints_keep_the_learner_pipeline_and_inspect_shows_it(tmp_path):
    runner = cartpole_runner()
    try:
        runner.sample()
        runner.save_checkpoint(tmp_path / "ck")
    finally:
        runner.stop()
    plain = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(OBS, ACT, hiddens=(16,), vf_head=True, seed=3),
        config=rc.RunnerConfig(num_envs=3, rollout_fragment_length=25, seed=0, horizon=18),
    )
    try:
        assert plain.learner_pipeline().names == []
        plain.restore(tmp_path / "ck")
        assert plain.learner_pipeline().names == ["GAE", "DiscountedReturns"]
        check([plain.sample() for _ in range(3)], plain.policies["default_policy"])
    finally:
        plain.stop()
    rebuilt = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")
    try:
        pipe = rebuilt.learner_pipeline()
        assert pipe.names == ["GAE", "DiscountedReturns"]
        assert pipe["GAE"].params == {"gamma": GAMMA, "lambda_": LAMBDA}
        check([rebuilt.sample() for _ in range(3)], rebuilt.policies["default_policy"])
    finally:
        rebuilt.stop()
    shown = json.dumps(describe_path(str(tmp_path / "ck")), default=str)
    assert "learner_pipeline" in shown and "DiscountedReturns" in shown


def test_a_saved_learner_pipeline_that_the_policy_cannot_run_is_refused(tmp_path):
    runner = cartpole_runner()
    runner.save_checkpoint(tmp_path / "ck")
    runner.stop()
    no_values = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(OBS, ACT, hiddens=(16,), seed=0),
        config=rc.RunnerConfig(num_envs=3, rollout_fragment_length=25, seed=0),
    )
    try:
        with pytest.raises(rc.CheckpointError):  # the architectures differ already
            no_values.restore(tmp_path / "ck")
        assert no_values.learner_pipeline().names == []
    finally:
        no_values.stop()


def test_offline_batches_read_back_give_the_same_learning_signal(tmp_path):
    runner = cartpole_runner(output=str(tmp_path / "out"))
    try:
        sampled = [runner.sample() for _ in range(3)]
    finally:
        runner.stop()
    policy = runner.policies["default_policy"]
    pipe = runner.learner_pipeline()
    read = list(rc.read_batches(tmp_path / "out"))
    assert len(read) == len(sampled)
    for got, want in zip(read, sampled):
        assert "advantages" not in got  # the files hold what was sampled
        got = pipe(got, policy)
        for col in ("advantages", "value_targets", "returns"):
            np.testing.assert_allclose(got[col], want[col], rtol=1e-5, atol=1e-5)
    check([pipe(b, policy) for b in read], policy)


def test_a_learner_error_loses_the_batch_but_not_the_runner():
    runner = cartpole_runner()
    try:
        runner.sample()
        runner.learner_pipeline().append(rc.NStepReturns(runner.learner_pipeline().ctx))
        runner.learner_pipeline().append(rc.NStepReturns(runner.learner_pipeline().ctx))
        with pytest.raises(ValueError, match="n_step"):  # the second would overwrite
            runner.sample()
        runner.learner_pipeline().remove(runner.learner_pipeline().names[-1])
        batch = runner.sample()
        assert "n_step_rewards" in batch and runner.failure is None
    finally:
        runner.stop()


def other_builtins(ctx: rc.ConnectorContext) -> list[rc.LearnerConnector]:
    return [
        rc.GAE(ctx, gamma=GAMMA, lambda_=LAMBDA),
        rc.DiscountedReturns(ctx, gamma=GAMMA),
        rc.NormalizeAdvantages(ctx),
        rc.NStepReturns(ctx, n=3, gamma=GAMMA),
        rc.VTrace(ctx, gamma=GAMMA),
    ]


def check_other_builtins(b: rc.SampleBatch, policy: rc.Policy) -> None:
    """NormalizeAdvantages, NStepReturns and VTrace against plain references. The policy
    is unchanged since sampling, so V-trace's ratios are 1: its targets are the
    bootstrapped discounted returns and its advantages ``r + gamma * v_next - V``."""
    want = reference(b, policy)
    adv = want["advantages"]
    np.testing.assert_allclose(b["advantages"], (adv - adv.mean()) / adv.std(), atol=1e-4)
    np.testing.assert_allclose(b["vtrace_targets"], want["returns"], rtol=1e-4, atol=1e-4)
    rewards, values = b["rewards"].astype(np.float64), b["vf_preds"].astype(np.float64)
    sums, disc, td = np.zeros(len(b)), np.zeros(len(b)), np.zeros(len(b))
    last_of = np.zeros(len(b), dtype=np.int64)
    for rows in trajectories(b):
        boot = bootstrap(b, policy, int(rows[-1]))
        for k, t in enumerate(rows):
            window = rows[k : k + 3]
            sums[t] = sum(GAMMA**i * rewards[r] for i, r in enumerate(window))
            last_of[t] = window[-1]
            ended = window[-1] == rows[-1] and b["terminateds"][rows[-1]]
            disc[t] = 0.0 if ended else GAMMA ** len(window)
            nxt = want["returns"][rows[k + 1]] if k + 1 < len(rows) else boot
            td[t] = rewards[t] + GAMMA * nxt - values[t]
    np.testing.assert_allclose(b["n_step_rewards"], sums, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b["n_step_discount"], disc, rtol=1e-6)
    np.testing.assert_array_equal(b["n_step_new_obs"], b["new_obs"][last_of])
    np.testing.assert_allclose(b["pg_advantages"], td, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cfg", [{}, {"num_env_workers": 2}], ids=["in-process", "env-workers"])
def test_n_step_vtrace_and_normalize_on_runner_batches(cfg):
    policy = rc.MLPPolicy(OBS, ACT, hiddens=(16,), vf_head=True, seed=0)
    base = {"num_envs": 3, "rollout_fragment_length": 25, "seed": 0, "horizon": 18}
    runner = rc.EnvRunner(
        "CartPole-v1",
        policy,
        config=rc.RunnerConfig(**{**base, **cfg}),
        learner_pipelines={"default_policy": other_builtins},
    )
    try:
        batches = [runner.sample() for _ in range(4)]
    finally:
        runner.stop()
    for b in batches:
        check_other_builtins(b, policy)
    assert all(ends(batches).values()), ends(batches)


class ValuesSeen(rc.MLPPolicy):
    """An MLPPolicy that keeps the input of every ``compute_values`` call (test only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.values_inputs: list[dict[str, Any]] = []

    def compute_values(self, input_batch):
        self.values_inputs.append({k: np.array(v) for k, v in input_batch.items()})
        return super().compute_values(input_batch)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_cut_bootstrap_gets_what_the_policy_is_fed_at_the_next_step(env_id):
    """PrevActionsRewards before ClipReward: the policy sees the unclipped reward as
    ``prev_rewards`` and its raw action as ``prev_actions``; the bootstrap input of a cut
    row equals the input of the row that continues its trajectory in the next batch."""
    env = gym.make(env_id)

    def agent_pipeline(ctx):
        return rc.AgentConnectorPipeline(
            ctx, [rc.PrevActionsRewards(ctx), rc.ClipReward(ctx, limit=0.5)]
        )

    policy = ValuesSeen(env.observation_space, env.action_space, hiddens=(8,), vf_head=True)
    runner = rc.EnvRunner(
        env_id,
        policy,
        config=rc.RunnerConfig(num_envs=3, rollout_fragment_length=9, seed=0),
        agent_pipelines={"default_policy": agent_pipeline},
        learner_pipelines={"default_policy": lambda ctx: [rc.GAE(ctx), rc.NStepReturns(ctx)]},
    )
    try:
        first = runner.sample()
        boot = policy.values_inputs[-1]  # the one call: rows' values are recorded already
        second = runner.sample()
    finally:
        runner.stop()
    cut = [int(r[-1]) for r in trajectories(first)]
    cut = [i for i in cut if not (first["terminateds"][i] or first["truncateds"][i])]
    assert len(cut) == len(boot["obs"]) == 3  # every sub-env's trajectory was cut
    for k, i in enumerate(cut):
        nxt = np.flatnonzero(
            (second["eps_id"] == first["eps_id"][i]) & (second["t"] == first["t"][i] + 1)
        )
        assert len(nxt) == 1
        for col in ("obs", "prev_actions", "prev_rewards"):
            np.testing.assert_array_equal(boot[col][k], second[col][nxt[0]], err_msg=col)
            assert boot[col].dtype == second[col].dtype, col
            if col != "obs":  # an n-step target bootstraps from the same inputs
                np.testing.assert_array_equal(first[f"n_step_new_{col}"][i], boot[col][k])
    assert np.abs(first["rewards"]).max() <= 0.5 < np.abs(first["prev_rewards"]).max()
