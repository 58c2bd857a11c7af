"""LSTMPolicy: one step and padded sequences agree, both paths agree, rebuilt by name."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlconnect as rc
import rlconnect.policy.lstm
from rlconnect.policy import LSTMPolicy, TorchPolicy, get_policy_class, policy_kind

OBS = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
SPACES = [
    gym.spaces.Discrete(3, start=1),
    gym.spaces.MultiDiscrete([2, 4]),
    gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
]


def _obs(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (*shape, 2, 3)).astype(np.float32)


def _random_state(p: LSTMPolicy, b: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(b, p.cell_size)).astype(np.float32) for _ in range(2)]


def _batch(obs: np.ndarray, state: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {"obs": obs, "state_in_0": state[0], "state_in_1": state[1]}


def test_initial_state_is_zeros_h_and_c() -> None:
    p = LSTMPolicy(OBS, gym.spaces.Discrete(2), cell_size=7, seed=0)
    init = p.get_initial_state()
    assert len(init) == 2 and p.is_recurrent() and p.num_state_tensors() == 2
    for s in init:
        assert s.shape == (7,) and s.dtype == np.float32 and not s.any()


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_numpy_and_torch_paths_agree(space: gym.Space) -> None:
    p = LSTMPolicy(OBS, space, hiddens=(8, 5), cell_size=6, vf_head=True, seed=3)
    batch = _batch(_obs(5), _random_state(p, 5))
    a_np, s_np, e_np = p.compute_actions(batch, explore=False)
    a_t, s_t, e_t = TorchPolicy.compute_actions(p, batch, False)
    np.testing.assert_allclose(a_np, a_t, atol=1e-5)
    assert sorted(e_np) == sorted(e_t) == ["action_dist_inputs", "action_logp", "vf_preds"]
    for k in e_np:
        assert e_np[k].dtype == np.float32
        np.testing.assert_allclose(e_np[k], e_t[k], atol=1e-5, err_msg=k)
    for a, b in zip(s_np, s_t, strict=True):
        assert a.shape == (5, 6) and a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=1e-6)
    # the state is used: another state_in gives other outputs
    _, _, e_other = p.compute_actions(_batch(batch["obs"], _random_state(p, 5, seed=9)), False)
    assert not np.allclose(e_other["action_dist_inputs"], e_np["action_dist_inputs"])


def test_model_step_signature_with_and_without_value_head() -> None:
    for vf_head in (False, True):
        p = LSTMPolicy(OBS, gym.spaces.Discrete(4), vf_head=vf_head, seed=0)
        state = [torch.from_numpy(s) for s in _random_state(p, 3)]
        out = p.model(torch.from_numpy(_obs(3)), state)
        assert len(out) == (3 if vf_head else 2)
        assert out[0].shape == (3, 4)
        assert [s.shape for s in out[1]] == [(3, 64), (3, 64)]
        if vf_head:
            assert out[2].shape == (3,)


def _step_by_step(p: LSTMPolicy, obs: np.ndarray, state: list[np.ndarray], mask: np.ndarray):
    """Reference: one model step per time step, a masked step leaves the state alone."""
    h, c = (torch.from_numpy(s) for s in state)
    outs, values = [], []
    with torch.no_grad():
        for t in range(obs.shape[1]):
            logits, (h2, c2), v = p.model(torch.from_numpy(obs[:, t]), [h, c])
            keep = torch.from_numpy(mask[:, t])[:, None]
            h, c = torch.where(keep, h2, h), torch.where(keep, c2, c)
            outs.append(logits)
            values.append(v)
    return torch.stack(outs, 1), [h, c], torch.stack(values, 1)


def _mask(kind: str, b: int, t: int) -> np.ndarray:
    if kind == "full":  # one fused call
        return np.ones((b, t), bool)
    if kind == "prefix":  # trailing padding, lengths 0..t: packed sequences
        lengths = np.array([t, 0, 2, 1, t - 1, 3])
        return np.arange(t)[None] < lengths[:, None]
    mask = np.random.default_rng(4).random((b, t)) < 0.6  # any pattern: step by step
    mask[0], mask[1] = True, False
    mask[2] = [True, True, False, False, False, False, False]
    return mask


@pytest.mark.parametrize("kind", ["full", "prefix", "random"])
def test_forward_sequences_any_mask_pattern(kind: str) -> None:
    p = LSTMPolicy(OBS, gym.spaces.Discrete(3), hiddens=(8,), cell_size=5, vf_head=True, seed=2)
    b, t = 6, 7
    obs = _obs(b, t)
    state = _random_state(p, b)
    mask = _mask(kind, b, t)
    with torch.no_grad():
        dist, (h, c), values = p.model.forward_sequences(
            torch.from_numpy(obs), [torch.from_numpy(s) for s in state], torch.from_numpy(mask)
        )
    ref_dist, (ref_h, ref_c), ref_values = _step_by_step(p, obs, state, mask)
    assert dist.shape == (b, t, 3) and values.shape == (b, t)
    np.testing.assert_allclose(h.numpy(), ref_h.numpy(), atol=1e-6)
    np.testing.assert_allclose(c.numpy(), ref_c.numpy(), atol=1e-6)
    for row in np.flatnonzero(~mask.any(1)):  # no step at all: the initial state
        np.testing.assert_array_equal(h[row].numpy(), state[0][row])
        np.testing.assert_array_equal(c[row].numpy(), state[1][row])
    # outputs at unmasked rows are those of stepping through the unmasked rows only
    np.testing.assert_allclose(dist.numpy()[mask], ref_dist.numpy()[mask], atol=1e-6)
    np.testing.assert_allclose(values.numpy()[mask], ref_values.numpy()[mask], atol=1e-6)
    # masking a row out changes nothing of the other rows' outputs
    mask2 = mask.copy()
    mask2[3] = False
    with torch.no_grad():
        dist2, _, _ = p.model.forward_sequences(
            torch.from_numpy(obs), [torch.from_numpy(s) for s in state], torch.from_numpy(mask2)
        )
    keep = mask2.copy()
    np.testing.assert_allclose(dist2.numpy()[keep], dist.numpy()[keep], atol=1e-6)


def test_forward_sequences_has_gradients_and_no_value_head() -> None:
    p = LSTMPolicy(OBS, gym.spaces.Discrete(2), cell_size=4, seed=0)
    state = [torch.zeros(2, 4), torch.zeros(2, 4)]
    out = p.model.forward_sequences(torch.from_numpy(_obs(2, 3)), state, torch.ones(2, 3).bool())
    assert len(out) == 2
    out[0].sum().backward()
    assert p.model.lstm.weight_hh_l0.grad is not None
    # float64 observations and states (e.g. padded from a float64 env) are taken as float32
    obs64 = torch.from_numpy(_obs(2, 3).astype(np.float64))
    with torch.no_grad():
        out64 = p.model.forward_sequences(obs64, [s.double() for s in state], torch.ones(2, 3))
    torch.testing.assert_close(out64[0], out[0].detach())


def test_numpy_path_follows_inplace_optimizer_step() -> None:
    p = LSTMPolicy(OBS, gym.spaces.Discrete(2), seed=0)
    batch = _batch(_obs(4), _random_state(p, 4))
    before = p.compute_actions(batch, explore=False)[2]["action_dist_inputs"]
    opt = torch.optim.SGD(p.model.parameters(), lr=0.5)
    dist = p.model.forward_sequences(
        torch.from_numpy(_obs(4, 2)), [torch.zeros(4, 64)] * 2, torch.ones(4, 2).bool()
    )[0]
    dist.square().sum().backward()
    opt.step()
    after = p.compute_actions(batch, explore=False)[2]["action_dist_inputs"]
    torch_after = TorchPolicy.compute_actions(p, batch, False)[2]["action_dist_inputs"]
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, torch_after, atol=1e-5)


def test_get_config_rebuilds_exactly_by_name() -> None:
    p = LSTMPolicy(OBS, SPACES[2], hiddens=(5,), cell_size=3, vf_head=True, seed=11)
    config = p.get_config()
    assert json.loads(json.dumps(config)) == config
    assert config["hiddens"] == [5] and config["cell_size"] == 3 and config["vf_head"] is True
    assert policy_kind(p) == "LSTMPolicy" and get_policy_class("LSTMPolicy") is LSTMPolicy
    assert rc.LSTMPolicy is LSTMPolicy
    rebuilt = LSTMPolicy(OBS, SPACES[2], **config)
    for k, v in p.get_weights().items():
        np.testing.assert_array_equal(rebuilt.get_weights()[k], v)
    batch = _batch(_obs(3), _random_state(p, 3))
    np.testing.assert_array_equal(p.compute_actions(batch)[0], rebuilt.compute_actions(batch)[0])


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="Box observation space"):
        LSTMPolicy(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="cell_size"):
        LSTMPolicy(OBS, gym.spaces.Discrete(2), cell_size=0)
    with pytest.raises(ValueError, match="hiddens"):
        LSTMPolicy(OBS, gym.spaces.Discrete(2), hiddens=(4, True))
    with pytest.raises(TypeError, match="numpy_threshold"):
        LSTMPolicy(OBS, gym.spaces.Discrete(2), numpy_threshold=1.5)  # type: ignore[arg-type]


def test_runner_records_states_and_checkpoint_rebuilds(tmp_path) -> None:
    env = gym.make("CartPole-v1")
    p = LSTMPolicy(env.observation_space, env.action_space, vf_head=True, cell_size=8, seed=0)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0)
    runner = rc.EnvRunner("CartPole-v1", p, config=config)
    batch = runner.sample()
    for col in ("state_in_0", "state_in_1", "state_out_0", "state_out_1"):
        assert batch[col].shape == (20, 8) and batch[col].dtype == np.float32
    runner.save_checkpoint(tmp_path / "ckpt")
    restored = rc.EnvRunner.from_checkpoint(tmp_path / "ckpt", env="CartPole-v1")
    q = restored.policies["default_policy"]
    assert isinstance(q, LSTMPolicy) and q.get_config() == p.get_config()
    for k, v in p.get_weights().items():
        np.testing.assert_array_equal(q.get_weights()[k], v)
    runner.stop()
    restored.stop()
    env.close()
