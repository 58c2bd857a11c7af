"""``Policy.weight_shapes``: the weights a config declares, known without building, and
``policy_from_spec`` refusing saved weights that differ before anything is built."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlconnect as rc
from rlconnect.policy import get_policy_class, policy_from_spec
from rlconnect.policy.base import check_declared_weights

OBS = gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32)
ACTIONS = [
    gym.spaces.Discrete(3),
    gym.spaces.Box(-1.0, 1.0, (2,)),
    gym.spaces.MultiDiscrete([2, 3]),
]
CONFIGS = {
    "MLPPolicy": [{}, {"hiddens": (8,)}, {"hiddens": (), "vf_head": True}, {"hiddens": (5, 7)}],
    "LSTMPolicy": [{}, {"hiddens": (8,), "cell_size": 4}, {"hiddens": (), "vf_head": True}],
    "RandomPolicy": [{}],
}


@pytest.mark.parametrize("action_space", ACTIONS, ids=str)
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_declared_shapes_are_the_built_policys_weights_in_order(kind, action_space):
    cls = get_policy_class(kind)
    for kwargs in CONFIGS[kind]:
        policy = cls(OBS, action_space, seed=0, **kwargs)
        built = [(k, v.shape) for k, v in policy.get_weights().items()]
        declared = cls.weight_shapes(OBS, action_space, **policy.get_config())
        assert declared is not None and list(declared) == built


def test_a_policy_class_with_weights_of_its_own_declares_none_by_default():
    class Custom(rc.Policy):
        def compute_actions(self, input_batch, explore=True):
            return np.zeros(len(input_batch["obs"]), np.int64), [], {}

        def get_weights(self):
            return {"w": np.zeros(2)}

    assert Custom.weight_shapes(OBS, ACTIONS[0]) is None


def test_a_subclass_with_arguments_of_its_own_declares_none():
    """A subclass may build another network (and takes other arguments): the parent's
    shapes are not assumed for it."""

    class Tempered(rc.MLPPolicy):
        def __init__(self, *args, temperature=1.0, **kwargs):
            super().__init__(*args, **kwargs)
            self.temperature = temperature

    assert Tempered.weight_shapes(OBS, ACTIONS[0], temperature=2.0, hiddens=[4096]) is None


def test_a_config_declaring_a_huge_network_is_refused_before_building(monkeypatch):
    saved = rc.MLPPolicy(OBS, ACTIONS[0], hiddens=(8,), seed=0)
    built: list[tuple[int, int]] = []
    linear_init = torch.nn.Linear.__init__

    def counted(self, in_features, out_features, *args, **kwargs):
        built.append((in_features, out_features))
        linear_init(self, in_features, out_features, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Linear, "__init__", counted)
    for hiddens in ([4096, 4096], [8] * 1_000_000, [10**12]):
        with pytest.raises(ValueError, match="declares weights that differ from the stored"):
            policy_from_spec(
                "MLPPolicy", OBS, ACTIONS[0], {"hiddens": hiddens}, weights=saved.get_weights()
            )
    assert built == []  # nothing was built (not a layer of the declared network)


def test_policy_from_spec_sets_the_saved_weights():
    saved = rc.LSTMPolicy(OBS, ACTIONS[1], hiddens=(8,), cell_size=4, seed=3)
    rebuilt = policy_from_spec(
        "LSTMPolicy", OBS, ACTIONS[1], saved.get_config(), weights=saved.get_weights()
    )
    for name, value in saved.get_weights().items():
        np.testing.assert_array_equal(rebuilt.get_weights()[name], value)


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ([("a", (2,)), ("b", (3,))], "declares more than the 1 stored"),
        ([("b", (2,))], "declares 'b', which the file does not hold"),
        ([("a", (4,))], r"'a' is declared \(4,\) but stored \(2,\)"),
        ([], r"holds \['a'\], which it does not declare"),
    ],
)
def test_check_declared_weights_names_the_first_difference(declared, words):
    with pytest.raises(ValueError, match=words):
        check_declared_weights(iter(declared), {"a": np.zeros(2)}, "Kind")


@pytest.mark.parametrize("kind", ["MLPPolicy", "LSTMPolicy"])
def test_declared_shapes_take_the_constructors_arguments(kind):
    """Arguments are bound as the constructor binds them: ``config`` by name, defaults
    applied, an unknown name or a non-Box space refused as the constructor refuses it."""
    cls = get_policy_class(kind)
    built = [(k, v.shape) for k, v in cls(OBS, ACTIONS[0], {}, seed=0).get_weights().items()]
    assert list(cls.weight_shapes(OBS, ACTIONS[0], config={})) == built
    with pytest.raises(TypeError, match="hidens"):
        cls.weight_shapes(OBS, ACTIONS[0], hidens=(8,))
    with pytest.raises(TypeError, match="hidens"):
        cls(OBS, ACTIONS[0], hidens=(8,))
    for make in (cls.weight_shapes, cls):
        with pytest.raises(TypeError, match=f"{kind} needs a Box observation space"):
            make(gym.spaces.Discrete(3), ACTIONS[0])


def test_a_subclass_that_defines_its_own_hook_declares_its_shapes():
    class Wider(rc.MLPPolicy):
        def __init__(self, observation_space, action_space, *, width=4, seed=None):
            super().__init__(observation_space, action_space, hiddens=(width,), seed=seed)

        @staticmethod
        def _shapes_of_arguments(arguments):
            return rc.MLPPolicy.weight_shapes(
                arguments["observation_space"],
                arguments["action_space"],
                hiddens=(arguments["width"],),
            )

    built = [(k, v.shape) for k, v in Wider(OBS, ACTIONS[0], width=6).get_weights().items()]
    assert list(Wider.weight_shapes(OBS, ACTIONS[0], width=6)) == built
    with pytest.raises(TypeError, match="hiddens"):  # its constructor does not take it
        Wider.weight_shapes(OBS, ACTIONS[0], hiddens=(3,))
