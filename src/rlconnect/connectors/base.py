"""The connector interfaces: what a connector receives, returns, and must declare.

One step of the runner, as connectors see it::

    rows = env.poll()                          # every agent that acts now, all sub-envs
    data = AgentData(rows.env_ids, rows.agent_ids, {"obs": ..., "rewards": ...})
    data = agent_pipeline(data)                # ONE call per policy per step, whole batch
    actions, state_outs, fetches = policy.compute_actions(data)
    out = ActionData(data.env_ids, data.agent_ids, {"actions": actions, ...})
    agent_pipeline.on_policy_output(out)       # connectors that buffer actions / RNN state
    out = action_pipeline(out)                 # clip, unsquash, to numpy
    env.send_actions(out)
    ...
    agent_pipeline.reset(env_id)               # an episode in sub-env `env_id` ended

On the tensor path (``ctx.device`` set; docs/gpu.md) the same calls carry torch
tensors on one device, rows keep a fixed layout at every poll, ``data.mask`` says which
rows are real in a call, and ``reset_where(ended)`` replaces ``reset(env_id)``: a connector
that declares ``takes_tensors = True`` works there without reading a tensor on the host.

A connector is constructed as ``Cls(ctx, **params)``. Its ``params`` are JSON values that
rebuild it; statistics that must survive a checkpoint (e.g. running means) are returned by
``get_statistics()`` and restored by ``set_statistics()``. Nothing is ever pickled: a saved
connector is its registered name plus these two.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import attrs
import gymnasium as gym
import numpy as np

from rlconnect.connectors._tensors import holds_tensors, is_tensor

if TYPE_CHECKING:
    from rlconnect.policy import Policy

__all__ = [
    "ActionConnector",
    "ActionData",
    "AgentConnector",
    "AgentData",
    "ColumnActionConnector",
    "Connector",
    "ConnectorContext",
    "ObservationConnector",
    "RewardConnector",
    "RowKey",
]

RowKey = tuple[int, Any]
"""Identity of one row's agent: ``(env_id, agent_id)``. Per-agent state is keyed by it."""

STATE_KEY = "__state__"
"""Key under which a connector's statistics travel inside its saved params."""


def _device_str(value: Any) -> str | None:
    """``ConnectorContext.device``: None, or a torch device as its string (``"cuda:0"``)."""
    if value is None or isinstance(value, str):
        return value
    if type(value).__name__ == "device":  # a torch.device (torch is not imported here)
        return str(value)
    raise TypeError(
        f"ConnectorContext.device must be None or a torch device string such as 'cpu' or "
        f"'cuda:0', got {type(value).__name__}"
    )


def _is_space(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, gym.Space):
        raise TypeError(
            f"ConnectorContext.{attribute.name} must be a gymnasium Space, "
            f"got {type(value).__name__}"
        )


@attrs.define(slots=True)
class ConnectorContext:
    """What a connector may know about its surroundings: spaces, config and mode.

    ``observation_space`` is the raw space the agent pipeline receives from the env;
    ``action_space`` is the space the env accepts. ``initial_states`` holds the policy's
    initial RNN state (one unbatched array per state tensor) for ``StateBuffer``.
    ``device`` is None on the numpy path, or the torch device (``"cpu"``, ``"cuda:0"``) of
    the tensor path's rows: default pipelines built for a device leave out
    ``ConvertToNumpy`` (the env takes tensors).
    """

    observation_space: gym.Space = attrs.field(validator=_is_space)
    action_space: gym.Space = attrs.field(validator=_is_space)
    config: dict[str, Any] = attrs.field(factory=dict)
    is_training: bool = True
    initial_states: list[np.ndarray] = attrs.field(factory=list)
    policy_id: str = "default_policy"
    device: str | None = attrs.field(default=None, converter=_device_str)

    @classmethod
    def from_policy(
        cls,
        policy: Policy,
        config: Mapping[str, Any] | None = None,
        *,
        observation_space: gym.Space | None = None,
        policy_id: str = "default_policy",
        device: str | None = None,
    ) -> ConnectorContext:
        """A context for ``policy``; pass the env's raw ``observation_space`` when it differs,
        and ``device`` for the tensor path."""
        return cls(
            observation_space=observation_space or policy.observation_space,
            action_space=policy.action_space,
            config=dict(config or {}),
            initial_states=[np.asarray(s) for s in policy.get_initial_state()],
            policy_id=policy_id,
            device=device,
        )


_R = TypeVar("_R", bound="_RowData")


