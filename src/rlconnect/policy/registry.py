"""A registry of policy kinds, so checkpoints can rebuild policies by name, never by pickle.

A saved policy spec is ``{"kind": name, "kwargs": policy.get_config()}`` plus its spaces and
weights; :func:`policy_from_spec` rebuilds it through this registry only.

Every function here may be called from any thread (a policy server looks kinds up from
many): the tables change only under one lock, and a lazy kind's module is imported outside
it, so a module that registers kinds while it imports cannot deadlock with a lookup.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

import gymnasium as gym

from rlconnect.errors import import_hint
from rlconnect.policy.base import Policy, check_declared_weights

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
_LOCK = threading.Lock()


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
        with _LOCK:
            return _add(name, c, override)

    return _register if cls is None else _register(cls)


def _add(name: str, c: P, override: bool) -> P:
    """Register ``c`` as ``name`` (under ``_LOCK``)."""
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


def register_lazy_policy(name: str, target: str) -> None:
    """Register the class at ``"module:attr"`` as ``name`` without importing it yet."""
    with _LOCK:
        _LAZY[name] = target


def _resolve(name: str, target: str, *, import_module: bool = True) -> type[Policy] | None:
    """The class of the kind registered lazily as ``name`` at ``target`` (``"module:attr"``),
    now registered for good; None if its module is not imported and ``import_module`` is
    False. Imports outside the lock (the module may register kinds itself)."""
    module, _, attr = target.partition(":")
    if not import_module and module not in sys.modules:
        return None
    cls = getattr(importlib.import_module(module), attr)
    with _LOCK:
        if _LAZY.get(name) == target:  # first resolved here (another thread may have)
            del _LAZY[name]
            _REGISTRY.setdefault(name, cls)
        return _REGISTRY.get(name, cls)


def registered_policies() -> list[str]:
    """Sorted names of the registered policy kinds."""
    with _LOCK:
        return sorted({*_REGISTRY, *_LAZY})


def get_policy_class(name: str) -> type[Policy]:
    """The class registered as ``name``; :class:`UnknownPolicyError` lists known kinds."""
    with _LOCK:
        target = _LAZY.get(name)
        cls = _REGISTRY.get(name)
    if target is not None:
        resolved = _resolve(name, target)
        assert resolved is not None
        return resolved
    if cls is None:
        raise UnknownPolicyError(
            f"unknown policy kind {name!r}; registered kinds: {registered_policies()}. "
            + import_hint("rc.register_policy")
        )
    return cls


def policy_kind(policy: Policy) -> str | None:
    """The registered name of ``type(policy)``, or None if its class is not registered."""
    with _LOCK:
        lazy = list(_LAZY.items())
    for name, target in lazy:  # a policy's own module is imported: resolving costs nothing
        _resolve(name, target, import_module=False)
    with _LOCK:
        registered = list(_REGISTRY.items())
    for name, cls in registered:
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
    weights: Mapping[str, Any] | None = None,
) -> Policy:
    """Rebuild a policy: ``get_policy_class(kind)(obs_space, act_space, **kwargs)``.

    With saved ``weights``, the weights the class declares for ``kwargs``
    (``Policy.weight_shapes``) are checked against them before anything is built
    (ValueError naming the first difference), and they are set once it is built."""
    cls = factory or get_policy_class(kind)
    kwargs = dict(kwargs or {})
    if weights is not None and isinstance(cls, type) and issubclass(cls, Policy):
        declared = cls.weight_shapes(observation_space, action_space, **kwargs)
        if declared is not None:
            check_declared_weights(declared, weights, kind)
    policy = cls(observation_space, action_space, **kwargs)
    if weights is not None:
        policy.set_weights(weights)
    return policy
