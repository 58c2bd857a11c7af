"""Connectors and lambdas registered by name: the only way a saved pipeline is rebuilt.

Safe to use from any thread: a registration checks and takes its name under one lock, so
two threads registering different classes under one name cannot both succeed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

from rlconnect.connectors.base import Connector, ConnectorContext
from rlconnect.errors import UnknownConnectorError, did_you_mean, import_hint

__all__ = [
    "MemberSpec",
    "connector_from_spec",
    "get_connector",
    "get_connector_class",
    "get_lambda",
    "register_connector",
    "register_lambda",
    "registered_connectors",
    "registered_lambdas",
]

C = TypeVar("C", bound=type[Connector])

#: what a pipeline takes as a member: a connector, its registered name, or a pair
#: ``(name, params)`` built as ``Cls(ctx, **params)``
MemberSpec = Connector | str | tuple[str, Mapping[str, Any]]

_CONNECTORS: dict[str, type[Connector]] = {}
_LAMBDAS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def _same_definition(a: Any, b: Any) -> bool:
    """True for the same object, or the same definition imported twice (module reloads)."""
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a registered name must be an identifier string, got {name!r}")
    return name


@overload
def register_connector(name: str, *, override: bool = False) -> Callable[[C], C]: ...
@overload
def register_connector(name: str, cls: C, *, override: bool = False) -> C: ...
def register_connector(name: str, cls: Any = None, *, override: bool = False) -> Any:
    """Register a connector class under ``name`` (decorator or direct call).

    A second, different class under a taken name raises ValueError unless ``override``.
    """
    _check_name(name)

    def _register(klass: C) -> C:
        if not (isinstance(klass, type) and issubclass(klass, Connector)):
            raise TypeError(
                f"register_connector({name!r}) needs a Connector subclass, got {klass!r}"
            )
        with _LOCK:
            existing = _CONNECTORS.get(name)
            if existing is not None and not _same_definition(existing, klass) and not override:
                raise ValueError(
                    f"connector name {name!r} is taken by {existing.__module__}."
                    f"{existing.__qualname__}; pass override=True to replace it"
                )
            klass.registered_name = name  # on the class itself: subclasses must register anew
            _CONNECTORS[name] = klass
        return klass

    return _register if cls is None else _register(cls)


def get_connector_class(name: object) -> type[Connector]:
    """The class registered under ``name``; UnknownConnectorError lists the known names
    (also for a name that is not a string, as a damaged saved pipeline may hold)."""
    klass = _CONNECTORS.get(name) if isinstance(name, str) else None
    if klass is None:
        known = registered_connectors()
        raise UnknownConnectorError(
            f"no connector registered as {name!r}{did_you_mean(name, known)}; registered: "
            f"{', '.join(known)}. " + import_hint("rc.register_connector")
        )
    return klass


def connector_from_spec(ctx: ConnectorContext, spec: object, pipeline: str) -> object:
    """A pipeline member from what a user may write: a connector (returned as it is), a
    registered name (``"MeanStdFilter"``: built as ``Cls(ctx)``) or a pair ``(name,
    params)`` (``("FrameStack", {"num_frames": 4})``: built as ``Cls(ctx, **params)``).
    Anything else is a TypeError saying what ``pipeline`` takes; an unknown name is an
    UnknownConnectorError."""
    if isinstance(spec, Connector):
        return spec
    if isinstance(spec, str):
        return get_connector_class(spec)(ctx)
    if (
        isinstance(spec, tuple | list)
        and len(spec) == 2
        and isinstance(spec[0], str)
        and isinstance(spec[1], Mapping)
    ):
        return get_connector_class(spec[0])(ctx, **spec[1])
    raise TypeError(
        f'{pipeline} takes connectors, registered connector names ("MeanStdFilter") or '
        f'(name, params) pairs (("FrameStack", {{"num_frames": 4}})), got {spec!r}'
    )


def get_connector(
    name: str, ctx: ConnectorContext, params: Mapping[str, Any] | None = None
) -> Connector:
    """Build the connector registered as ``name`` from saved ``params``."""
    return get_connector_class(name).from_state(ctx, params or {})


def registered_connectors() -> list[str]:
    """Sorted names of all registered connectors."""
    with _LOCK:
        return sorted(_CONNECTORS)


def register_lambda(name: str, fn: Callable[..., Any], *, override: bool = False) -> None:
    """Register a plain function so AgentLambda / ActionLambda can name it in a saved pipeline."""
    _check_name(name)
    if not callable(fn):
        raise TypeError(f"register_lambda({name!r}) needs a callable, got {fn!r}")
    with _LOCK:
        existing = _LAMBDAS.get(name)
        if existing is not None and not _same_definition(existing, fn) and not override:
            raise ValueError(f"lambda name {name!r} is taken; pass override=True to replace it")
        _LAMBDAS[name] = fn


def get_lambda(name: str) -> Callable[..., Any]:
    """The function registered as ``name``; UnknownConnectorError lists the known ones."""
    try:
        return _LAMBDAS[name]
    except (KeyError, TypeError):
        names = registered_lambdas()
        known = ", ".join(names) or "(none)"
        raise UnknownConnectorError(
            f"no lambda registered as {name!r}{did_you_mean(name, names)}; registered "
            f"lambdas: {known}. " + import_hint("rc.register_lambda")
        ) from None


def registered_lambdas() -> list[str]:
    """Sorted names of all registered lambdas."""
    with _LOCK:
        return sorted(_LAMBDAS)
