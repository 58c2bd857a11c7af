"""Policies on the tensor path: torch tensors in, torch tensors out, on the input's device,
sampled with torch, without a host read (the tensor path)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import tree
from policy_models import GRUModel, LinearModel
from test_policy_random import OBS as RANDOM_OBS
from test_policy_random import SPACES as RANDOM_SPACES
from torch.overrides import TorchFunctionMode

from rlconnect.policy import (
    LSTMPolicy,
    MLPPolicy,
    RandomPolicy,
    TorchPolicy,
    policy_from_spec,
    policy_kind,
)

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
SPACES = {
    "discrete": gym.spaces.Discrete(3, start=1),
    "multi_uniform": gym.spaces.MultiDiscrete([3, 3], start=[2, -1]),
    "multi_mixed": gym.spaces.MultiDiscrete([2, 5]),
    "box": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "box_2d": gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
}

_T = torch.Tensor
HOST_READS = {
    _T.item,
    _T.tolist,
    _T.numpy,
    _T.cpu,
    _T.__bool__,
    _T.__int__,
    _T.__float__,
    _T.__index__,
    _T.__array__,
    _T.nonzero,
    torch.nonzero,
}


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in HOST_READS:
            self.reads.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


#: every device here: the CPU, and a GPU where there is one (CI runs on the CPU)
DEVICES = ["cpu", *(["cuda:0"] if torch.cuda.is_available() else [])]
#: a device this machine does not have
ABSENT = "cuda:99" if torch.cuda.is_available() else "cuda:0"


def _obs(rows: int = 6, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    obs = torch.rand((rows, 4), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return obs.to(device)


def _mlp(act: gym.Space, device: str = "cpu") -> MLPPolicy:
    return MLPPolicy(OBS, act, hiddens=(8, 8), vf_head=True, seed=3, device=device)


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _check_like(tensor_out: Any, numpy_out: np.ndarray, device: torch.device) -> None:
    assert isinstance(tensor_out, torch.Tensor)
    assert tensor_out.device == device
    assert tensor_out.shape == numpy_out.shape
    assert str(tensor_out.dtype).removeprefix("torch.") == str(numpy_out.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_tensor_outputs_match_the_numpy_paths_layout(space: gym.Space, device: str) -> None:
    policy = _mlp(space, device)
    obs = _obs(device=device)
    acts_t, states_t, extra_t = policy.compute_actions({"obs": obs})
    acts_n, states_n, extra_n = policy.compute_actions({"obs": _host(obs)})
    _check_like(acts_t, acts_n, obs.device)
    assert states_t == states_n == []
    assert (
        sorted(extra_t)
        == sorted(extra_n)
        == [
            "action_dist_inputs",
            "action_logp",
            "vf_preds",
        ]
    )
    for key, value in extra_t.items():
        _check_like(value, extra_n[key], obs.device)
    np.testing.assert_allclose(
        _host(extra_t["action_dist_inputs"]), extra_n["action_dist_inputs"], atol=1e-5
    )
    assert space.contains(_host(acts_t[0]).astype(space.dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_mode_and_log_likelihoods_equal_the_numpy_path(space: gym.Space, device: str) -> None:
    policy = _mlp(space, device)
    obs = _obs(32, device=device)
    acts_t, _, extra_t = policy.compute_actions({"obs": obs}, explore=False)
    acts_n, _, extra_n = policy.compute_actions({"obs": _host(obs)}, explore=False)
    np.testing.assert_allclose(_host(acts_t), acts_n, atol=1e-6)
    np.testing.assert_allclose(_host(extra_t["action_logp"]), extra_n["action_logp"], atol=1e-5)
    sampled, _, extra = policy.compute_actions({"obs": obs})  # explored actions
    logp_t = policy.compute_log_likelihoods({"obs": obs}, sampled)
    logp_n = policy.compute_log_likelihoods({"obs": _host(obs)}, _host(sampled))
    assert isinstance(logp_t, torch.Tensor) and logp_t.dtype == torch.float32
    assert logp_t.shape == (32,) and logp_t.device == obs.device
    np.testing.assert_allclose(_host(logp_t), logp_n, atol=1e-5)
    np.testing.assert_allclose(_host(extra["action_logp"]), logp_n, atol=1e-5)


@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_tensor_sampling_is_seeded(space: gym.Space) -> None:
    obs = _obs(16)
    runs = []
    for _ in range(2):
        policy = _mlp(space)
        runs.append([policy.compute_actions({"obs": obs})[0] for _ in range(3)])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(runs[0][0], later) for later in runs[0][1:])


def test_gaussian_mode_does_not_share_storage_with_the_dist_inputs() -> None:
    policy = _mlp(SPACES["box"])
    actions, _, extra = policy.compute_actions({"obs": _obs(4)}, explore=False)
    before = extra["action_dist_inputs"].clone()
    actions.clamp_(0.0, 0.0)  # an action connector clipping in place
    assert torch.equal(extra["action_dist_inputs"], before)


def test_vf_preds_equal_compute_values_on_tensors() -> None:
    policy = _mlp(SPACES["discrete"])
    obs = _obs(10)
    _, _, extra = policy.compute_actions({"obs": obs})
    values = policy.compute_values({"obs": obs})
    assert isinstance(values, torch.Tensor) and values.dtype == torch.float32
    assert values.shape == (10,) and values.device == obs.device
    torch.testing.assert_close(values, extra["vf_preds"])
    np.testing.assert_allclose(
        values.numpy(), policy.compute_values({"obs": obs.numpy()}), atol=1e-5
    )


def test_categorical_tensor_samples_follow_the_softmax() -> None:
    policy = _mlp(gym.spaces.Discrete(3))
    obs = _obs(1).expand(30_000, 4).contiguous()
    actions, _, extra = policy.compute_actions({"obs": obs})
    probs = torch.softmax(extra["action_dist_inputs"][0], 0)
    freq = torch.bincount(actions, minlength=3).to(torch.float32) / len(actions)
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_gaussian_tensor_samples_have_the_models_mean_and_std() -> None:
    policy = _mlp(SPACES["box"])
    obs = _obs(1).expand(30_000, 4).contiguous()
    actions, _, extra = policy.compute_actions({"obs": obs})
    mean, log_std = extra["action_dist_inputs"][0].chunk(2)
    torch.testing.assert_close(actions.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(actions.std(0), log_std.exp(), atol=0.03, rtol=0)


def _count_reads(fn: Callable[[], Any], device: str = "cpu") -> list[str]:
    """The host reads ``fn`` makes; on a GPU any synchronisation raises too."""
    gpu = torch.device(device).type == "cuda"
    with HostReads() as counter:
        if gpu:
            torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            if gpu:
                torch.cuda.set_sync_debug_mode("default")
    return counter.reads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_no_host_read_on_tensors_mlp(space: gym.Space, device: str) -> None:
    policy = _mlp(space, device)
    batch = {"obs": _obs(8, device=device)}
    actions = policy.compute_actions(batch)[0]

    def calls() -> None:
        policy.compute_actions(batch)
        policy.compute_actions(batch, explore=False)
        policy.compute_values(batch)
        policy.compute_log_likelihoods(batch, actions)

    assert _count_reads(calls, device) == []


def _lstm(**kwargs: Any) -> LSTMPolicy:
    return LSTMPolicy(
        OBS, SPACES["discrete"], hiddens=(8,), cell_size=5, vf_head=True, seed=2, **kwargs
    )


def _state_batch(obs: Any, state: list[Any]) -> dict[str, Any]:
    return {"obs": obs, "state_in_0": state[0], "state_in_1": state[1]}


def test_no_host_read_on_tensors_lstm_and_custom_models() -> None:
    lstm = _lstm(device="cpu")
    zeros = torch.zeros((8, 5))
    batch = _state_batch(_obs(8), [zeros, zeros])
    gru = TorchPolicy(GRUModel(4, 3), OBS, gym.spaces.Discrete(3), seed=0)
    gru_batch = {"obs": _obs(8), "state_in_0": torch.zeros((8, 5))}
    linear = TorchPolicy(LinearModel(4, 4, value=True), OBS, SPACES["box"], seed=0)
    linear_batch = {"obs": _obs(8)}

    def calls() -> None:
        lstm.compute_actions(batch)
        lstm.compute_values(batch)
        gru.compute_actions(gru_batch)
        linear.compute_actions(linear_batch)
        linear.compute_values(linear_batch)

    assert _count_reads(calls) == []


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_state_round_trip_on_tensors_equals_numpy(device: str) -> None:
    policy = _lstm(device=device)
    obs_seq = [_obs(4, seed=i, device=device) for i in range(5)]
    init = [torch.as_tensor(np.stack([s] * 4), device=device) for s in policy.get_initial_state()]
    state_t: list[Any] = init
    state_n: list[Any] = [_host(s) for s in init]
    for obs in obs_seq:
        acts_t, state_t, extra_t = policy.compute_actions(_state_batch(obs, state_t), False)
        acts_n, state_n, extra_n = policy.compute_actions(_state_batch(_host(obs), state_n), False)
        assert len(state_t) == 2
        for st, sn in zip(state_t, state_n, strict=True):
            _check_like(st, sn, obs.device)
            np.testing.assert_allclose(_host(st), sn, atol=1e-5)
        np.testing.assert_array_equal(_host(acts_t), acts_n)
        np.testing.assert_allclose(_host(extra_t["vf_preds"]), extra_n["vf_preds"], atol=1e-5)
    last = _state_batch(obs_seq[-1], state_t)
    values = policy.compute_values(last)
    assert isinstance(values, torch.Tensor) and values.shape == (4,)
    logp = policy.compute_log_likelihoods(last, policy.compute_actions(last)[0])
    assert isinstance(logp, torch.Tensor) and logp.shape == (4,)


def test_tensor_outputs_are_ordinary_tensors() -> None:
    """No inference tensors: a state buffer may update them in place, a loss may use them."""
    policy = _lstm()
    zeros = torch.zeros((3, 5))
    _, states, extra = policy.compute_actions(_state_batch(_obs(3), [zeros, zeros]))
    states[0].masked_fill_(torch.tensor([True, False, True])[:, None], 0.0)
    assert not any(t.is_inference() for t in [*states, *extra.values()])


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_argument_moves_the_model_and_is_not_saved(device: Any) -> None:
    policy = _mlp(SPACES["box"]) if device == "cpu" else _lstm(device=device)
    assert policy.device == torch.device("cpu")
    assert all(p.device == torch.device("cpu") for p in policy.model.parameters())
    assert policy.torch_random.device == torch.device("cpu")
    config = policy.get_config()
    assert "device" not in config
    json.dumps(config)


def test_a_device_policys_checkpoint_restores_without_a_device() -> None:
    policy = _mlp(SPACES["multi_mixed"])
    weights = policy.get_weights()
    for w in weights.values():
        w.setflags(write=False)  # as a checkpoint loader or Ray's object store hands them
    config = json.loads(json.dumps(policy.get_config()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = policy_from_spec(
            policy_kind(policy), OBS, policy.action_space, config, weights=weights
        )
    assert isinstance(rebuilt, MLPPolicy) and rebuilt.device == torch.device("cpu")
    obs = _obs(5)
    a, _, e = policy.compute_actions({"obs": obs}, explore=False)
    b, _, f = rebuilt.compute_actions({"obs": obs}, explore=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(e["vf_preds"], f["vf_preds"])


@pytest.mark.parametrize("make", [_mlp, lambda act: _lstm()], ids=["mlp", "lstm"])
def test_set_weights_with_read_only_arrays_does_not_warn(make: Callable[..., TorchPolicy]) -> None:
    source = MLPPolicy(OBS, SPACES["discrete"], hiddens=(8, 8), vf_head=True, seed=11)
    policy = make(SPACES["discrete"])
    if isinstance(policy, LSTMPolicy):
        source = LSTMPolicy(
            OBS, SPACES["discrete"], hiddens=(8,), cell_size=5, vf_head=True, seed=11
        )
    weights = source.get_weights()
    for w in weights.values():
        w.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.set_weights(weights)
    for name, value in policy.get_weights().items():
        np.testing.assert_array_equal(value, weights[name])
    obs = _obs(3)
    np.testing.assert_allclose(
        policy.compute_values({"obs": obs.numpy(), **_zeros_state(policy, 3)}),
        source.compute_values({"obs": obs.numpy(), **_zeros_state(source, 3)}),
        atol=1e-6,
    )


def _zeros_state(policy: TorchPolicy, rows: int) -> dict[str, np.ndarray]:
    return {
        f"state_in_{i}": np.zeros((rows, *s.shape), np.float32)
        for i, s in enumerate(policy.get_initial_state())
    }


def test_set_weights_takes_tensors() -> None:
    source = _mlp(SPACES["discrete"])
    policy = MLPPolicy(OBS, SPACES["discrete"], hiddens=(8, 8), vf_head=True, seed=99)
    policy.set_weights({k: torch.as_tensor(v) for k, v in source.get_weights().items()})
    obs = _obs(4)
    torch.testing.assert_close(
        policy.compute_values({"obs": obs}), source.compute_values({"obs": obs})
    )
    # the numpy mirror follows too
    np.testing.assert_allclose(
        policy.compute_values({"obs": obs.numpy()}),
        source.compute_values({"obs": obs.numpy()}),
        atol=1e-6,
    )


def test_to_moves_and_reseeds_the_torch_generator() -> None:
    policy = _mlp(SPACES["discrete"])
    obs = _obs(16)
    first = policy.compute_actions({"obs": obs})[0]
    assert policy.to("cpu") is policy
    assert torch.equal(policy.compute_actions({"obs": obs})[0], first)
    assert policy.device == torch.device("cpu")


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [
        (3, TypeError, "device must be a str"),
        ("gpu0", ValueError, "not a torch device"),
        (ABSENT, ValueError, f"cannot run on device '{ABSENT}' here.*pass a device"),
    ],
)
def test_bad_device_is_named(device: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        MLPPolicy(OBS, SPACES["discrete"], device=device)
    with pytest.raises(error, match=match):
        _mlp(SPACES["discrete"]).to(device)


# -- RandomPolicy ---------------------------------------------------------------------------


def _random_actions(space: gym.Space, rows: int, seed: int = 0, device: str = "cpu") -> Any:
    policy = RandomPolicy(RANDOM_OBS, space, seed=seed)
    return policy.compute_actions({"obs": torch.zeros((rows, 2), device=device)})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(RANDOM_SPACES))
def test_random_policy_samples_tensors_in_the_space(name: str, device: str) -> None:
    space = RANDOM_SPACES[name]
    actions, states, extra = _random_actions(space, 200, device=device)
    assert states == [] and extra == {}
    leaves, spaces = tree.flatten(actions), _leaf_spaces(space)
    for leaf, leaf_space in zip(leaves, spaces, strict=True):
        assert isinstance(leaf, torch.Tensor) and leaf.shape == (200, *leaf_space.shape)
        assert leaf.device == torch.device(device)
        assert str(leaf.dtype).removeprefix("torch.") == str(np.dtype(leaf_space.dtype))
    for i in range(200):
        assert space.contains(tree.map_structure(lambda x, i=i: _host(x[i]), actions))
    again = _random_actions(space, 200, device=device)
    assert all(torch.equal(a, b) for a, b in zip(tree.flatten(again), leaves, strict=True))
    other = _random_actions(space, 200, seed=1, device=device)
    assert not all(torch.equal(a, b) for a, b in zip(tree.flatten(other), leaves, strict=True))


def _leaf_spaces(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Tuple):
        return [s for sub in space.spaces for s in _leaf_spaces(sub)]
    if isinstance(space, gym.spaces.Dict):
        return [s for k in sorted(space.spaces) for s in _leaf_spaces(space.spaces[k])]
    return [space]


def test_random_policy_tensor_distributions() -> None:
    discrete, _, _ = _random_actions(gym.spaces.Discrete(4, start=-1), 40_000)
    freq = torch.bincount(discrete + 1, minlength=4).to(torch.float64) / len(discrete)
    torch.testing.assert_close(freq, torch.full((4,), 0.25, dtype=torch.float64), atol=0.01, rtol=0)
    box, _, _ = _random_actions(RANDOM_SPACES["box_mixed"], 40_000)
    # N(0, 1), 0 + Exp(1), 1 - Exp(1), U(-1, 1): means 0, 1, 0, 0 and stds 1, 1, 1, 0.577
    torch.testing.assert_close(
        box.mean(0), torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64), atol=0.03, rtol=0
    )
    torch.testing.assert_close(
        box.std(0), torch.tensor([1.0, 1.0, 1.0, 3**-0.5], dtype=torch.float64), atol=0.03, rtol=0
    )


@pytest.mark.parametrize("device", DEVICES)
def test_random_policy_on_tensors_makes_no_host_read(device: str) -> None:
    policies = [RandomPolicy(RANDOM_OBS, space, seed=0) for space in RANDOM_SPACES.values()]
    batch = {"obs": torch.zeros((16, 2), device=device)}
    for policy in policies:  # the generator is made at the first call
        policy.compute_actions(batch)

    def calls() -> None:
        for policy in policies:
            policy.compute_actions(batch)

    assert _count_reads(calls, device) == []


def test_random_policy_keeps_numpy_for_numpy_input_and_refuses_odd_spaces() -> None:
    policy = RandomPolicy(RANDOM_OBS, gym.spaces.Discrete(3), seed=0)
    actions, _, _ = policy.compute_actions({"obs": np.zeros((4, 2), np.float32)})
    assert isinstance(actions, np.ndarray) and policy.torch_random is None
    text = RandomPolicy(RANDOM_OBS, gym.spaces.Text(5), seed=0)
    with pytest.raises(TypeError, match="numpy observations"):
        text.compute_actions({"obs": torch.zeros((2, 2))})


def test_empty_tensor_batches() -> None:
    policy = _mlp(SPACES["multi_mixed"])
    actions, _, extra = policy.compute_actions({"obs": torch.zeros((0, 4))})
    assert actions.shape == (0, 2) and extra["vf_preds"].shape == (0,)
    assert policy.compute_values({"obs": torch.zeros((0, 4))}).shape == (0,)
    lstm = _lstm()
    empty = torch.zeros((0, 5))
    actions, states, _ = lstm.compute_actions(_state_batch(torch.zeros((0, 4)), [empty, empty]))
    assert actions.shape == (0,) and [s.shape for s in states] == [(0, 5), (0, 5)]


def test_tensor_obs_with_numpy_state_gives_tensor_state_outs() -> None:
    policy = _lstm()
    zeros = np.zeros((3, 5), np.float32)
    _, states, extra = policy.compute_actions(_state_batch(_obs(3), [zeros, zeros]))
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.float32 for s in states)
    assert extra["vf_preds"].shape == (3,)


def test_lstm_to_keeps_numpy_and_tensor_paths_equal() -> None:
    policy = _lstm(device=torch.device("cpu"))
    assert policy.to(torch.device("cpu")) is policy
    other = LSTMPolicy(OBS, SPACES["discrete"], hiddens=(8,), cell_size=5, vf_head=True, seed=5)
    policy.set_weights(other.get_weights())
    zeros = np.zeros((4, 5), np.float32)
    obs = _obs(4)
    numpy_values = policy.compute_values(_state_batch(obs.numpy(), [zeros, zeros]))
    tensor_values = policy.compute_values(_state_batch(obs, [torch.zeros((4, 5))] * 2))
    np.testing.assert_allclose(tensor_values.numpy(), numpy_values, atol=1e-5)
    with pytest.raises(TypeError, match="needs a device"):
        policy.to(None)


def test_get_weights_are_copies() -> None:
    policy = _mlp(SPACES["discrete"])
    weights = policy.get_weights()
    for w in weights.values():
        w[...] = 0
    assert any(np.abs(w).sum() > 0 for w in policy.get_weights().values())


PAIRS = [("cpu", "cpu"), *([("cpu", "cuda:0"), ("cuda:0", "cpu")] if len(DEVICES) > 1 else [])]


@pytest.mark.parametrize(("policy_device", "data_device"), PAIRS)
def test_outputs_come_back_to_the_inputs_device(policy_device: str, data_device: str) -> None:
    """A policy on another device than its inputs: outputs on the inputs' device, equal
    to the same policy's on its own device (the CPU-only run checks the same-device case)."""
    policy = _lstm(device=policy_device)
    zeros = torch.zeros((4, 5))
    here = _state_batch(_obs(4, device=data_device), [zeros.to(data_device)] * 2)
    there = {k: v.to(policy_device) for k, v in here.items()}
    acts, states, extra = policy.compute_actions(here, explore=False)
    ref_acts, ref_states, ref_extra = policy.compute_actions(there, explore=False)
    for got, ref in zip(
        [acts, *states, *extra.values()], [ref_acts, *ref_states, *ref_extra.values()], strict=True
    ):
        assert got.device == torch.device(data_device)
        np.testing.assert_allclose(_host(got), _host(ref), atol=1e-5)
    values = policy.compute_values(here)
    assert values.device == torch.device(data_device)
    logp = policy.compute_log_likelihoods(here, acts)
    assert logp.device == torch.device(data_device)
    np.testing.assert_allclose(_host(logp), _host(extra["action_logp"]), atol=1e-5)


def test_read_only_inputs_do_not_warn() -> None:
    """Batches read from files or Ray's object store hold read-only arrays."""
    policy = _lstm()
    batch = {
        k: v.copy()
        for k, v in _state_batch(_host(_obs(4)), [np.zeros((4, 5), np.float32)] * 2).items()
    }
    actions = policy.compute_actions(batch)[0]
    policy.numpy_threshold = 0  # the torch path, where read-only arrays would warn
    for value in [*batch.values(), actions]:
        value.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logp = policy.compute_log_likelihoods(batch, actions)
        policy.compute_values(batch)
        policy.compute_actions(batch)
    assert logp.shape == (4,)
