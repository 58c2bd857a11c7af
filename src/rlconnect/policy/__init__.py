"""rlconnect.policy: batched policies (numpy in, numpy out) and their registry.

Public names: :class:`Policy`, :class:`RandomPolicy`, :class:`TorchPolicy`,
:class:`MLPPolicy`, :class:`MLPModel`, :class:`LSTMPolicy`, :class:`LSTMModel`,
:class:`ActionDistSpec`, and the policy registry
(:func:`register_policy`, :func:`get_policy_class`, :func:`registered_policies`,
:func:`policy_from_spec`, :func:`policy_kind`, :class:`UnknownPolicyError`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlconnect.policy.base import Policy, PolicyOutput
from rlconnect.policy.random import RandomPolicy, sample_space_batch
from rlconnect.policy.registry import (
    UnknownPolicyError,
    get_policy_class,
    policy_from_spec,
    policy_kind,
    register_lazy_policy,
    register_policy,
    registered_policies,
)

if TYPE_CHECKING:
    from rlconnect.policy.distributions import ActionDistSpec
    from rlconnect.policy.lstm import LSTMModel, LSTMPolicy
    from rlconnect.policy.mlp import MLPModel, MLPPolicy
    from rlconnect.policy.torch_policy import TorchPolicy

#: names whose modules import torch: loaded on first access (``import rlconnect`` and
#: RandomPolicy never import torch)
_TORCH_NAMES = {
    "ActionDistSpec": "rlconnect.policy.distributions",
    "LSTMModel": "rlconnect.policy.lstm",
    "LSTMPolicy": "rlconnect.policy.lstm",
    "MLPModel": "rlconnect.policy.mlp",
    "MLPPolicy": "rlconnect.policy.mlp",
    "TorchPolicy": "rlconnect.policy.torch_policy",
}

register_policy("RandomPolicy", RandomPolicy)
register_lazy_policy("MLPPolicy", "rlconnect.policy.mlp:MLPPolicy")
register_lazy_policy("LSTMPolicy", "rlconnect.policy.lstm:LSTMPolicy")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module(_TORCH_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ActionDistSpec",
    "LSTMModel",
    "LSTMPolicy",
    "MLPModel",
    "MLPPolicy",
    "Policy",
    "PolicyOutput",
    "RandomPolicy",
    "TorchPolicy",
    "UnknownPolicyError",
    "get_policy_class",
    "policy_from_spec",
    "policy_kind",
    "register_policy",
    "registered_policies",
    "sample_space_batch",
]
