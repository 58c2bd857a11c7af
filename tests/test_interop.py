"""rc.interop with the real libraries (issue 54): TorchRL's GAE, ClipPPOLoss and replay
buffer on a converted batch; SB3's DQN learning from a buffer filled by rlconnect."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests.runner.cases import CounterEnv

import rlconnect as rc
from rlconnect.interop import InteropError, fill_sb3_buffer, to_tensordict

N, T = 4, 16


def _cartpole_batch(policy: rc.Policy | None = None, **cfg) -> rc.SampleBatch:
    env = gym.make("CartPole-v1")
    policy = policy or rc.RandomPolicy(env.observation_space, env.action_space)
    config = rc.RunnerConfig(num_envs=N, rollout_fragment_length=T, seed=0, **cfg)
    runner = rc.EnvRunner("CartPole-v1", policy, config=config)
    try:
        runner.sample()
        return runner.sample()
    finally:
        runner.stop()


def _truncating_batch() -> rc.SampleBatch:
    """CounterEnv truncated after 3 steps (and the last sub-env terminated after 4)."""
    env = CounterEnv()
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=8, seed=0, equal_rows=True)

    def make(ctx: rc.EnvContext) -> CounterEnv:
        return CounterEnv(length=3 + ctx.vector_index, truncate=ctx.vector_index == 0)

    runner = rc.EnvRunner(make, policy, config=config)
    try:
        return runner.sample()
    finally:
        runner.stop()


def test_import_rlconnect_imports_no_peer_library():
    code = (
        "import sys, rlconnect as rc; rc.interop.to_tensordict; "
        "print([m for m in ('tensordict', 'torchrl', 'stable_baselines3') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- TorchRL -------------------------------------------------------------------------------
def test_to_tensordict_layout():
    b = _truncating_batch()
    td = to_tensordict(b)
    assert td.batch_size == torch.Size([16])
    np.testing.assert_array_equal(td["observation"].numpy(), b["obs"])
    np.testing.assert_array_equal(td["next", "observation"].numpy(), b["new_obs"])
    assert td["action"].tolist() == b["actions"].tolist()
    for key, col in [("reward", "rewards"), ("terminated", "terminateds")]:
        assert td["next", key].shape == (16, 1)
        np.testing.assert_array_equal(td["next", key][:, 0].numpy(), b[col])
    done = b["terminateds"] | b["truncateds"]
    assert td["next", "done"][:, 0].tolist() == done.tolist()
    assert td["next", "truncated"][:, 0].any() and td["next", "terminated"][:, 0].any()
    assert td["eps_id"].tolist() == b["eps_id"].tolist()  # other columns by name
    assert "infos" not in td
    timed = to_tensordict(b, time_dim=True)
    assert timed.batch_size == torch.Size([2, 8])
    assert timed["env_id"][1].tolist() == [1] * 8
    assert timed["t"][0].tolist() == b["t"][:8].tolist()


def test_to_tensordict_named_errors():
    b = _truncating_batch()
    with pytest.raises(InteropError, match=r"'infos'.*exclude"):
        to_tensordict(b, exclude=())
    b["label"] = np.array(["x"] * len(b))
    with pytest.raises(InteropError, match="'label'"):
        to_tensordict(b)
    assert "label" not in to_tensordict(b, exclude=("infos", "label"))
    del b["new_obs"]
    with pytest.raises(InteropError, match="new_obs"):
        to_tensordict(b)
    with pytest.raises(TypeError, match="policy_batches"):
        to_tensordict(rc.MultiAgentBatch({"p": b}, 8))


def test_to_tensordict_nested_columns():
    b = rc.SampleBatch(
        {
            "obs": {"pos": np.zeros((3, 2), np.float32), "pair": (np.ones(3), np.arange(3))},
            "new_obs": {"pos": np.ones((3, 2), np.float32), "pair": (np.ones(3), np.arange(3))},
            "actions": np.arange(3),
            "rewards": np.ones(3, np.float32),
            "terminateds": np.zeros(3, bool),
            "truncateds": np.zeros(3, bool),
        }
    )
    td = to_tensordict(b)
    assert td["observation", "pos"].shape == (3, 2)
    assert td["next", "observation", "pair", "1"].tolist() == [0, 1, 2]


@pytest.mark.slow
def test_torchrl_gae_clip_ppo_loss_and_replay_buffer_on_a_converted_batch():
    from tensordict.nn import TensorDictModule
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    env = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(env.observation_space, env.action_space, hiddens=(16,), vf_head=True,
                          seed=0)  # fmt: skip
    b = _cartpole_batch(policy, equal_rows=True)
    b["rewards"] = b["rewards"].astype(np.float32)
    td = to_tensordict(b, time_dim=True)  # [N, T]: GAE runs along each sub-env's time
    assert td.batch_size == torch.Size([N, T])
    actor = ProbabilisticActor(
        TensorDictModule(policy.model.pi, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = ValueOperator(policy.model.vf, in_keys=["observation"])
    with torch.no_grad():
        GAE(gamma=0.99, lmbda=0.95, value_network=critic)(td)
    assert td["advantage"].shape == (N, T, 1) and torch.isfinite(td["advantage"]).all()
    loss = ClipPPOLoss(actor, critic)
    loss.set_keys(sample_log_prob="action_logp")
    out = loss(td)
    # the recorded log-probabilities are the ones the same network gives: ratio 1, KL 0
    assert abs(float(out["kl_approx"])) < 1e-5
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    total.backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2 * N * T))
    rb.extend(td.reshape(-1))
    assert len(rb) == N * T
    sample = rb.sample(8)
    assert sample["next", "reward"].shape == (8, 1)


# --- Stable-Baselines3 ---------------------------------------------------------------------
def test_fill_sb3_buffer_writes_rows_with_sb3s_time_limit_convention():
    from stable_baselines3.common.buffers import ReplayBuffer

    b = _truncating_batch()
    env = CounterEnv()
    buf = ReplayBuffer(40, env.observation_space, env.action_space, device="cpu")
    assert fill_sb3_buffer(b, buf) == 16 and buf.pos == 16 and not buf.full
    np.testing.assert_array_equal(buf.observations[:16, 0], b["obs"])
    np.testing.assert_array_equal(buf.next_observations[:16, 0], b["new_obs"])
    assert buf.actions[:16, 0, 0].tolist() == b["actions"].tolist()
    done = b["terminateds"] | b["truncateds"]
    assert buf.dones[:16, 0].tolist() == done.astype(float).tolist()
    assert buf.timeouts[:16, 0].tolist() == (b["truncateds"] & ~b["terminateds"]).tolist()
    # what SB3's learners see: a truncated step is not done (bootstrapped), a terminated one is
    samples = buf._get_samples(np.arange(16))
    assert samples.dones[:, 0].tolist() == b["terminateds"].astype(float).tolist()
    for _ in range(2):  # wraps around as add() does: 16 + 16 + 16 rows in 40
        fill_sb3_buffer(b, buf)
    assert buf.full and buf.pos == 8
    np.testing.assert_array_equal(buf.observations[:8, 0], b["obs"][8:])
    two = ReplayBuffer(10, env.observation_space, env.action_space, device="cpu", n_envs=2)
    fill_sb3_buffer(b, two)  # 8 steps of 2 envs, buffer of 5 steps: the last 5 kept
    assert two.full and two.pos == 3
    np.testing.assert_array_equal(two.observations[2, :], b["obs"][14:16])


def test_fill_sb3_buffer_named_errors():
    from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer

    b = _truncating_batch()
    env = CounterEnv()
    box4 = gym.spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(InteropError, match="observation_space"):
        fill_sb3_buffer(b, ReplayBuffer(40, box4, env.action_space, device="cpu"))
    with pytest.raises(InteropError, match="action_space"):
        fill_sb3_buffer(b, ReplayBuffer(40, env.observation_space, gym.spaces.Discrete(2)))
    with pytest.raises(InteropError, match="action_space"):
        fill_sb3_buffer(b, ReplayBuffer(40, env.observation_space, box4, device="cpu"))
    with pytest.raises(InteropError, match="n_envs"):
        fill_sb3_buffer(b[:5], ReplayBuffer(40, env.observation_space, env.action_space, n_envs=2))
    compact = ReplayBuffer(
        40, env.observation_space, env.action_space, optimize_memory_usage=True,
        handle_timeout_termination=False,
    )  # fmt: skip
    with pytest.raises(InteropError, match="optimize_memory_usage"):
        fill_sb3_buffer(b, compact)
    dict_space = gym.spaces.Dict({"o": env.observation_space})
    with pytest.raises(TypeError, match="ReplayBuffer"):
        fill_sb3_buffer(b, DictReplayBuffer(40, dict_space, env.action_space))


@pytest.mark.slow
def test_sb3_dqn_learns_from_a_buffer_filled_by_rlconnect():
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import Logger

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    model = DQN(
        "MlpPolicy", env, buffer_size=2000, learning_starts=0, batch_size=64,
        target_update_interval=10_000, learning_rate=1e-3, seed=0, device="cpu",
    )  # fmt: skip
    model.set_logger(Logger(folder=None, output_formats=[]))
    b = _cartpole_batch()
    assert fill_sb3_buffer(b, model.replay_buffer) == N * T
    fixed = model.replay_buffer._get_samples(np.arange(N * T))  # every row, in order

    def td_loss() -> float:
        with torch.no_grad():
            nxt = model.q_net_target(fixed.next_observations).max(dim=1, keepdim=True)[0]
            target = fixed.rewards + (1 - fixed.dones) * model.gamma * nxt
            q = model.q_net(fixed.observations).gather(1, fixed.actions.long())
            return float(torch.nn.functional.smooth_l1_loss(q, target))

    before = td_loss()
    model.train(gradient_steps=60, batch_size=64)
    after = td_loss()
    assert np.isfinite(model.logger.name_to_value["train/loss"])
    assert after < 0.5 * before, (before, after)