class _RowData:
    """Rows of one step for one policy: row identity plus named columns (whole arrays).

    On the tensor path ``env_ids`` is an int64 torch tensor ``(R,)`` on the rows' device and
    ``mask`` None (every row real) or a bool tensor ``(R,)``: only rows where it is True are
    real in this call; a connector leaves the state of the others as it was, and their
    outputs are ignored. The numpy path passes only real rows (``mask`` None).
    """

    __slots__ = ("_keys", "agent_ids", "columns", "env_ids", "mask")

    def __init__(
        self,
        env_ids: Any,
        agent_ids: Any,
        columns: Mapping[str, Any] | None = None,
        mask: Any = None,
    ) -> None:
        if is_tensor(env_ids):
            import torch

            self.env_ids = env_ids.to(torch.int64).reshape(-1)
        else:
            self.env_ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        self.agent_ids = tuple(agent_ids)
        if len(self.agent_ids) != len(self.env_ids):
            raise ValueError(
                f"{type(self).__name__}: {len(self.env_ids)} env_ids but "
                f"{len(self.agent_ids)} agent_ids"
            )
        self.mask = _checked_mask(mask, len(self.env_ids), type(self).__name__)
        self.columns: dict[str, Any] = {}
        self._keys: list[RowKey] | None = None
        for name, value in (columns or {}).items():
            self[name] = value

    @classmethod
    def trusted(
        cls: type[_R],
        env_ids: Any,
        agent_ids: tuple,
        columns: dict[str, Any],
        mask: Any = None,
    ) -> _R:
        """Build without validation: for the runner's hot path, whose inputs are known good."""
        obj = cls.__new__(cls)
        obj.env_ids = env_ids
        obj.agent_ids = agent_ids
        obj.columns = columns
        obj.mask = mask
        obj._keys = None
        return obj

    @property
    def on_tensors(self) -> bool:
        """Whether these rows are on the tensor path (``env_ids`` is a torch tensor)."""
        return is_tensor(self.env_ids)

    def __len__(self) -> int:
        return len(self.env_ids)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(
                f"{type(self).__name__} has no column {name!r}; columns: {sorted(self.columns)}"
            ) from None

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(value, list):
            value = _as_column(value)
        n = _leading_len(value)
        if n is not None and n != len(self.env_ids):
            raise ValueError(
                f"column {name!r} has {n} rows but {type(self).__name__} has {len(self.env_ids)}"
            )
        self.columns[name] = value

    def __delitem__(self, name: str) -> None:
        del self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def keys(self) -> Any:
        """Column names."""
        return self.columns.keys()

    def get(self, name: str, default: Any = None) -> Any:
        """A column, or ``default`` when absent."""
        return self.columns.get(name, default)

    def row_keys(self) -> list[RowKey]:
        """``(env_id, agent_id)`` of every row, in row order (cached). On the tensor path
        this reads ``env_ids`` on the host: tensor connectors use the fixed row layout."""
        if self._keys is None:
            self._keys = list(zip(self.env_ids.tolist(), self.agent_ids))
        return self._keys

    def copy(self) -> _RowData:
        """A shallow copy: new column dict, same arrays."""
        return type(self).trusted(self.env_ids, self.agent_ids, dict(self.columns), self.mask)

    def __repr__(self) -> str:
        cols = ", ".join(self.columns)
        return f"{type(self).__name__}({len(self)} rows: {cols})"


def _checked_mask(mask: Any, rows: int, where: str) -> Any:
    """None, or a bool tensor / array of ``rows`` entries (else a ValueError naming it)."""
    if mask is None:
        return None
    if not is_tensor(mask):
        mask = np.asarray(mask)
    dtype = str(mask.dtype)
    if tuple(mask.shape) != (rows,) or dtype not in ("bool", "torch.bool"):
        raise ValueError(
            f"{where}: mask must be None or a bool array of shape ({rows},), "
            f"got {dtype} of shape {tuple(mask.shape)}"
        )
    return mask


def _as_column(values: list) -> np.ndarray:
    """A list column: numbers stack into an array, anything else (dicts, infos) is object."""
    if all(isinstance(v, int | float | np.number | np.ndarray) for v in values):
        return np.asarray(values)
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise so numpy does not broadcast dicts
        arr[i] = v
    return arr


def _leading_len(value: Any) -> int | None:
    if isinstance(value, np.ndarray):
        return value.shape[0] if value.ndim else None
    if isinstance(value, Mapping):
        for v in value.values():
            return _leading_len(v)
        return None
    if isinstance(value, tuple):
        return _leading_len(value[0]) if value else None
    shape = getattr(value, "shape", None)  # torch tensors and friends
    return int(shape[0]) if shape else None


class AgentData(_RowData):
    """What agent connectors transform: one row per acting agent, columns like ``obs``."""

    __slots__ = ()


class ActionData(_RowData):
    """What action connectors transform: ``actions`` (one row per agent), ``state_out_*``..."""

    __slots__ = ()


