"""The policy registry: built-in kinds, rebuild from a spec, clear errors."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.policy import (
    MLPPolicy,
    Policy,
    RandomPolicy,
    UnknownPolicyError,
    get_policy_class,
    policy_from_spec,
    policy_kind,
    register_policy,
    registered_policies,
)

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


def test_builtins_are_registered() -> None:
    assert {"MLPPolicy", "RandomPolicy"} <= set(registered_policies())
    assert get_policy_class("MLPPolicy") is MLPPolicy
    assert policy_kind(RandomPolicy(OBS, ACT)) == "RandomPolicy"


def test_rebuild_from_spec() -> None:
    p = MLPPolicy(OBS, ACT, hiddens=(4,), seed=1)
    q = policy_from_spec(policy_kind(p), OBS, ACT, p.get_config())
    assert isinstance(q, MLPPolicy)
    assert q.get_config() == p.get_config()


def test_unknown_kind_lists_known() -> None:
    with pytest.raises(UnknownPolicyError, match="MLPPolicy") as info:
        get_policy_class("Nope")
    assert isinstance(info.value, KeyError)
    assert str(info.value).startswith("unknown policy kind 'Nope'")


def test_register_conflicts() -> None:
    @register_policy("_TestPolicyA")
    class A(RandomPolicy):
        pass

    class B(RandomPolicy):
        pass

    register_policy("_TestPolicyA", A)  # same class again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_policy("_TestPolicyA", B)
    register_policy("_TestPolicyA", B, override=True)
    assert get_policy_class("_TestPolicyA") is B
    with pytest.raises(TypeError):
        register_policy("_TestPolicyC", int)  # type: ignore[arg-type]
    assert issubclass(B, Policy)
