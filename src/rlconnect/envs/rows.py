"""What one ``poll()`` returns (``EnvRows``) and how adapters make it (``EnvRowsBuilder``).

An adapter either adds rows one at a time while it steps its sub-envs::

    b = EnvRowsBuilder(single_agent=True)
    b.add_row(env_id, agent_id, obs, reward, terminated, truncated, info)
    b.add_row(other_id, agent_id, obs, info=info, first=True)   # a reset: reward 0
    b.add_error(failed_id, exc)
    rows = b.build(stack=...)

or hands over whole columns (``EnvRowsBuilder.columns``). The builder makes each reward a
float (a size-one array is its scalar, other shapes an ``EnvCheckError`` of the sub-env)
and leaves out every row of a sub-env with an error. ``EnvRows`` holds data only; what it
implies (``stepped``, ``done_envs``, ``stacked``, ``dense``, ``plain``) is derived when read
(``columns`` derives it as it makes the rows: the columns tell most of it for free).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar, overload

import numpy as np
import tree

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.batches.columns import EMPTY_INFO
from rlconnect.envs.rewards import bad_reward_error, reward_column, scalar_reward

__all__ = [
    "EnvRows",
    "EnvRowsBuilder",
    "ExternalRows",
    "ExtraReward",
    "LayoutMemo",
    "StackFn",
    "done_envs_of",
    "errors_only",
    "strictly_ascending",
]

_ALL = {"__all__"}
_BOOL = np.dtype(bool)  #: (a dtype object: cheaper for ``np.zeros`` than ``dtype=bool``)
_FLOAT64 = np.dtype(np.float64)
_ZERO = repeat(0.0)  #: the reward of an agent a rewards dict leaves out (``map``'s default)
_MEMO_MAX = 64  #: columns a ``LayoutMemo`` keeps of each kind (forgotten all at once)
_PYTHON_SORT_MAX = 64  #: up to this many rows, ``stepped`` is sorted in Python
_NO_ENDS: Mapping[int, tuple[bool, bool]] = MappingProxyType({})
_NO_ERRORS: Mapping[int, BaseException] = MappingProxyType({})

#: the ``terminateds``, ``truncateds`` and ``is_first`` columns
Flags = tuple[np.ndarray, np.ndarray, np.ndarray]

#: ``stack(obs, env_ids) -> (batch, bad)``: one batch of the rows' observations, and the
#: sub-envs whose observation cannot be one of the space (their rows are left out).
StackFn = Callable[[list[Any], list[int]], tuple[Any, Mapping[int, BaseException]]]


class ExtraReward(NamedTuple):
    """A reward for an agent without an observation at this poll: it counts towards the
    agent's next transition; ``terminated``/``truncated`` end the agent's trajectory."""

    env_id: int
    agent_id: Any
    reward: float
    terminated: bool = False
    truncated: bool = False


T = TypeVar("T")
_R = TypeVar("_R", bound="EnvRows")


class _Fact(Generic[T]):
    """A fact of ``EnvRows`` derived from its fields: computed on first read, then kept in
    the instance (a non-data descriptor: later reads find the value, not this)."""

    def __init__(self, derive: Callable[[Any], T]) -> None:
        self._derive, self._name, self.__doc__ = derive, derive.__name__, derive.__doc__

    @overload
    def __get__(self, rows: None, owner: Any = None) -> _Fact[T]: ...
    @overload
    def __get__(self, rows: Any, owner: Any = None) -> T: ...
    def __get__(self, rows: Any, owner: Any = None) -> T | _Fact[T]:
        if rows is None:
            return self
        value = rows.__dict__[self._name] = self._derive(rows)
        return value


class _RowFields(NamedTuple):
    env_ids: np.ndarray
    agent_ids: tuple
    obs: Any
    rewards: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    infos: Sequence[Mapping[str, Any]]
    is_first: np.ndarray
    single_agent: bool = False
    ended: Mapping[int, tuple[bool, bool]] = _NO_ENDS
    extra_rewards: Sequence[ExtraReward] = ()
    errors: Mapping[int, BaseException] = _NO_ERRORS
    also_stepped: tuple[int, ...] = ()


#: the defaults of the fields after ``single_agent`` (``EnvRowsBuilder.columns`` sets none)
_DEFAULTS = tuple(_RowFields._field_defaults[f] for f in _RowFields._fields[9:])


class EnvRows(_RowFields):
    """What one ``poll()`` returns, column by column: row ``i`` is agent ``agent_ids[i]`` of
    sub-env ``env_ids[i]``. A frozen record made by ``EnvRowsBuilder``, read by the runner.

    Its fields are data:

    - ``obs``: a stacked batch (array or nest of arrays with R rows, all rows share one
      space) or a list of R per-row observations (multi-agent).
    - ``rewards`` (float64), ``terminateds``, ``truncateds`` (bool), ``infos`` (list of
      dicts; an empty one is ``EMPTY_INFO``, one shared dict kept until the batch instead
      of a dict per row: ``add_row`` makes it so, the built-in adapters give ``columns``
      it).
    - ``is_first``: the row is the first observation of a new episode (reward 0, no flags).
    - ``single_agent``: every row is the one agent of its sub-env, so a terminated or
      truncated row ends its sub-env's episode.
    - ``ended``: ``{env_id: (terminated, truncated)}`` for sub-envs whose whole episode
      ended at this poll as the env said so (``__all__`` of multi-agent envs).
    - ``extra_rewards``: ``ExtraReward`` records for agents rewarded at this step without
      an observation; they count towards the agent's next transition.
    - ``errors``: ``{env_id: exception}`` for sub-envs whose step or reset raised (or that
      returned an observation or reward that cannot be one of theirs, ``EnvCheckError``);
      none of their rows are included.
    - ``also_stepped``: sub-envs that took an env step whatever their rows say (e.g. one
      without a row: every agent waits).

    What the fields imply is derived when first read (and kept): ``stacked``,
    ``stepped``, ``done_envs``, ``dense``, ``plain`` and ``ascending`` (rows made by
    ``EnvRowsBuilder.columns`` come with them).
    """

    def __len__(self) -> int:  # (rows, not fields)
        return len(self.env_ids)

    @classmethod
    def _make(cls: type[_R], iterable: Iterable[Any]) -> _R:  # type: ignore[override]
        # (the namedtuple's own ``_make`` checks ``len()``, which counts rows here)
        return tuple.__new__(cls, iterable)

    def _derive(self) -> dict[str, Any]:
        """The facts every poll reads (``stacked``, ``dense``, ``stepped``, ``done_envs``,
        ``plain``; single-agent: ``ascending``), derived together at the first read of one."""
        facts = self.__dict__
        single, ids = self.single_agent, self.env_ids
        stacked = facts["stacked"] = type(self.obs) is not list
        if single:  # (read here, not through the fact: one call less)
            ascending = facts["ascending"] = len(ids) < 2 or strictly_ascending(ids)
        else:  # (one row, e.g. a turn-based env's: its sub-env stepped or not, no sort)
            ascending = len(ids) < 2
        facts["dense"] = (
            single and stacked and ascending and not self.errors and not self.extra_rewards
        )
        first, term, trunc = self.is_first, self.terminateds, self.truncateds
        if first is term and term is trunc:  # one shared column (``falses``): one look
            shared = first is not _FALSES.get(len(first)) and some_true(first)
            any_first = any_term = any_trunc = shared
        else:
            any_first, any_term, any_trunc = some_true(first), some_true(term), some_true(trunc)
        facts["plain"] = not (any_first or any_term or any_trunc)
        if any_first:
            ids = ids[~first]
        facts["stepped"] = _stepped_envs(ids, self.also_stepped, ascending)
        ended = self.ended if type(self.ended) is dict else dict(self.ended)
        if single and (any_term or any_trunc):
            found = done_envs_of(self.env_ids, term, trunc)
            ended = {**ended, **found} if ended else found
        facts["done_envs"] = ended
        return facts

    @_Fact
    def stacked(self) -> bool:
        """The observations are one batch (not a list of rows)."""
        return bool(self._derive()["stacked"])

    @_Fact
    def stepped(self) -> np.ndarray:
        """Ids of the sub-envs that took an env step at this poll (resets do not count),
        ascending."""
        stepped: np.ndarray = self._derive()["stepped"]
        return stepped

    @_Fact
    def done_envs(self) -> dict[int, tuple[bool, bool]]:
        """``{env_id: (terminated, truncated)}`` for sub-envs whose whole episode ended at
        this poll: ``ended``, and single-agent rows with a flag set."""
        ended: dict[int, tuple[bool, bool]] = self._derive()["done_envs"]
        return ended

    @_Fact
    def dense(self) -> bool:
        """Single-agent rows with stacked observations, at most one row per sub-env,
        ``env_ids`` strictly ascending, no errors and no extra rewards: the runner may take
        its columnar fast path. It need not cover every sub-env (an asynchronous poll
        covers those that finished their step); a full poll of ``GymEnvs`` that went well
        does."""
        return bool(self._derive()["dense"])

    @_Fact
    def ascending(self) -> bool:
        """``env_ids`` rise strictly (at most one row per sub-env, in order)."""
        return strictly_ascending(self.env_ids)

    @_Fact
    def plain(self) -> bool:
        """No row is a first one and none has a flag set (``is_first``, ``terminateds``
        and ``truncateds`` all False)."""
        return bool(self._derive()["plain"])

    def without_envs(self, errors: Mapping[int, BaseException]) -> EnvRows:
        """These rows minus every row of the sub-envs in ``errors``, which are added to
        ``self.errors``: a sub-env that returned bad data is reported like one that raised."""
        ids = np.fromiter(errors, np.int64, len(errors))
        keep = np.flatnonzero(~np.isin(self.env_ids, ids))
        members = keep.tolist()
        if self.stacked:
            obs = tree.map_structure(lambda x: np.asarray(x)[keep], self.obs)
        else:
            obs = [self.obs[i] for i in members]
        return self._replace(
            env_ids=self.env_ids[keep],
            agent_ids=tuple(self.agent_ids[i] for i in members),
            obs=obs,
            rewards=self.rewards[keep],
            terminateds=self.terminateds[keep],
            truncateds=self.truncateds[keep],
            infos=[self.infos[i] for i in members],
            is_first=self.is_first[keep],
            ended={e: f for e, f in self.ended.items() if e not in errors},
            extra_rewards=[x for x in self.extra_rewards if x.env_id not in errors],
            errors={**self.errors, **errors},
            also_stepped=tuple(e for e in self.also_stepped if e not in errors),
        )

    def shifted(self, offset: int) -> EnvRows:
        """These rows with every sub-env id raised by ``offset`` (a group's rows as rows of
        the whole env)."""
        return self._replace(
            env_ids=self.env_ids + offset,
            ended={offset + e: f for e, f in self.ended.items()},
            extra_rewards=[x._replace(env_id=x.env_id + offset) for x in self.extra_rewards],
            errors={offset + e: x for e, x in self.errors.items()},
            also_stepped=tuple(offset + e for e in self.also_stepped),
        )


class ExternalRows(EnvRows):
    """EnvRows plus the actions logged with ``log_action``, by ``(env_id, agent_id)``."""

    logged_actions: dict[tuple[int, Any], Any]

    @classmethod
    def of(cls, rows: EnvRows, logged_actions: dict[tuple[int, Any], Any]) -> ExternalRows:
        """``rows`` with ``logged_actions``."""
        out = cls._make(rows)
        out.logged_actions = logged_actions
        return out

    def _replace(self, /, **fields: Any) -> ExternalRows:
        out = super()._replace(**fields)  # (made by ``_make``: without the logged actions)
        out.logged_actions = self.logged_actions
        return out


_FALSES: dict[int, np.ndarray] = {}  #: read-only columns of n False, by n (see ``falses``)


def falses(n: int) -> np.ndarray:
    """A read-only bool column of ``n`` False, shared: a column that says "no row" (e.g.
    ``is_first`` when no episode begins) costs no array per poll, and ``some_true`` knows
    it without looking."""
    arr = _FALSES.get(n)
    if arr is None:
        if len(_FALSES) >= _MEMO_MAX:
            _FALSES.clear()
        arr = _FALSES[n] = np.zeros(n, _BOOL)
        arr.flags.writeable = False
    return arr


def some_true(flags: np.ndarray) -> bool:
    """Whether a bool column has a True (a shared ``falses`` column is known not to; a
    short one is looked at as a list: ``np.count_nonzero`` is two Python calls more)."""
    n = len(flags)
    if flags is _FALSES.get(n):
        return False
    return True in flags.tolist() if n <= _PYTHON_SORT_MAX else bool(np.count_nonzero(flags))


#: ``_unique_ids`` of read-only id columns, by ``id()`` (with the column: never a stale id)
_UNIQUE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _unique_ids(ids: np.ndarray) -> np.ndarray:
    """The sorted unique values of a read-only id column, kept while it recurs: a
    multi-agent poll's ``env_ids`` come from a ``LayoutMemo`` as long as the same agents
    act, so their sub-envs are sorted once, not at every poll."""
    kept = _UNIQUE.get(id(ids))
    if kept is not None and kept[0] is ids:
        return kept[1]
    if len(_UNIQUE) >= _MEMO_MAX:
        _UNIQUE.clear()
    out = np.unique(ids)
    out.flags.writeable = False
    _UNIQUE[id(ids)] = (ids, out)
    return out


def _stepped_envs(ids: np.ndarray, also: tuple[int, ...], ascending: bool) -> np.ndarray:
    """The sorted unique sub-envs of ``ids`` (rows that are not first ones) and ``also``."""
    if not also and ascending:
        return ids  # (a subset of ascending ids ascends)
    if not also and not ids.flags.writeable:  # a recurring column (``LayoutMemo``'s)
        return _unique_ids(ids)
    if len(ids) <= _PYTHON_SORT_MAX:  # (a few ids: Python's set and sort cost less)
        return np.array(sorted({*ids.tolist(), *also}), dtype=np.int64)
    return np.union1d(ids, np.asarray(also, dtype=np.int64))


def strictly_ascending(env_ids: np.ndarray) -> bool:
    """Whether ``env_ids`` rise strictly (``count_nonzero``: one C call; ``all()`` is not)."""
    return len(env_ids) < 2 or not np.count_nonzero(env_ids[1:] <= env_ids[:-1])


def done_envs_of(env_ids: np.ndarray, term: np.ndarray, trunc: np.ndarray) -> dict:
    """``done_envs`` of single-agent rows: each terminated or truncated row ends its episode."""
    idx = (term | trunc).nonzero()[0]  # the method: np.flatnonzero goes through wrappers
    if not len(idx):
        return {}
    # (equal lengths by construction: zip's strict check would cost a tenth of the call)
    return dict(zip(env_ids[idx].tolist(), zip(term[idx].tolist(), trunc[idx].tolist())))


class LayoutMemo:
    """Read-only ``env_ids`` columns kept from poll to poll: a multi-agent poll's recur as
    long as the same agents act (and a builder with a memo gives the shared ``falses``
    columns when no flag is set and no episode begins). One of each (at most
    ``_MEMO_MAX`` kept) instead of a numpy call per column and poll; read-only, so a
    reader that writes fails loudly instead of changing a later poll's rows (the runner
    only reads them; ``GymEnvs`` shares its ``env_ids`` likewise)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[tuple[int, ...], np.ndarray] = {}

    def ids(self, values: list[int]) -> np.ndarray:
        """``values`` as a read-only int64 array."""
        key = tuple(values)
        arr = self._ids.get(key)
        if arr is None:
            arr = _frozen(self._ids, key, np.array(values, dtype=np.int64))
        return arr


