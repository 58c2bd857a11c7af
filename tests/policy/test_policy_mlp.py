"""MLPPolicy: torch and numpy paths agree and stay in step with the weights."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlconnect.policy import MLPPolicy, TorchPolicy
from rlconnect.policy.mlp import DEFAULT_NUMPY_THRESHOLD

OBS = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)
SPACES = [
    gym.spaces.Discrete(3, start=1),
    gym.spaces.MultiDiscrete([2, 4, 3], start=[0, -2, 5]),
    gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
]


def _obs(b: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (b, 2, 3)).astype(np.float32)


def _torch_path(p: MLPPolicy, obs: np.ndarray, explore: bool = False):
    return TorchPolicy.compute_actions(p, {"obs": obs}, explore)


def _assert_same_outputs(p: MLPPolicy, obs: np.ndarray) -> None:
    """The numpy path (B <= threshold) and the torch path agree on the mode and fetches."""
    assert len(obs) <= p.numpy_threshold
    a_np, _, e_np = p.compute_actions({"obs": obs}, explore=False)
    a_t, _, e_t = _torch_path(p, obs)
    np.testing.assert_allclose(a_np, a_t, atol=1e-5)
    assert a_np.dtype == a_t.dtype
    assert sorted(e_np) == sorted(e_t)
    for k in e_np:
        assert e_np[k].dtype == np.float32, k
        np.testing.assert_allclose(e_np[k], e_t[k], atol=1e-5, err_msg=k)


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_numpy_and_torch_paths_agree(space: gym.Space) -> None:
    p = MLPPolicy(OBS, space, vf_head=True, seed=1)
    _assert_same_outputs(p, _obs(5))
    # sampled actions: the numpy path's logp is the torch log-prob of its own action
    actions, _, extra = p.compute_actions({"obs": _obs(5)}, explore=True)
    if not isinstance(space, gym.spaces.Box):  # Gaussian samples are not clipped
        assert all(space.contains(a) for a in actions)
    logp = p.dist.logp_torch(
        torch.from_numpy(extra["action_dist_inputs"]), torch.from_numpy(actions)
    )
    np.testing.assert_allclose(logp.numpy(), extra["action_logp"], atol=1e-5)


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_output_shapes_both_paths(space: gym.Space) -> None:
    p = MLPPolicy(OBS, space, seed=0)
    for b in (1, 16, 17, 40):  # numpy, numpy, torch, torch
        actions, states, extra = p.compute_actions({"obs": _obs(b)})
        assert actions.shape == (b, *space.shape)
        assert states == []
        assert extra["action_logp"].shape == (b,)
        assert extra["action_dist_inputs"].shape == (b, p.dist.width)
        assert "vf_preds" not in extra


def test_numpy_path_follows_set_weights() -> None:
    p = MLPPolicy(OBS, SPACES[0], vf_head=True, seed=0)
    other = MLPPolicy(OBS, SPACES[0], vf_head=True, seed=99)
    obs = _obs(4)
    before = p.compute_actions({"obs": obs}, explore=False)[2]["action_dist_inputs"]
    p.set_weights(other.get_weights())
    after = p.compute_actions({"obs": obs}, explore=False)[2]
    ref = _torch_path(other, obs)[2]
    assert not np.allclose(before, after["action_dist_inputs"])
    np.testing.assert_allclose(after["action_dist_inputs"], ref["action_dist_inputs"], atol=1e-5)
    np.testing.assert_allclose(after["vf_preds"], ref["vf_preds"], atol=1e-5)


def test_numpy_path_follows_inplace_optimizer_step() -> None:
    p = MLPPolicy(OBS, SPACES[2], vf_head=True, seed=0)
    obs = _obs(6)
    before = p.compute_actions({"obs": obs}, explore=False)[2]
    opt = torch.optim.Adam(p.model.parameters(), lr=0.1)
    dist_inputs, value = p.model(torch.from_numpy(obs))
    loss = dist_inputs.square().sum() + value.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = p.compute_actions({"obs": obs}, explore=False)[2]
    assert not np.allclose(before["action_dist_inputs"], after["action_dist_inputs"])
    assert not np.allclose(before["vf_preds"], after["vf_preds"])
    _assert_same_outputs(p, obs)


def test_numpy_path_follows_replaced_parameter_data() -> None:
    p = MLPPolicy(OBS, SPACES[0], seed=0)
    obs = _obs(3)
    last = p.model.pi[-1]
    last.bias.data = torch.tensor([5.0, 0.0, -5.0])  # no version bump, new storage
    actions, _, _ = p.compute_actions({"obs": obs}, explore=False)
    np.testing.assert_array_equal(actions, [1, 1, 1])
    _assert_same_outputs(p, obs)


def test_threshold_zero_disables_numpy_path() -> None:
    p = MLPPolicy(OBS, SPACES[0], config={"numpy_threshold": 0}, seed=0)
    assert p.numpy_threshold == 0
    q = MLPPolicy(OBS, SPACES[0], seed=0, numpy_threshold=0)
    torch_actions = _torch_path(q, _obs(8), explore=True)[0]
    np.testing.assert_array_equal(p.compute_actions({"obs": _obs(8)})[0], torch_actions)


def test_seed_determinism_numpy_path() -> None:
    def run(seed: int) -> np.ndarray:
        p = MLPPolicy(OBS, gym.spaces.Discrete(5), seed=seed)
        np.random.seed(seed + 5)  # noqa: NPY002  (global RNG state must not matter)
        return np.concatenate([p.compute_actions({"obs": _obs(8, i)})[0] for i in range(20)])

    np.testing.assert_array_equal(run(0), run(0))
    assert not np.array_equal(run(0), run(1))


def test_seed_fixes_initial_weights() -> None:
    a = MLPPolicy(OBS, SPACES[0], seed=4).get_weights()
    b = MLPPolicy(OBS, SPACES[0], seed=4).get_weights()
    c = MLPPolicy(OBS, SPACES[0], seed=5).get_weights()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_numpy_categorical_frequencies_match_softmax() -> None:
    p = MLPPolicy(OBS, gym.spaces.Discrete(4), seed=11)
    last = p.model.pi[-1]
    logits = torch.tensor([0.5, -1.0, 1.5, 0.0])
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(logits)
    obs = np.zeros((16, 2, 3), np.float32)
    actions = np.concatenate([p.compute_actions({"obs": obs})[0] for _ in range(1250)])
    freq = np.bincount(actions, minlength=4) / len(actions)
    np.testing.assert_allclose(freq, torch.softmax(logits, 0).numpy(), atol=0.012)
    assert np.abs(freq - 0.25).max() > 0.05  # negative control


def test_numpy_gaussian_moments() -> None:
    p = MLPPolicy(OBS, gym.spaces.Box(-1, 1, (1,)), seed=2)
    last = p.model.pi[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.5, np.log(2.0)]))
    obs = np.zeros((16, 2, 3), np.float32)
    samples = np.concatenate([p.compute_actions({"obs": obs})[0] for _ in range(1250)])
    assert abs(samples.mean() - 0.5) < 0.05
    assert abs(samples.std() - 2.0) < 0.05


def test_get_config_rebuilds() -> None:
    p = MLPPolicy(
        OBS, SPACES[1], {"lr": 1e-3}, hiddens=(8,), activation="relu", vf_head=True, seed=3
    )
    cfg = p.get_config()
    assert json.loads(json.dumps(cfg)) == cfg
    assert cfg["hiddens"] == [8]
    assert cfg["activation"] == "relu"
    assert cfg["vf_head"] is True
    assert cfg["numpy_threshold"] == DEFAULT_NUMPY_THRESHOLD
    q = MLPPolicy(OBS, SPACES[1], **cfg)
    q.set_weights(p.get_weights())
    assert q.config == p.config
    obs = _obs(4)
    np.testing.assert_allclose(
        q.compute_actions({"obs": obs}, explore=False)[2]["action_dist_inputs"],
        p.compute_actions({"obs": obs}, explore=False)[2]["action_dist_inputs"],
    )


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "linear"])
def test_activations_agree(activation: str) -> None:
    p = MLPPolicy(OBS, SPACES[0], activation=activation, hiddens=(16, 16), seed=0)
    _assert_same_outputs(p, _obs(7))


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="Box observation space"):
        MLPPolicy(gym.spaces.Discrete(3), SPACES[0])
    with pytest.raises(ValueError, match="activation"):
        MLPPolicy(OBS, SPACES[0], activation="swishy")
    with pytest.raises(ValueError, match="numpy_threshold"):
        MLPPolicy(OBS, SPACES[0], numpy_threshold=-1)
    with pytest.raises(TypeError, match="Discrete, MultiDiscrete and Box"):
        MLPPolicy(OBS, gym.spaces.MultiBinary(2))
    p = MLPPolicy(OBS, SPACES[0], seed=0)
    with pytest.raises(ValueError, match="expected 6"):
        p.compute_actions({"obs": np.zeros((2, 5), np.float32)})
