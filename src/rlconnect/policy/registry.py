"""A registry of policy kinds, so checkpoints can rebuild policies by name, never by pickle.

A saved policy spec is ``{"kind": name, "kwargs": policy.get_config()}`` plus its spaces and
weights; :func:`policy_from_spec` rebuilds it through this registry only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

import gymnasium as gym

from rlconnect.policy.base import Policy

__all__ = [
    "UnknownPolicyError",
    "get_policy_class",
    "policy_from_spec",
    "policy_kind",
    "register_policy",
    "registered_policies",
]

P = TypeVar("P", bound=type[Policy])
_REGISTRY: dict[str, type[Policy]] = {}
_LAZY: dict[str, str] = {}
"""Built-in kinds registered as ``"module:attr"``: imported on first use (torch stays out of
``import rlconnect`` until a torch policy is used)."""


class UnknownPolicyError(KeyError):
    """A policy kind is not registered; the message lists the known kinds."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


@overload
def register_policy(name: str, cls: None = None, *, override: bool = False) -> Callable[[P], P]: ...
@overload
def register_policy(name: str, cls: P, *, override: bool = False) -> P: ...
def register_policy(
    name: str, cls: P | None = None, *, override: bool = False
) -> P | Callable[[P], P]:
    """Register a Policy subclass under ``name``; usable as ``@register_policy("Name")``.

    Raises:
        ValueError: if ``name`` is taken by a different class and ``override`` is False.
        TypeError: if ``cls`` is not a Policy subclass.
    """

    def _register(c: P) -> P:
        if not (isinstance(c, type) and issubclass(c, Policy)):
            raise TypeError(f"register_policy({name!r}) needs a Policy subclass, got {c!r}")
        if name in _LAZY:  # the lazy entry is replaced (by itself, or with override)
            if _LAZY[name] != f"{c.__module__}:{c.__qualname__}" and not override:
                raise ValueError(
                    f"policy kind {name!r} is already registered to {_LAZY[name]!r}; "
                    "pass override=True to replace it"
                )
            del _LAZY[name]
        if _REGISTRY.get(name, c) is not c and not override:
            raise ValueError(
                f"policy kind {name!r} is already registered to {_REGISTRY[name]!r}; "
                "pass override=True to replace it"
            )
        _REGISTRY[name] = c
        return c

    return _register if cls is None else _register(cls)


def register_lazy_policy(name: str, target: str) -> None:
    """Register the class at ``"module:attr"`` as ``name`` without importing it yet."""
    _LAZY[name] = target


def _resolve(name: str, *, import_module: bool = True) -> type[Policy] | None:
    """The class of a lazily registered kind; None if its module is not imported and
    ``import_module`` is False."""
    module, _, attr = _LAZY[name].partition(":")
    if not import_module and module not in sys.modules:
        return None
    cls = getattr(importlib.import_module(module), attr)
    _REGISTRY.setdefault(name, cls)
    del _LAZY[name]
    return _REGISTRY[name]


def registered_policies() -> list[str]:
    """Sorted names of the registered policy kinds."""
    return sorted({*_REGISTRY, *_LAZY})


def get_policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``; :class:`UnknownPolicyError` lists known kinds."""
    if name in _LAZY:
        cls = _resolve(name)
        assert cls is not None
        return cls
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown policy kind {name!r}; registered kinds: {registered_policies()}"
        ) from None


def policy_kind(policy: Policy) -> str | None:
    """The registered name of ``type(policy)``, or None if its class is not registered."""
    for name in list(_LAZY):  # a policy's own module is imported: resolving costs nothing
        _resolve(name, import_module=False)
    for name, cls in _REGISTRY.items():
        if type(policy) is cls:
            return name
    return None


def policy_from_spec(
    kind: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    kwargs: Mapping[str, Any] | None = None,
    *,
    factory: Callable[..., Policy] | None = None,
) -> Policy:
    """Rebuild a policy: ``get_policy_class(kind)(obs_space, act_space, **kwargs)``."""
    cls = factory or get_policy_class(kind)
    return cls(observation_space, action_space, **dict(kwargs or {}))