def _frozen(kept: dict[Any, np.ndarray], key: Any, arr: np.ndarray) -> np.ndarray:
    """``arr`` made read-only and kept under ``key`` (all forgotten when full)."""
    if len(kept) >= _MEMO_MAX:
        kept.clear()
    arr.flags.writeable = False
    kept[key] = arr
    return arr


class EnvRowsBuilder:
    """Collects one poll's rows, errors, extra rewards and episode ends; ``build()`` makes
    the ``EnvRows`` (see the module doc).

    ``single_agent``: every row is the one agent of its sub-env, so a terminated or
    truncated row ends its sub-env's episode (``done_envs`` is derived, ``end_episode`` is
    not needed) and stacked rows may be ``dense``. Multi-agent adapters leave it False and
    call ``end_episode`` for ``__all__``.

    ``memo``: where the columns that recur from poll to poll are kept (``LayoutMemo``;
    its arrays are read-only); None: every poll makes its own.
    """

    def __init__(self, *, single_agent: bool = False, memo: LayoutMemo | None = None) -> None:
        self.single_agent = single_agent
        self.memo = memo
        self._ids: list[int] = []
        self._agents: list[Any] = []
        self._obs: list[Any] = []
        self._rew: list[Any] = []
        self._infos: list[Mapping[str, Any]] = []
        #: the rows with a flag set, as runs ``(first row, terminateds, truncateds)``, and
        #: the first rows, as runs ``(first row, count)``: the columns are zeros elsewhere
        self._flags: list[tuple[int, list[bool], list[bool]]] = []
        self._firsts: list[tuple[int, int]] = []
        self._stepped: set[int] = set()  # sub-envs that stepped (their rows may not say)
        self._done: dict[int, tuple[bool, bool]] = {}
        self._extra: list[ExtraReward] = []
        self._errors: dict[int, BaseException] = {}

    def add_row(
        self,
        env_id: int,
        agent_id: Any,
        obs: Any,
        reward: Any = 0.0,
        terminated: bool = False,
        truncated: bool = False,
        info: Mapping[str, Any] | None = None,
        *,
        first: bool = False,
    ) -> None:
        """One row; ``first``: the first observation of a new episode (its reward and flags
        are ignored). A row that is not first means its sub-env stepped."""
        k = len(self._ids)
        self._ids.append(env_id)
        self._agents.append(agent_id)
        self._obs.append(obs)
        if first:
            self._rew.append(0.0)
            self._firsts.append((k, 1))
        else:
            self._rew.append(reward)
            term, trunc = bool(terminated), bool(truncated)
            if term or trunc:
                self._flags.append((k, [term], [trunc]))
        self._infos.append(info if info else EMPTY_INFO)

    def add_agent_rows(
        self,
        env_id: int,
        obs: Mapping[Any, Any],
        rewards: Mapping[Any, Any],
        terminateds: Mapping[Any, Any],
        truncateds: Mapping[Any, Any],
        infos: Mapping[Any, Any],
        *,
        first: bool = False,
    ) -> bool:
        """Sub-env ``env_id``'s step (or, ``first``, its reset) from a multi-agent env's
        dicts: a row for every agent with an observation (missing entries: reward 0, no
        flags, no info), what ``add_row`` per agent adds in a few list operations, and an
        ``ExtraReward`` for every agent rewarded or done without one. Not ``first``: the
        sub-env stepped (also when no agent observes); ``first`` ignores rewards and flags.
        ``"__all__"`` is the caller's (``end_episode``). Returns whether one of the agents
        with an observation goes on (is neither terminated nor truncated)."""
        n = len(obs)
        k = len(self._ids)
        self._ids += [env_id] * n
        self._agents += obs
        self._obs += obs.values()
        self._infos += [infos.get(a) or EMPTY_INFO for a in obs] if infos else [EMPTY_INFO] * n
        if first:
            self._rew += [0.0] * n
            if n:
                self._firsts.append((k, n))
            return n > 0
        if not n:
            self._stepped.add(env_id)
        self._rew += map(rewards.get, obs, _ZERO)
        # whether a flag dict names an agent: more keys than "__all__"s (cheaper than views)
        te, tr = terminateds, truncateds
        own_flags = len(te) + len(tr) != ("__all__" in te) + ("__all__" in tr)
        ended = 0
        if own_flags and (any(te.values()) or any(tr.values())):  # some flag may be set
            term = [bool(te.get(a, False)) for a in obs]
            trunc = [bool(tr.get(a, False)) for a in obs]
            ended = sum(t or u for t, u in zip(term, trunc))
            if ended:
                self._flags.append((k, term, trunc))
        if own_flags or not rewards.keys() <= obs.keys():
            self._add_unobserved(env_id, obs, rewards, te, tr)
        return ended < n

    def _add_unobserved(
        self,
        env_id: int,
        obs: Mapping[Any, Any],
        rewards: Mapping[Any, Any],
        terminateds: Mapping[Any, Any],
        truncateds: Mapping[Any, Any],
    ) -> None:
        """The extra rewards of the agents rewarded, or done, without an observation."""
        te, tr = terminateds, truncateds
        for a, val in rewards.items():
            if a not in obs:
                self.add_extra_reward(env_id, a, val, te.get(a, False), tr.get(a, False))
        named = obs.keys() | _ALL
        if te.keys() <= named and tr.keys() <= named:
            return  # no agent done without an observation
        for a in set(te) | set(tr):
            if a != "__all__" and a not in obs and a not in rewards and (te.get(a) or tr.get(a)):
                self.add_extra_reward(env_id, a, 0.0, te.get(a, False), tr.get(a, False))

    def add_error(self, env_id: int, exc: BaseException) -> None:
        """Sub-env ``env_id`` failed at this poll: none of its rows will be in the result."""
        self._errors[env_id] = exc

    def add_extra_reward(
        self,
        env_id: int,
        agent_id: Any,
        reward: Any,
        terminated: bool = False,
        truncated: bool = False,
    ) -> None:
        """A reward for an agent without an observation at this poll (see ``ExtraReward``)."""
        r = scalar_reward(reward)
        if r is None:
            self._errors[env_id] = bad_reward_error(env_id, [(agent_id, reward)])
            return
        self._extra.append(ExtraReward(env_id, agent_id, r, bool(terminated), bool(truncated)))

    def mark_stepped(self, env_id: int) -> None:
        """Sub-env ``env_id`` took an env step, even if it gave no row (every agent waits)."""
        self._stepped.add(env_id)

    def end_episode(self, env_id: int, terminated: bool, truncated: bool) -> None:
        """The whole episode of sub-env ``env_id`` ended at this poll (``__all__``)."""
        self._done[env_id] = (bool(terminated), bool(truncated))

    @overload
    def build(self, *, stack: StackFn | None = None) -> EnvRows: ...

    @overload
    def build(
        self, *, stack: StackFn | None = None, logged_actions: dict[tuple[int, Any], Any]
    ) -> ExternalRows: ...

    def build(
        self,
        *,
        stack: StackFn | None = None,
        logged_actions: dict[tuple[int, Any], Any] | None = None,
    ) -> EnvRows:
        """The rows (call once); ``stack`` makes one batch of the observations (else they
        stay a list), ``logged_actions`` makes ``ExternalRows``."""
        rewards, bad = reward_column(self._rew, self._ids, self._agents)
        errors = {**self._errors, **bad} if bad else self._errors
        flags = self._flag_columns()
        if errors and not errors.keys().isdisjoint(self._ids):  # leave out their rows
            rewards, flags = self._drop_rows_of(errors, rewards, flags)
        terminateds, truncateds, is_first = flags
        ids, obs, memo = self._ids, self._obs, self.memo
        env_ids = np.array(ids, dtype=np.int64) if memo is None else memo.ids(ids)
        ended, extra, also_stepped = self._done, self._extra, self._stepped
        if errors:
            ended = {e: f for e, f in ended.items() if e not in errors}
            extra = [x for x in extra if x.env_id not in errors]
            also_stepped = also_stepped.difference(errors)
        unfit: Mapping[int, BaseException] = {}
        if stack is not None:
            obs, unfit = stack(obs, ids)
        fields = (
            env_ids,
            tuple(self._agents),
            obs,
            rewards,
            terminateds,
            truncateds,
            self._infos,
            is_first,
            self.single_agent,
            ended,
            extra,
            errors,
            tuple(also_stepped),
        )
        rows = tuple.__new__(EnvRows, fields)  # (``EnvRows(...)``: one more Python call)
        if logged_actions is not None:
            rows = ExternalRows.of(rows, logged_actions)
        if unfit:
            return rows.without_envs(unfit)
        if not (self.single_agent or errors or self._flags or self._firsts):
            # the common multi-agent poll: no flag, first row or error; its facts known here
            ascending = len(env_ids) < 2  # (several rows: agents, not sub-envs, in order)
            stacked = type(obs) is not list
            rows.__dict__.update(
                stacked=stacked,
                ascending=ascending,
                dense=False,
                plain=True,
                stepped=_stepped_envs(env_ids, rows.also_stepped, ascending),
                done_envs=ended,
            )
        return rows

    def _flag_columns(self) -> Flags:
        """``terminateds``, ``truncateds`` and ``is_first`` of every row added: zeros, and
        the runs of rows that have some set."""
        n = len(self._ids)
        if self.memo is not None and not (self._flags or self._firsts):  # the common poll:
            none = falses(n)  # one shared column, which ``_derive`` looks at once
            return none, none, none
        term, trunc = np.zeros(n, _BOOL), np.zeros(n, _BOOL)
        for k, te, tr in self._flags:
            term[k : k + len(te)] = te
            trunc[k : k + len(tr)] = tr
        if self.memo is not None and not self._firsts:  # (only the runner reads is_first)
            return term, trunc, falses(n)
        first = np.zeros(n, _BOOL)
        for k, count in self._firsts:
            first[k : k + count] = True
        return term, trunc, first

    def _drop_rows_of(
        self, failed: Mapping[int, Any], rewards: np.ndarray, flags: Flags
    ) -> tuple[np.ndarray, Flags]:
        """Leave the rows of the ``failed`` sub-envs out of every column; returns the
        rewards and the flag columns of the rows kept."""
        keep = [k for k, e in enumerate(self._ids) if e not in failed]
        columns: tuple[list[Any], ...] = (self._ids, self._agents, self._obs, self._infos)
        for col in columns:
            col[:] = [col[k] for k in keep]
        term, trunc, first = flags
        return rewards[keep], (term[keep], trunc[keep], first[keep])

    @staticmethod
    def columns(
        env_ids: np.ndarray,
        obs: Any,
        rewards: Any,
        terminateds: Any,
        truncateds: Any,
        infos: Sequence[Mapping[str, Any]],
        is_first: np.ndarray | None,
        *,
        agent_ids: tuple | None = None,
        in_order: bool = False,
    ) -> EnvRows:
        """Single-agent rows from whole columns (``obs`` already one stacked batch): for
        adapters that step sub-envs as arrays. ``agent_ids`` defaults to
        ``DEFAULT_AGENT_ID`` per row; first rows get reward 0 and no flags.

        What an adapter knows for free it may say: ``is_first=None`` means no row is a
        first observation (no column to look at), ``in_order=True`` that ``env_ids`` rise
        strictly (e.g. every sub-env in order). The facts the rows imply are derived here,
        where the columns' making already tells most of them, not at their first read.
        """
        n = len(env_ids)
        agents = (DEFAULT_AGENT_ID,) * n if agent_ids is None else agent_ids
        if type(rewards) is np.ndarray and rewards.dtype is _FLOAT64 and rewards.shape == (n,):
            rew, bad = rewards, _NO_ERRORS  # (one float64 per row: e.g. checked by the adapter)
        else:
            rew, bad = reward_column(rewards, env_ids, agents)
        # flags given as a few Python lists with none set: one shared column of False
        # (``any`` on the lists costs less than numpy; ``some_true`` then needs no look)
        lists = n <= 64 and type(terminateds) is list and type(truncateds) is list
        if calm := lists and not (any(terminateds) or any(truncateds)):
            none = _FALSES.get(n)  # (read here: ``falses`` is a call)
            term = trunc = falses(n) if none is None else none
        else:
            term = np.asarray(terminateds, dtype=bool)
            trunc = np.asarray(truncateds, dtype=bool)
        stepped = env_ids
        if is_first is None:  # (``falses(n)`` again: the same column for all three flags)
            is_first = term if calm else falses(n)
        elif np.count_nonzero(is_first):
            keep = ~is_first
            rew = rew.copy()  # (np.where goes through a Python wrapper)
            rew[is_first] = 0.0
            term, trunc, stepped = term & keep, trunc & keep, env_ids[keep]
        fields = (env_ids, agents, obs, rew, term, trunc, infos, is_first, True, *_DEFAULTS)
        rows = tuple.__new__(EnvRows, fields)  # (``EnvRows(...)``: one more Python call)
        if bad:
            return rows.without_envs(bad)  # (its facts are derived when read)
        ascending = in_order or strictly_ascending(env_ids)
        ended = {} if calm else done_envs_of(env_ids, term, trunc)
        rows.__dict__.update(  # (what ``_derive`` would find, known here for less)
            stacked=True,
            ascending=ascending,
            dense=ascending,
            plain=stepped is env_ids and not ended,
            stepped=_stepped_envs(stepped, (), ascending),
            done_envs=ended,
        )
        return rows


def errors_only(errors: Mapping[int, BaseException]) -> EnvRows:
    """A poll with no rows, only ``errors`` (e.g. every sub-env of an engine that failed)."""
    b = EnvRowsBuilder()
    for env_id, exc in errors.items():
        b.add_error(env_id, exc)
    return b.build()