class Connector:
    """Shared plumbing of agent and action connectors: params, spaces, mode, saving.

    Subclasses take their parameters as keyword arguments and pass them on:
    ``super().__init__(ctx, limit=limit)``; these are what ``to_state`` saves. Override
    ``output_space`` to declare (and check) what the connector outputs, ``setup`` to derive
    anything from the input space, and ``get_statistics`` / ``set_statistics`` for state
    that must survive a checkpoint.

    On the tensor path (docs/gpu.md) a connector is called with torch tensors on one
    device. One that works there sets the class attribute ``takes_tensors = True`` and
    keeps to tensor operations (no ``.item()``, ``bool(t)``, ``x[mask]``...); a pipeline
    lists the members that do not in ``tensor_refusals()``, and a runner refuses them.
    """

    registered_name: ClassVar[str | None] = None
    #: works on torch tensors (the tensor path) without reading them on the host
    takes_tensors: ClassVar[bool] = False
    #: which space of the context a standalone connector receives
    _ctx_space: ClassVar[str] = "observation_space"

    def __init__(self, ctx: ConnectorContext, **params: Any) -> None:
        self.ctx = ctx
        self.params: dict[str, Any] = params
        self.is_training = ctx.is_training
        self._input_space: gym.Space | None = None
        self._output_space: gym.Space | None = None

    # -- spaces ---------------------------------------------------------------------------
    def output_space(self, input_space: gym.Space) -> gym.Space:
        """What this connector outputs for ``input_space``; raise ValueError if it can't take it."""
        return input_space

    def setup(self, input_space: gym.Space) -> None:
        """Derive whatever depends on the input space (called by ``bind``)."""

    def bind(self, input_space: gym.Space) -> gym.Space:
        """Fix the space this connector receives; returns its output space."""
        out = self.output_space(input_space)
        self._input_space = input_space
        self._output_space = out
        self.setup(input_space)
        return out

    @property
    def input_space(self) -> gym.Space:
        """The space this connector receives (the context's, unless a pipeline bound it)."""
        if self._input_space is None:
            self.bind(getattr(self.ctx, self._ctx_space))
        return cast(gym.Space, self._input_space)  # set by bind

    @property
    def bound_output_space(self) -> gym.Space:
        """The output space for the bound input space."""
        if self._output_space is None:
            self.bind(self.input_space)
        return cast(gym.Space, self._output_space)  # set by bind

    # -- hooks ----------------------------------------------------------------------------
    def reset(self, env_id: int) -> None:
        """The episode in sub-env ``env_id`` ended: drop its per-episode state."""

    def reset_where(self, ended: Any) -> None:
        """Tensor path: ``ended`` is a bool tensor ``(N,)`` over sub-envs, True where the
        sub-env's episode ended at this poll; drop the per-episode state of the rows whose
        sub-env ended (``ended[data.env_ids]``) with tensor operations, no host read.
        A runner calls it after the call that carried those sub-envs' final observations
        and before the call (``mask=ended``) with their new episodes' first ones.
        Default: nothing (a connector without per-episode state)."""

    def to(self, device: Any) -> None:
        """Move tensor state to ``device`` now (state otherwise follows the data's device at
        first use). Default: nothing."""

    def pending_flag(self) -> Any:
        """Tensor path: a 0-d bool tensor, True when a check this connector defers (e.g. a
        non-finite observation) failed since the last ``raise_pending()``; None when it
        defers none. Reading it is the caller's one host read (the runner's, per sample)."""
        return None

    def raise_pending(self) -> None:
        """Raise the error a deferred check found (ValueError naming the rows), and clear
        it; nothing when none failed. Reads the connector's flags on the host."""

    def start_sample(self) -> None:
        """A runner starts collecting a batch (its sync point when it runs alone): e.g. a
        filter that freezes its statistics between syncs takes its new totals here."""

    def in_training(self) -> None:
        """Switch to training mode (statistics may update)."""
        self.is_training = True

    def in_eval(self) -> None:
        """Switch to evaluation mode (statistics frozen)."""
        self.is_training = False

    # -- saving ---------------------------------------------------------------------------
    def get_statistics(self) -> dict[str, Any]:
        """State that must survive a checkpoint (a nest of JSON values and arrays)."""
        return {}

    def set_statistics(self, stats: Mapping[str, Any]) -> None:
        """Restore what ``get_statistics`` returned."""
        if stats:
            raise ValueError(f"{type(self).__name__} keeps no statistics, got {sorted(stats)}")

    def to_state(self) -> tuple[str, dict[str, Any]]:
        """``(registered_name, params)``: everything needed to rebuild this connector."""
        name = type(self).__dict__.get("registered_name")
        if not name:
            raise ValueError(
                f"{type(self).__name__} is not registered: decorate it with "
                f"@rc.register_connector('{type(self).__name__}') so it can be saved"
            )
        params = dict(self.params)
        stats = self.get_statistics()
        if stats:
            params[STATE_KEY] = stats
        return name, params

    @classmethod
    def from_state(cls, ctx: ConnectorContext, params: Mapping[str, Any]) -> Connector:
        """Rebuild a connector from what ``to_state`` returned."""
        params = dict(params)
        stats = params.pop(STATE_KEY, None)
        try:
            obj = cls(ctx, **params)
        except TypeError as exc:
            raise ValueError(f"cannot rebuild {cls.__name__} from params {params}: {exc}") from None
        if stats:
            obj.set_statistics(stats)
        return obj

    @property
    def name(self) -> str:
        """The registered name (or the class name when unregistered)."""
        return type(self).__dict__.get("registered_name") or type(self).__name__

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


