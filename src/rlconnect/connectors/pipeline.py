"""Pipelines: ordered, named, editable chains of connectors whose spaces must compose."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import gymnasium as gym

from rlconnect._timing import TIMED_MASK, WEIGHT
from rlconnect.connectors.base import (
    ActionConnector,
    ActionData,
    AgentConnector,
    AgentData,
    Connector,
    ConnectorContext,
)
from rlconnect.connectors.registry import MemberSpec, connector_from_spec, get_connector_class

__all__ = ["ActionConnectorPipeline", "AgentConnectorPipeline", "ConnectorPipeline"]

#: the member type: each pipeline holds one kind of connector (agent, action or learner)
C = TypeVar("C", bound=Connector)

PIPELINE_STATE_VERSION = 1


def _describe(space: gym.Space) -> str:
    from rlconnect.spaces import describe_space

    return describe_space(space)


def _same_layout(a: gym.Space, b: gym.Space) -> bool:
    """Same shape and dtype: what a policy's input must keep."""
    return getattr(a, "shape", None) == getattr(b, "shape", None) and getattr(
        a, "dtype", None
    ) == getattr(b, "dtype", None)


class ConnectorPipeline(Generic[C]):
    """Shared behaviour of agent and action pipelines.

    Members are named by their registered name, made unique by a suffix (``FrameStack``,
    ``FrameStack_1``); names never change once given, and saved state is keyed by them.
    Every edit re-checks that the members' spaces chain, and is undone if they do not.

    A pipeline that feeds something fixed (a runner's agent pipeline feeds its policy, see
    :meth:`feeds`) also refuses an edit that would change the shape or dtype of its output:
    the edit raises ValueError naming the connector, the space it would output and the one
    the consumer takes, and the pipeline stays as it was. Edits that only fit together (one
    connector swapped for another) go inside :meth:`editing`, which checks once at the end.
    """

    member_type: type[C]  # set by each subclass: the class its members must be
    #: every call is timed (learner pipelines: once per batch); else the first calls and
    #: a weighted random share of the rest, as the runner's polls (``rlconnect._timing``)
    times_every_call = False
    _ctx_space = "observation_space"

    def __init__(self, ctx: ConnectorContext, connectors: Iterable[C | MemberSpec] = ()) -> None:
        self.ctx = ctx
        self._members: list[tuple[str, C]] = []
        for spec in connectors:  # connectors, registered names or (name, params) pairs
            c = self._check_type(spec)
            self._members.append((self._unique_name(c.name), c))
        self._output_space = self._rebind(self._members)
        #: no member: the runner skips the pipeline (reading this costs no Python call,
        #: ``len()`` does, at every poll)
        self.empty = not self._members
        #: accumulated seconds spent in each member, by name (see ``timings``)
        self._seconds: dict[str, float] = {name: 0.0 for name, _ in self._members}
        self._calls = 0
        #: ``(who, space)``: what takes this pipeline's output (see ``feeds``)
        self._consumer: tuple[str, gym.Space] | None = None
        #: inside ``editing()``: the members before the block and the edits made in it
        self._pending: tuple[list[tuple[str, C]], list[str]] | None = None

    # -- composition ----------------------------------------------------------------------
    def _check_type(self, spec: object) -> C:
        c = connector_from_spec(self.ctx, spec, type(self).__name__)
        if not isinstance(c, self.member_type):
            raise TypeError(f"{type(self).__name__} takes {self.member_type.__name__}s, got {c!r}")
        return c

    def _unique_name(self, base: str, members: list[tuple[str, C]] | None = None) -> str:
        taken = {n for n, _ in (self._members if members is None else members)}
        if base not in taken:
            return base
        i = 1
        while f"{base}_{i}" in taken:
            i += 1
        return f"{base}_{i}"

    def _rebind(self, members: list[tuple[str, C]]) -> gym.Space:
        space = getattr(self.ctx, self._ctx_space)
        prev = "the input"
        for name, c in members:
            try:
                out = c.bind(space)
            except (ValueError, TypeError) as exc:
                raise ValueError(
                    f"connector {name!r} cannot take {_describe(space)} output by {prev}: {exc}"
                ) from None
            space, prev = out, repr(name)
        return space

    def _edit(self, members: list[tuple[str, C]], edit: str = "") -> None:
        out = self._rebind(members)  # raises before anything changes
        if self._pending is not None:
            self._pending[1].append(edit)
        elif edit:
            self._check_consumer(out, edit)
        self._members = members
        self.empty = not members
        self._output_space = out
        for name, _ in members:
            self._seconds.setdefault(name, 0.0)

    def feeds(self, who: str | None, space: gym.Space | None = None) -> None:
        """Declare that ``who`` (e.g. ``"policy 'default_policy'"``) takes this pipeline's
        output, in ``space``: from now on an edit whose output differs from ``space`` in
        shape or dtype is refused. ``feeds(None)`` lifts the check. A runner calls this for
        the agent pipelines it hands out."""
        self._consumer = None if who is None or space is None else (who, space)

    @property
    def consumer(self) -> tuple[str, gym.Space] | None:
        """``(who, space)`` given to ``feeds``: what takes this pipeline's output, if set."""
        return self._consumer

    def _check_consumer(self, out: gym.Space, edit: str) -> None:
        if self._consumer is None or _same_layout(out, self._consumer[1]):
            return
        who, want = self._consumer
        raise ValueError(
            f"{edit} refused: the pipeline would output {_describe(out)}, but {who} takes "
            f"{_describe(want)}; the pipeline is unchanged. Keep the output the same (several "
            "edits that only fit together go inside `with pipe.editing():`), or build a new "
            "runner with a policy for the new space"
        )

    @contextlib.contextmanager
    def editing(self) -> Iterator[ConnectorPipeline[C]]:
        """Make several edits that only fit together, checked once when the block ends.

        What the pipeline feeds is checked then; if the output differs, every edit made
        inside is undone and ValueError names them. (Each edit still checks that members
        chain.)"""
        if self._pending is not None:
            raise RuntimeError("pipeline.editing() blocks do not nest")
        self._pending = (list(self._members), [])
        try:
            yield self
        except BaseException:
            self._restore(self._pending[0])
            raise
        else:
            before, edits = self._pending
            self._pending = None
            if edits:
                try:
                    self._check_consumer(self._output_space, ", ".join(edits))
                except ValueError:
                    self._restore(before)
                    raise
        finally:
            self._pending = None

    def _restore(self, members: list[tuple[str, C]]) -> None:
        self._members = members
        self.empty = not members
        self._output_space = self._rebind(members)

    def _index(self, name: str) -> int:
        for i, (n, _) in enumerate(self._members):
            if n == name:
                return i
        raise ValueError(f"no connector named {name!r} in the pipeline; members: {self.names}")

    def _insert(self, index: int, c: C, edit: str) -> str:
        c = self._check_type(c)
        name = self._unique_name(c.name)
        members = list(self._members)
        members.insert(index, (name, c))
        self._edit(members, f"{edit} of connector {name!r}")
        return name

    def append(self, connector: C) -> str:
        """Add at the end; returns the member's name."""
        return self._insert(len(self._members), connector, "append")

    def prepend(self, connector: C) -> str:
        """Add at the front; returns the member's name."""
        return self._insert(0, connector, "prepend")

    def insert_before(self, name: str, connector: C) -> str:
        """Insert before member ``name`` (ValueError naming the members if there is none)."""
        return self._insert(self._index(name), connector, f"insert_before({name!r})")

    def insert_after(self, name: str, connector: C) -> str:
        """Insert after member ``name`` (ValueError naming the members if there is none)."""
        return self._insert(self._index(name) + 1, connector, f"insert_after({name!r})")

    def remove(self, name: str) -> C:
        """Remove member ``name`` and return it."""
        i = self._index(name)
        members = list(self._members)
        _, c = members.pop(i)
        self._edit(members, f"remove of connector {name!r}")
        return c

    # -- access ---------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Member names in order."""
        return [n for n, _ in self._members]

    @property
    def output_space(self) -> gym.Space:
        """What the last member outputs: for an agent pipeline, what the policy sees."""
        return self._output_space

    @property
    def input_space(self) -> gym.Space:
        """What the first member receives."""
        return getattr(self.ctx, self._ctx_space)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[C]:
        return (c for _, c in self._members)

    def items(self) -> list[tuple[str, C]]:
        """``(name, connector)`` pairs in order."""
        return list(self._members)

    def __getitem__(self, key: str | int) -> C:
        if isinstance(key, int):
            try:
                return self._members[key][1]
            except IndexError:
                raise IndexError(
                    f"pipeline index {key} out of range ({len(self)} members)"
                ) from None
        for n, c in self._members:
            if n == key:
                return c
        raise KeyError(f"no connector named {key!r}; members: {self.names}")

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self._members)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({' -> '.join(self.names) or 'empty'})"

    # -- running --------------------------------------------------------------------------
    def _run(self, data: Any, *args: Any) -> Any:
        """Pass ``data`` (and ``args``, e.g. a learner connector's policy) through every
        member in order, timing each on the first calls and a weighted random share of
        the rest (``rlconnect._timing``; every call with ``times_every_call``)."""
        members: list[tuple[str, Any]] = self._members  # every member kind is callable
        calls = self._calls
        self._calls = calls + 1
        weight = 1.0 if self.times_every_call else WEIGHT[calls & TIMED_MASK]
        if not weight:
            for _, c in members:
                data = c(data, *args)
            return data
        clock = time.perf_counter
        seconds = self._seconds
        for name, c in members:
            t0 = clock()
            data = c(data, *args)
            seconds[name] += (clock() - t0) * weight
        return data

    def timings(self, reset: bool = False) -> dict[str, float]:
        """Mean milliseconds per pipeline call spent in each member, by name."""
        calls = max(self._calls, 1)
        out = {n: 1000.0 * self._seconds.get(n, 0.0) / calls for n in self.names}
        if reset:
            self._seconds = dict.fromkeys(self.names, 0.0)
            self._calls = 0
        return out

    @property
    def calls(self) -> int:
        """How many times the pipeline ran since its timings were last reset."""
        return self._calls

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Calls made inside leave ``timings()`` and ``calls`` as they were (inference)."""
        seconds, calls = dict(self._seconds), self._calls
        try:
            yield
        finally:
            self._seconds, self._calls = seconds, calls

    def reset(self, env_id: int) -> None:
        """Tell every member that the episode in sub-env ``env_id`` ended."""
        for _, c in self._members:
            c.reset(env_id)

    def reset_where(self, ended: Any) -> None:
        """Tensor path: tell every member which sub-envs' episodes ended at this poll
        (``ended``, a bool tensor ``(N,)`` on the device); see ``Connector.reset_where``."""
        for _, c in self._members:
            c.reset_where(ended)

    def to(self, device: Any) -> None:
        """Move every member's tensor state to ``device``."""
        for _, c in self._members:
            c.to(device)

    # -- the tensor path ------------------------------------------------------------------
    @property
    def takes_tensors(self) -> bool:
        """Whether every member works on torch tensors (``Connector.takes_tensors``)."""
        return all(c.takes_tensors for _, c in self._members)

    def tensor_refusals(self) -> list[str]:
        """Names of the members that do not take tensors (a runner on the tensor path
        refuses the pipeline, naming them)."""
        return [n for n, c in self._members if not c.takes_tensors]

    def pending_flags(self) -> dict[str, Any]:
        """Tensor path: each member's deferred-check flag (a 0-d bool tensor, see
        ``Connector.pending_flag``), by member name; members that defer nothing are left
        out. A runner reads these with its own flags, once per ``sample()``."""
        out = {}
        for n, c in self._members:
            flag = c.pending_flag()
            if flag is not None:
                out[n] = flag
        return out

    def raise_pending(self, failed: Iterable[str] | None = None) -> None:
        """Raise the first deferred error of the members: those named in ``failed`` (the
        flags the caller already read), or, with None, every member that defers a check
        (each reads its flags on the host)."""
        names = self.names if failed is None else list(failed)
        for n in names:
            self[n].raise_pending()

    def start_sample(self) -> None:
        """Tell every member that a runner starts collecting a batch."""
        for _, c in self._members:
            c.start_sample()

    def in_training(self) -> None:
        """Switch every member (and the context) to training mode."""
        self.ctx.is_training = True
        for _, c in self._members:
            c.in_training()

    def in_eval(self) -> None:
        """Switch every member (and the context) to evaluation mode: statistics freeze."""
        self.ctx.is_training = False
        for _, c in self._members:
            c.in_eval()

    @property
    def is_training(self) -> bool:
        """The pipeline's mode."""
        return self.ctx.is_training

    # -- state ----------------------------------------------------------------------------
    def get_statistics(self) -> dict[str, dict[str, Any]]:
        """Statistics of the members that keep some, keyed by member name."""
        out = {}
        for n, c in self._members:
            s = c.get_statistics()
            if s:
                out[n] = s
        return out

    def set_statistics(self, stats: Mapping[str, Mapping[str, Any]], strict: bool = True) -> None:
        """Load statistics by member name; with ``strict`` an unknown name is a ValueError."""
        unknown = [n for n in stats if n not in self]
        if unknown and strict:
            raise ValueError(f"statistics for unknown members {unknown}; members: {self.names}")
        for n, s in stats.items():
            if n in self:
                self[n].set_statistics(s)

    def to_state(self) -> dict[str, Any]:
        """The whole pipeline as JSON values and arrays: members by name, params, statistics."""
        members = []
        for n, c in self._members:
            reg, params = c.to_state()
            members.append({"name": n, "connector": reg, "params": params})
        return {"kind": type(self).__name__, "version": PIPELINE_STATE_VERSION, "members": members}

    @classmethod
    def from_state(cls, ctx: ConnectorContext, state: Mapping[str, Any]) -> ConnectorPipeline:
        """Rebuild a pipeline from ``to_state`` output, through the registry only."""
        if not isinstance(state, Mapping) or not isinstance(state.get("members"), list):
            raise ValueError("pipeline state must be a mapping with a 'members' list")
        kind = state.get("kind", cls.__name__)
        if kind != cls.__name__:
            raise ValueError(f"state holds a {kind}, not a {cls.__name__}")
        pipe = cls(ctx, [])
        members: list[tuple[str, Any]] = []
        for m in state["members"]:
            if not isinstance(m, Mapping) or not isinstance(m.get("name"), str):
                raise ValueError(f"malformed pipeline member {m!r}")
            params = m.get("params", {})
            if not isinstance(params, Mapping):
                raise ValueError(f"params of member {m['name']!r} must be a mapping")
            klass = get_connector_class(m.get("connector"))
            conn = klass.from_state(ctx, params)
            if m["name"] in {n for n, _ in members}:
                raise ValueError(f"duplicate member name {m['name']!r}")
            members.append((m["name"], pipe._check_type(conn)))
        pipe._edit(members)
        return pipe


