"""rlconnect.policy: batched policies (numpy in, numpy out) and their registry.

Public names: :class:`Policy`, :class:`RandomPolicy`, :class:`TorchPolicy`,
:class:`MLPPolicy`, :class:`MLPModel`, :class:`ActionDistSpec`, and the policy registry
(:func:`register_policy`, :func:`get_policy_class`, :func:`registered_policies`,
:func:`policy_from_spec`, :func:`policy_kind`, :class:`UnknownPolicyError`).
"""

from rlconnect.policy.base import Policy, PolicyOutput
from rlconnect.policy.distributions import ActionDistSpec
from rlconnect.policy.mlp import MLPModel, MLPPolicy
from rlconnect.policy.random import RandomPolicy, sample_space_batch
from rlconnect.policy.registry import (
    UnknownPolicyError,
    get_policy_class,
    policy_from_spec,
    policy_kind,
    register_policy,
    registered_policies,
)
from rlconnect.policy.torch_policy import TorchPolicy

register_policy("RandomPolicy", RandomPolicy)
register_policy("MLPPolicy", MLPPolicy)

__all__ = [
    "ActionDistSpec",
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
