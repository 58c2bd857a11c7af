"""TorchPolicy: action spaces, fetches, modes, seeding, recurrence, weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_models import FixedOutputModel, GRUModel, LinearModel

from rlconnect.policy import ActionDistSpec, TorchPolicy

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.fixture(autouse=True, params=["numpy-sampling", "torch-sampling"])
def _sampling(request, monkeypatch):
    """Every test runs with small-batch sampling in numpy (the default) and in torch."""
    if request.param == "torch-sampling":
        monkeypatch.setattr(TorchPolicy, "numpy_sampling_rows", 0)


def _obs(b: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (b, 3)).astype(np.float32)


def _policy(action_space: gym.Space, value: bool = False, seed: int | None = 0) -> TorchPolicy:
    width = ActionDistSpec(action_space).width
    return TorchPolicy(LinearModel(3, width, value), OBS, action_space, seed=seed)


def test_discrete_shapes_dtypes_start_and_logp() -> None:
    space = gym.spaces.Discrete(4, start=5)
    p = _policy(space)
    obs = _obs(7)
    actions, states, extra = p.compute_actions({"obs": obs})
    assert actions.shape == (7,)
    assert actions.dtype == np.int64
    assert ((actions >= 5) & (actions < 9)).all()
    assert states == []
    assert sorted(extra) == ["action_dist_inputs", "action_logp"]
    assert extra["action_logp"].shape == (7,)
    assert extra["action_logp"].dtype == np.float32
    assert extra["action_dist_inputs"].shape == (7, 4)
    assert extra["action_dist_inputs"].dtype == np.float32
    ref = torch.distributions.Categorical(logits=torch.from_numpy(extra["action_dist_inputs"]))
    expected = ref.log_prob(torch.from_numpy(actions - 5)).numpy()
    np.testing.assert_allclose(extra["action_logp"], expected, atol=1e-5)


def test_discrete_mode_is_argmax_with_its_logp() -> None:
    p = _policy(gym.spaces.Discrete(4, start=-2))
    actions, _, extra = p.compute_actions({"obs": _obs(9)}, explore=False)
    logits = extra["action_dist_inputs"]
    np.testing.assert_array_equal(actions, logits.argmax(1) - 2)
    ref = torch.distributions.Categorical(logits=torch.from_numpy(logits))
    expected = ref.log_prob(torch.from_numpy(actions + 2)).numpy()
    np.testing.assert_allclose(extra["action_logp"], expected, atol=1e-5)


@pytest.mark.parametrize(
    ("nvec", "start"), [([3, 4, 2], [0, 10, -1]), ([3, 3], [0, 0]), ([[2, 3], [4, 2]], None)]
)
def test_multidiscrete(nvec, start) -> None:
    space = gym.spaces.MultiDiscrete(nvec, start=start)
    p = _policy(space)
    obs = _obs(6)
    actions, _, extra = p.compute_actions({"obs": obs})
    assert actions.shape == (6, *space.shape)
    assert actions.dtype == np.int64
    assert all(space.contains(a) for a in actions)
    flat_nvec = np.asarray(nvec).reshape(-1)
    offsets = np.asarray(space.start).reshape(-1)
    parts = torch.split(torch.from_numpy(extra["action_dist_inputs"]), list(flat_nvec), dim=1)
    flat = torch.from_numpy(actions.reshape(6, -1) - offsets)
    expected = sum(
        torch.distributions.Categorical(logits=part).log_prob(flat[:, i])
        for i, part in enumerate(parts)
    )
    np.testing.assert_allclose(extra["action_logp"], expected.numpy(), atol=1e-5)
    mode, _, mode_extra = p.compute_actions({"obs": obs}, explore=False)
    argmax = np.stack([part.argmax(1).numpy() for part in parts], 1) + offsets
    np.testing.assert_array_equal(mode.reshape(6, -1), argmax)
    assert mode_extra["action_logp"].shape == (6,)


def test_box_gaussian_sample_mode_and_logp() -> None:
    space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)
    p = _policy(space)
    obs = _obs(5)
    actions, _, extra = p.compute_actions({"obs": obs})
    assert actions.shape == (5, 2, 2)
    assert actions.dtype == np.float32
    dist_inputs = torch.from_numpy(extra["action_dist_inputs"])
    assert dist_inputs.shape == (5, 8)
    mean, log_std = dist_inputs[:, :4], dist_inputs[:, 4:]
    ref = torch.distributions.Normal(mean, log_std.exp())
    expected = ref.log_prob(torch.from_numpy(actions.reshape(5, 4))).sum(1).numpy()
    np.testing.assert_allclose(extra["action_logp"], expected, atol=1e-5)
    mode, _, mode_extra = p.compute_actions({"obs": obs}, explore=False)
    np.testing.assert_allclose(mode.reshape(5, 4), mean.numpy())
    expected_mode = ref.log_prob(mean).sum(1).numpy()
    np.testing.assert_allclose(mode_extra["action_logp"], expected_mode, atol=1e-5)


def test_value_head_gives_vf_preds() -> None:
    model = FixedOutputModel([0.0, 1.0], value=True)
    p = TorchPolicy(model, OBS, gym.spaces.Discrete(2), seed=0)
    obs = _obs(4)
    _, _, extra = p.compute_actions({"obs": obs})
    assert extra["vf_preds"].shape == (4,)
    assert extra["vf_preds"].dtype == np.float32
    np.testing.assert_allclose(extra["vf_preds"], obs.sum(1), atol=1e-6)
    # (B, 1) values are flattened too
    p2 = _policy(gym.spaces.Discrete(2), value=True)
    assert p2.compute_actions({"obs": obs})[2]["vf_preds"].shape == (4,)


def test_same_seed_same_actions_different_seed_different() -> None:
    space = gym.spaces.Discrete(6)
    obs = _obs(64)

    def run(seed: int) -> np.ndarray:
        p = TorchPolicy(FixedOutputModel([0.0] * 6), OBS, space, seed=seed)
        torch.manual_seed(seed + 1000)  # global RNG state must not matter
        return np.concatenate([p.compute_actions({"obs": obs})[0] for _ in range(3)])

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_reseed_restarts_the_stream() -> None:
    p = _policy(gym.spaces.Box(-1, 1, (3,)), seed=3)
    obs = _obs(8)
    first = p.compute_actions({"obs": obs})[0]
    assert not np.array_equal(first, p.compute_actions({"obs": obs})[0])
    p.seed(3)
    np.testing.assert_array_equal(first, p.compute_actions({"obs": obs})[0])


def test_categorical_frequencies_match_softmax() -> None:
    logits = [1.0, -0.5, 0.3, 2.0, -3.0]
    p = TorchPolicy(FixedOutputModel(logits), OBS, gym.spaces.Discrete(5), seed=7)
    actions, _, _ = p.compute_actions({"obs": np.zeros((20_000, 3), np.float32)})
    freq = np.bincount(actions, minlength=5) / len(actions)
    probs = torch.softmax(torch.tensor(logits), 0).numpy()
    np.testing.assert_allclose(freq, probs, atol=0.012)
    # negative control: a uniform distribution is clearly rejected by the same tolerance
    assert np.abs(freq - 0.2).max() > 0.05


def test_recurrent_state_outs_and_state_in_use() -> None:
    model = GRUModel(3, 4, hidden=5)
    p = TorchPolicy(model, OBS, gym.spaces.Discrete(4), seed=0)
    assert p.is_recurrent()
    init = p.get_initial_state()
    assert len(init) == 1
    assert init[0].shape == (5,)
    obs = _obs(3)
    state0 = np.stack([init[0]] * 3)
    actions, states, extra = p.compute_actions({"obs": obs, "state_in_0": state0})
    assert actions.shape == (3,)
    assert len(states) == 1
    assert states[0].shape == (3, 5)
    assert states[0].dtype == np.float32
    assert extra["vf_preds"].shape == (3,)
    # feeding back the state changes the output: the policy uses its state_in
    _, states2, extra2 = p.compute_actions({"obs": obs, "state_in_0": states[0]})
    assert not np.allclose(extra2["action_dist_inputs"], extra["action_dist_inputs"])
    with torch.no_grad():
        h = model.cell(torch.from_numpy(obs), torch.from_numpy(states[0]))
    np.testing.assert_allclose(states2[0], h.numpy(), atol=1e-6)


def test_recurrent_missing_state_in_is_named() -> None:
    p = TorchPolicy(GRUModel(3, 2), OBS, gym.spaces.Discrete(2), seed=0)
    with pytest.raises(KeyError, match="state_in_0"):
        p.compute_actions({"obs": _obs(2)})


def test_non_recurrent_has_no_state() -> None:
    p = _policy(gym.spaces.Discrete(2))
    assert not p.is_recurrent()
    assert p.get_initial_state() == []


def test_get_weights_are_copies_and_set_weights_roundtrip() -> None:
    p = _policy(gym.spaces.Discrete(3))
    w = p.get_weights()
    assert set(w) == {"lin.weight", "lin.bias"}
    w["lin.weight"][:] = 0.0
    assert not np.allclose(p.get_weights()["lin.weight"], 0.0)
    p.set_weights(w)
    np.testing.assert_array_equal(p.get_weights()["lin.weight"], 0.0)


def test_set_weights_errors_name_the_entries() -> None:
    p = _policy(gym.spaces.Discrete(3))
    before = p.get_weights()
    bad = {"lin.weight": np.zeros((3, 4), np.float32), "extra.w": np.zeros(1)}
    with pytest.raises(ValueError, match="set_weights") as info:
        p.set_weights(bad)
    msg = str(info.value)
    assert "missing entries ['lin.bias']" in msg
    assert "unexpected entries ['extra.w']" in msg
    assert "'lin.weight': got (3, 4), expected (3, 3)" in msg
    for k, v in p.get_weights().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize(
    "space",
    [gym.spaces.MultiBinary(3), gym.spaces.Tuple([gym.spaces.Discrete(2)]), gym.spaces.Text(4)],
)
def test_unsupported_action_space(space: gym.Space) -> None:
    with pytest.raises(TypeError, match="Discrete, MultiDiscrete and Box"):
        TorchPolicy(LinearModel(3, 3), OBS, space)


def test_wrong_dist_inputs_width_is_reported() -> None:
    p = TorchPolicy(LinearModel(3, 5), OBS, gym.spaces.Discrete(3), seed=0)
    with pytest.raises(ValueError, match=r"\(2, 5\).*expected \(2, 3\)"):
        p.compute_actions({"obs": _obs(2)})


def test_obs_conversion_accepts_float64_and_readonly() -> None:
    p = _policy(gym.spaces.Discrete(3))
    obs64 = _obs(4).astype(np.float64)
    ro = _obs(4)
    ro.setflags(write=False)
    a64 = p.compute_actions({"obs": obs64}, explore=False)[0]
    aro = p.compute_actions({"obs": ro}, explore=False)[0]
    np.testing.assert_array_equal(a64, aro)


def test_model_is_in_eval_mode_and_logp_torch_matches() -> None:
    p = _policy(gym.spaces.Discrete(3))
    assert not p.model.training
    obs = _obs(5)
    actions, _, extra = p.compute_actions({"obs": obs})
    logp = p.dist.logp_torch(
        torch.from_numpy(extra["action_dist_inputs"]), torch.from_numpy(actions)
    )
    np.testing.assert_allclose(logp.numpy(), extra["action_logp"], atol=1e-6)


def test_compute_single_action() -> None:
    p = TorchPolicy(GRUModel(3, 2), OBS, gym.spaces.Discrete(2), seed=0)
    action, state, extra = p.compute_single_action(_obs(1)[0])
    assert np.shape(action) == ()
    assert state[0].shape == (5,)
    assert extra["action_logp"].shape == ()
