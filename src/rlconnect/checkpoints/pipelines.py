"""Save and load connector pipelines: one pickle-free file, rebuilt only through the registry.

The file at ``path`` (exactly; no suffix is added) is a safetensors file (see
``rlconnect.checkpoints.container``) in format ``PIPELINE_FILE`` (``"rlconnect.pipeline"``
version 1, ``rlconnect.checkpoints.formats``), and as structure the pipeline's ``to_state()``::

    {"kind": "AgentConnectorPipeline" | "ActionConnectorPipeline" | "LearnerConnectorPipeline",
     "version": 1,
     "members": [{"name": "MeanStdFilter", "connector": "MeanStdFilter",
                  "params": {"clip": 10.0, "__state__": {"mean": {"__array__": "arr_0"}}}}]}

Every numpy array in the params becomes a tensor ``arr_<i>`` referenced from the JSON.

    >>> import tempfile, os, gymnasium as gym
    >>> from rlconnect.connectors.base import ConnectorContext
    >>> from rlconnect.connectors.pipeline import AgentConnectorPipeline
    >>> ctx = ConnectorContext(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2))
    >>> path = os.path.join(tempfile.mkdtemp(), "agent_pipeline")
    >>> save_pipeline(AgentConnectorPipeline(ctx, []), path)
    >>> load_pipeline(path, ctx)
    AgentConnectorPipeline(empty)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.budget import MAX_PIPELINE_BYTES, pipeline_cost
from rlconnect.checkpoints.container import load_nest, pack
from rlconnect.checkpoints.formats import PIPELINE_FILE
from rlconnect.checkpoints.nest import encode_into
from rlconnect.connectors.base import STATE_KEY, ConnectorContext
from rlconnect.connectors.learner import LearnerConnectorPipeline
from rlconnect.connectors.pipeline import (
    PIPELINE_STATE_VERSION,
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
)
from rlconnect.connectors.registry import get_connector_class
from rlconnect.errors import CheckpointError, UnknownConnectorError
from rlconnect.spaces import describe_space

__all__ = [
    "build_pipeline",
    "check_pipeline_state",
    "describe_pipeline_file",
    "load_pipeline",
    "load_statistics",
    "save_pipeline",
]

_KINDS: dict[str, type[ConnectorPipeline]] = {
    cls.__name__: cls
    for cls in (AgentConnectorPipeline, ActionConnectorPipeline, LearnerConnectorPipeline)
}

Path = str | os.PathLike[str]


def save_pipeline(pipeline: ConnectorPipeline, path: Path) -> None:
    """Write ``pipeline`` (agent or action) atomically to exactly ``path``.

    Raises ValueError / TypeError naming the connector and param before anything is
    written if a param cannot be saved without pickle (object or string arrays, sets...).
    """
    state = pipeline.to_state()
    arrays: dict[str, Any] = {}
    members = []
    for m in state["members"]:
        where = f"cannot save connector {m['name']!r}: param"
        params = encode_into(m["params"], arrays, where=where)
        members.append({"name": m["name"], "connector": m["connector"], "params": params})
    obj = {"kind": state["kind"], "version": state["version"], "members": members}
    atomic_write_bytes(path, pack(obj, arrays, PIPELINE_FILE))


def load_pipeline(path: Path, ctx: ConnectorContext) -> ConnectorPipeline:
    """Rebuild the pipeline saved at ``path`` for ``ctx``, through the connector registry.

    Raises ``CheckpointError`` (naming the file and the defect, or the member whose params
    or statistics do not fit) for a damaged file, ``UnknownConnectorError`` (unwrapped,
    listing the registered names) for a connector that is not registered, and
    ``FileNotFoundError`` for a missing file.
    """
    return build_pipeline(_read_state(path), ctx, f"pipeline {os.fspath(path)!r}")


def build_pipeline(
    state: Mapping[str, Any], ctx: ConnectorContext, where: str
) -> ConnectorPipeline:
    """Rebuild a pipeline from a state checked by ``check_pipeline_state``, through the
    connector registry; ``CheckpointError`` naming ``where`` and the member that rejects its
    params, ``UnknownConnectorError`` (unwrapped) for an unregistered connector."""
    cls = _KINDS[state["kind"]]
    space = ctx.observation_space
    if space is not None:
        cost, member = pipeline_cost(state, space)
        if member is not None:
            raise CheckpointError(
                f"cannot load {where}: building it would allocate about {cost:,} bytes, more "
                f"than the limit {MAX_PIPELINE_BYTES:,} (checkpoints.budget.MAX_PIPELINE_BYTES) "
                f"at {member}, on {describe_space(space)}; nothing was built"
            )
    try:
        return cls.from_state(ctx, state)
    except UnknownConnectorError:
        raise
    except Exception as exc:  # a connector's own validation: name the member that failed
        reason = _blame(ctx, state, exc)
        raise CheckpointError(f"cannot load {where}: {reason}") from exc


def load_statistics(path: Path) -> dict[str, dict[str, Any]]:
    """The saved members' statistics by member name, without building any connector.

    For restoring into a pipeline whose members changed (reordered, one inserted)::

        pipe.set_statistics(load_statistics(path), strict=False)
    """
    state = _read_state(path)
    out = {}
    for m in state["members"]:
        stats = m["params"].get(STATE_KEY)
        if stats:
            if not isinstance(stats, dict):
                raise CheckpointError(
                    f"cannot load pipeline {os.fspath(path)!r}: statistics of member "
                    f"{m['name']!r} are a {type(stats).__name__}, expected an object"
                )
            out[m["name"]] = stats
    return out


def describe_pipeline_file(path: Path) -> dict[str, Any]:
    """A saved pipeline as JSON values for people: arrays shown by shape, dtype and values
    (the first 8); nothing is rebuilt, so unregistered connectors can be inspected too."""
    import numpy as np
    import tree

    def show(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            flat = leaf.reshape(-1)
            return {
                "array": f"{leaf.dtype}{list(leaf.shape)}",
                "values": flat[:8].tolist() + (["..."] if flat.size > 8 else []),
            }
        return leaf

    state = _read_state(path)
    return {
        "file": os.fspath(path),
        "format": PIPELINE_FILE.name,
        **tree.map_structure(show, state),
    }


def _read_state(path: Path) -> dict[str, Any]:
    """The validated pipeline state (structure only; no connector is built)."""
    _, state = load_nest(path, PIPELINE_FILE)
    return check_pipeline_state(state, f"pipeline {os.fspath(path)!r}")


def check_pipeline_state(state: Any, where: str) -> dict[str, Any]:
    """``state`` if it has the shape of a pipeline's ``to_state()`` (kind, version, members
    with string names, connector names and object params), else ``CheckpointError``
    naming ``where``. No connector is built."""

    def fail(msg: str) -> CheckpointError:
        return CheckpointError(f"cannot load {where}: {msg}")

    if not isinstance(state, dict) or not isinstance(state.get("members"), list):
        raise fail("the structure is not an object with a 'members' list")
    if not isinstance(state.get("kind"), str) or state["kind"] not in _KINDS:
        kind = str(state.get("kind"))[:40]
        raise fail(f"unknown pipeline kind {kind!r}; expected one of {sorted(_KINDS)}")
    if state.get("version") != PIPELINE_STATE_VERSION:
        raise fail(
            f"pipeline state version {str(state.get('version'))[:20]!r} is not supported; "
            f"supported: {PIPELINE_STATE_VERSION}"
        )
    names = set()
    for i, m in enumerate(state["members"]):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("name"), str)
            and isinstance(m.get("connector"), str)
            and isinstance(m.get("params"), dict)
        ):
            raise fail(
                f"member {i} is not an object with string 'name', 'connector' and object 'params'"
            )
        if m["name"] in names:
            raise fail(f"duplicate member name {m['name']!r}")
        names.add(m["name"])
    return state


def _blame(ctx: ConnectorContext, state: Mapping[str, Any], exc: Exception) -> str:
    """Which member cannot be rebuilt, found by rebuilding each alone (on the error path only)."""
    for m in state["members"]:
        try:
            get_connector_class(m["connector"]).from_state(ctx, m["params"])
        except UnknownConnectorError:
            raise
        except Exception as member_exc:
            return (
                f"member {m['name']!r} ({m['connector']}) rejects its saved params or "
                f"statistics: {type(member_exc).__name__}: {member_exc}"
            )
    return f"the saved members do not form a valid pipeline: {type(exc).__name__}: {exc}"
