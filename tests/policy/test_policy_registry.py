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


def test_first_lookups_from_many_threads_all_get_the_class(tmp_path, monkeypatch) -> None:
    """A lazily registered kind looked up for the first time by several threads at once
    (serving threads, say) while its module is still importing: every thread gets the
    class, none a KeyError."""
    import threading

    from rlconnect.policy.registry import register_lazy_policy

    module = "_slow_policy_module_for_threads"
    (tmp_path / f"{module}.py").write_text(
        "import time\n"
        "from rlconnect.policy import RandomPolicy\n"
        "time.sleep(0.3)  # a module that imports slowly, as torch does\n"
        "class SlowPolicy(RandomPolicy):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    register_lazy_policy("_SlowPolicy", f"{module}:SlowPolicy")
    barrier = threading.Barrier(4)
    got: list[object] = []

    def look() -> None:
        barrier.wait(timeout=10)
        try:
            got.append(get_policy_class("_SlowPolicy").__name__)
        except Exception as exc:  # what the test reports
            got.append(exc)

    threads = [threading.Thread(target=look) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert got == ["SlowPolicy"] * 4
    assert "_SlowPolicy" in registered_policies()