class AgentConnector(Connector):
    """Transforms what the env returned, before the policy sees it. Override ``__call__``."""

    def __call__(self, data: AgentData) -> AgentData:
        """Transform the rows; subclasses implement it (most override a narrow base instead)."""
        raise NotImplementedError

    def on_policy_output(self, output: ActionData) -> None:
        """See what the policy answered for these rows (to buffer actions or RNN state)."""

    def closing_row(self, data: AgentData) -> AgentData:
        """An agent ended without a final observation (numpy rows): ``data`` is its next
        row as far as there is one, its ``rewards`` (received since it last acted) and no
        ``obs``. Return it with what this connector would add to or change in that row,
        changing no state of its own: the runner records it as the row that closes the
        agent's trajectory, so its last transition's ``rewards`` and ``new_prev_*`` mean
        what they mean in every other. A connector that maps rewards, or adds a column the
        policy is fed, overrides it; default: unchanged (nothing to observe)."""
        return data


class ActionConnector(Connector):
    """Transforms what the policy output, before the env receives it. Override ``__call__``."""

    _ctx_space = "action_space"

    def __call__(self, data: ActionData) -> ActionData:
        """Transform the rows; subclasses implement it (most override a narrow base instead)."""
        raise NotImplementedError


class ObservationConnector(AgentConnector):
    """Maps the whole ``obs`` column: override ``transform(obs) -> obs`` only.

    On the tensor path the column is a torch tensor (or a nest of them) and
    ``transform_tensor`` maps it; by default that is ``transform`` itself, for transforms
    written with operations numpy and torch share. Set ``takes_tensors = True`` once it
    works. Rows outside ``data.mask`` are mapped too; their outputs are ignored.
    """

    column: ClassVar[str] = "obs"
    #: a batch without the column passes through (True) or is an error (False)
    optional: ClassVar[bool] = False

    def transform(self, value: Any) -> Any:
        """Map the column's whole batch to its new value."""
        raise NotImplementedError

    def transform_tensor(self, value: Any) -> Any:
        """Map the column's whole batch of torch tensors (tensor path); default ``transform``."""
        return self.transform(value)

    def __call__(self, data: AgentData) -> AgentData:
        """Map ``column`` with ``transform`` (numpy) or ``transform_tensor`` (torch); an
        ``optional`` column that is absent passes."""
        if self.optional and self.column not in data:
            return data
        self.input_space  # noqa: B018  (binds a standalone connector to the context's space)
        value = data[self.column]
        if holds_tensors(value):
            data[self.column] = self.transform_tensor(value)
        else:
            data[self.column] = self.transform(value)
        return data


class RewardConnector(ObservationConnector):
    """Maps the whole ``rewards`` column: override ``transform(rewards) -> rewards`` only."""

    column = "rewards"
    optional = True

    def closing_row(self, data: AgentData) -> AgentData:
        """The rewards of an agent's closing row mapped like every other row's."""
        return self(data)


class ColumnActionConnector(ActionConnector):
    """Maps the whole ``actions`` column: override ``transform(actions) -> actions`` only.

    On the tensor path ``transform_tensor`` maps the torch tensors (default: ``transform``),
    as for ``ObservationConnector``.
    """

    column: ClassVar[str] = "actions"

    def transform(self, value: Any) -> Any:
        """Map the column's whole batch to its new value."""
        raise NotImplementedError

    def transform_tensor(self, value: Any) -> Any:
        """Map the column's whole batch of torch tensors (tensor path); default ``transform``."""
        return self.transform(value)

    def __call__(self, data: ActionData) -> ActionData:
        """Map ``column`` with ``transform`` (numpy) or ``transform_tensor`` (torch)."""
        value = data[self.column]
        if holds_tensors(value):
            data[self.column] = self.transform_tensor(value)
        else:
            data[self.column] = self.transform(value)
        return data