class AgentConnectorPipeline(ConnectorPipeline[AgentConnector]):
    """Agent connectors in order; callable on an ``AgentData`` like a single connector."""

    member_type = AgentConnector

    def __call__(self, data: AgentData) -> AgentData:
        """Run every member on ``data`` in order; ValueError for a ``mask`` on numpy rows
        (there only the real rows are passed)."""
        if data.mask is not None and not data.on_tensors:
            raise ValueError(
                "AgentData.mask is for rows on the tensor path (torch env_ids); on numpy, "
                "pass only the real rows"
            )
        return self._run(data)

    def on_policy_output(self, output: ActionData) -> None:
        """Pass the policy's raw output to members that buffer actions or RNN state."""
        for _, c in self._members:
            c.on_policy_output(output)

    def closing_row(self, data: AgentData) -> AgentData:
        """The row that closes the trajectory of an agent without a final observation,
        through every member's ``AgentConnector.closing_row`` in order (untimed: rare)."""
        for _, c in self._members:
            data = c.closing_row(data)
        return data


class ActionConnectorPipeline(ConnectorPipeline[ActionConnector]):
    """Action connectors in order; callable on an ``ActionData`` like a single connector."""

    member_type = ActionConnector
    _ctx_space = "action_space"

    def __call__(self, data: ActionData) -> ActionData:
        """Run every member on ``data`` in order."""
        return self._run(data)
