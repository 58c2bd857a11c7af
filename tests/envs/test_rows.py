"""EnvRowsBuilder: one poll's rows, with the flags the columns imply derived by the builder."""

from __future__ import annotations

import numpy as np
import pytest

import rlconnect as rc
from rlconnect.envs import EnvRowsBuilder, ExtraReward
from rlconnect.envs.rows import ExternalRows, LayoutMemo

A = rc.DEFAULT_AGENT_ID


def _stack(obs, ids):
    return np.stack(obs), {}


def test_single_agent_rows_derive_stepped_done_and_dense():
    b = EnvRowsBuilder(single_agent=True)
    b.add_row(0, A, np.zeros(2), 1.5, False, False, {"x": 1})
    b.add_row(1, A, np.ones(2), info={"reset": True}, first=True)
    b.add_row(3, A, np.ones(2), np.array([2.0]), False, True, None)
    rows = b.build(stack=_stack)
    assert len(rows) == 3 and rows.env_ids.tolist() == [0, 1, 3]
    assert rows.agent_ids == (A, A, A)
    assert rows.obs.shape == (3, 2) and rows.stacked
    assert rows.rewards.tolist() == [1.5, 0.0, 2.0] and rows.rewards.dtype == np.float64
    assert rows.is_first.tolist() == [False, True, False]
    assert rows.stepped.tolist() == [0, 3]
    assert rows.done_envs == {3: (False, True)}
    assert rows.infos == [{"x": 1}, {"reset": True}, {}]
    assert rows.dense  # a subset of the sub-envs, ascending, one row each: still dense
    assert rows.errors == {} and rows.extra_rewards == []


@pytest.mark.parametrize(
    "case",
    ["unstacked", "descending", "two rows of one env", "error", "extra reward", "multi-agent"],
)
def test_what_makes_rows_not_dense(case: str):
    b = EnvRowsBuilder(single_agent=case != "multi-agent")
    ids = {"descending": [2, 1], "two rows of one env": [1, 1]}.get(case, [1, 2])
    for i in ids:
        b.add_row(i, A, np.zeros(2), 1.0)
    if case == "error":
        b.add_error(0, RuntimeError("boom"))
    if case == "extra reward":
        b.add_extra_reward(1, "other", 1.0)
    rows = b.build(stack=None if case == "unstacked" else _stack)
    assert not rows.dense


def test_errors_leave_out_every_row_and_record_of_their_sub_env():
    b = EnvRowsBuilder()
    b.add_row(0, "a", "o0", 1.0)
    b.add_row(1, "a", "o1a", 1.0)
    b.add_row(1, "b", "o1b", 2.0, True, False)
    b.add_extra_reward(1, "c", 3.0)
    b.end_episode(1, True, False)
    b.add_error(1, RuntimeError("boom"))
    rows = b.build()
    assert rows.env_ids.tolist() == [0] and rows.obs == ["o0"] and not rows.stacked
    assert rows.stepped.tolist() == [0] and rows.done_envs == {} and rows.extra_rewards == []
    assert list(rows.errors) == [1]


def test_multi_agent_episode_ends_and_steps_without_rows_are_explicit():
    b = EnvRowsBuilder()
    b.add_row(0, "a", "o", 1.0, True, False)  # an agent ending does not end the episode
    b.mark_stepped(2)  # stepped, no agent observes
    b.add_extra_reward(2, "b", np.array([0.5]), terminated=True)
    b.end_episode(2, False, True)
    rows = b.build()
    assert rows.stepped.tolist() == [0, 2]
    assert rows.done_envs == {2: (False, True)}
    assert rows.extra_rewards == [ExtraReward(2, "b", 0.5, True, False)]
    env_id, agent_id, reward, terminated, truncated = rows.extra_rewards[0]  # as the runner reads
    assert (env_id, agent_id, reward, terminated, truncated) == (2, "b", 0.5, True, False)


def test_bad_rewards_fail_their_sub_env_only():
    b = EnvRowsBuilder()
    b.add_row(0, "a", "o", np.ones(2))
    b.add_row(0, "b", "o", "not a number")
    b.add_row(1, "a", "o", np.float32(1.0))
    b.add_extra_reward(2, "c", [1.0, 2.0])
    rows = b.build()
    assert rows.env_ids.tolist() == [1] and rows.rewards.tolist() == [1.0]
    assert sorted(rows.errors) == [0, 2]
    assert all(isinstance(e, rc.EnvCheckError) for e in rows.errors.values())
    text = str(rows.errors[0])
    assert "env 0 / agent 'a': reward is an array of shape (2,)" in text
    assert "env 0 / agent 'b': reward is str" in text
    assert "env 2 / agent 'c'" in str(rows.errors[2])


def test_observations_the_stack_rejects_fail_their_sub_env():
    def stack(obs, ids):
        bad = {i: rc.EnvCheckError(f"bad obs {i}") for i, o in zip(ids, obs) if o.shape != (2,)}
        return np.stack([o if o.shape == (2,) else np.zeros(2) for o in obs]), bad

    b = EnvRowsBuilder(single_agent=True)
    b.add_row(0, A, np.zeros(2), 1.0)
    b.add_row(1, A, np.zeros(3), 1.0, True, False)
    rows = b.build(stack=stack)
    assert rows.env_ids.tolist() == [0] and rows.obs.shape == (1, 2)
    assert list(rows.errors) == [1] and rows.done_envs == {} and not rows.dense


def test_columns_derive_like_the_row_builder():
    ids = np.arange(3, dtype=np.int64)
    first = np.array([False, True, False])
    rows = EnvRowsBuilder.columns(
        ids,
        np.zeros((3, 2)),
        np.array([[1.0], [9.0], [2.0]]),  # a (R, 1) column, and a first row's reward
        [True, True, False],
        [False, False, False],
        [{}, {}, {}],
        first,
    )
    assert rows.rewards.tolist() == [1.0, 0.0, 2.0]
    assert rows.terminateds.tolist() == [True, False, False]  # a first row has no flags
    assert rows.stepped.tolist() == [0, 2] and rows.done_envs == {0: (True, False)}
    assert rows.agent_ids == (A, A, A) and rows.stacked and rows.dense


@pytest.mark.parametrize("as_lists", [True, False])
def test_columns_hints_give_the_rows_the_derivation_gives(as_lists):
    """``is_first=None`` (no first rows) is what an adapter knows for free; with it the
    rows are those of an ``is_first`` of zeros, flags as lists or arrays."""
    ids = np.arange(4, dtype=np.int64)
    term, trunc = [False, True, False, False], [False, False, False, True]
    if not as_lists:
        term, trunc = np.array(term), np.array(trunc)
    args = (ids, np.ones((4, 2)), [1.0, 2.0, 3.0, 4.0], term, trunc, [{}] * 4)
    hinted = EnvRowsBuilder.columns(*args, None)
    derived = EnvRowsBuilder.columns(*args, np.zeros(4, dtype=bool))
    for rows in (hinted, derived):
        assert rows.done_envs == {1: (True, False), 3: (False, True)}
        assert rows.stepped.tolist() == [0, 1, 2, 3] and rows.dense
        assert rows.is_first.tolist() == [False] * 4
        assert all(type(v) is bool for flags in rows.done_envs.values() for v in flags)
    calm = EnvRowsBuilder.columns(
        ids, np.ones((4, 2)), [0.0] * 4, [False] * 4, [False] * 4, [{}] * 4, None
    )
    assert calm.done_envs == {} and calm.dense
    assert calm.plain and calm.is_first is calm.terminateds  # (one shared column of False)
    both = np.array([False, True, False, False])  # one array for both flags: rows of its own
    shared = EnvRowsBuilder.columns(ids, np.ones((4, 2)), [0.0] * 4, both, both, [{}] * 4, None)
    assert not shared.is_first.any() and shared.done_envs == {1: (True, True)}
    assert not shared.plain


def _agents_rows(flags: dict[str, bool], *, first: bool = False) -> rc.envs.EnvRows:
    """Two agents of sub-env 0 (``flags``: its terminateds; ``__all__`` ends its episode)
    and of sub-env 1."""
    b = EnvRowsBuilder()
    obs = {"a": np.zeros(2), "b": np.ones(2)}
    b.add_agent_rows(0, obs, {"a": 1.0}, flags, {}, {}, first=first)
    if flags.get("__all__"):
        b.end_episode(0, True, False)
    b.add_agent_rows(1, obs, {}, {}, {}, {})
    return b.build()


@pytest.mark.parametrize(
    ("case", "plain"),
    [("calm", True), ("terminated", False), ("first", False), ("episode over", True)],
)
def test_plain_rows_are_those_without_a_first_row_or_a_flag(case: str, plain: bool):
    """``plain`` lets the runner skip looking at the flag columns: it is True only when
    every flag and ``is_first`` is False (an episode ended by ``end_episode`` leaves the
    rows' own flags unset), and dropping rows keeps it true."""
    flags = {"terminated": {"b": True}, "episode over": {"__all__": True}}.get(case, {})
    rows = _agents_rows(flags, first=case == "first")
    assert rows.plain is plain and (case != "episode over" or rows.done_envs == {0: (True, False)})
    unset = not (rows.is_first.any() or rows.terminateds.any() or rows.truncateds.any())
    assert unset or not rows.plain
    kept = rows.without_envs({1: RuntimeError("gone")})
    assert kept.plain is plain and kept.env_ids.tolist() == [0, 0]


def test_columns_out_of_order_are_not_dense():
    ids = np.array([2, 0, 1], dtype=np.int64)
    rows = EnvRowsBuilder.columns(
        ids, np.zeros((3, 2)), [1.0] * 3, [False] * 3, [False] * 3, [{}] * 3, None
    )
    assert not rows.dense and rows.stepped.tolist() == [0, 1, 2]


def test_columns_with_a_bad_reward_shape_fail_every_sub_env():
    rows = EnvRowsBuilder.columns(
        np.arange(2, dtype=np.int64),
        np.zeros((2, 2)),
        np.ones((2, 2)),
        [False, False],
        [False, False],
        [{}, {}],
        np.zeros(2, bool),
    )
    assert len(rows) == 0 and sorted(rows.errors) == [0, 1] and not rows.dense


def test_logged_actions_make_external_rows_and_survive_without_envs():
    b = EnvRowsBuilder()
    b.add_row(0, "a", "o", 1.0)
    b.add_row(1, "a", "o", 1.0)
    rows = b.build(logged_actions={(1, "a"): 3})
    assert isinstance(rows, ExternalRows) and rows.logged_actions == {(1, "a"): 3}
    fewer = rows.without_envs({0: RuntimeError("x")})
    assert isinstance(fewer, ExternalRows) and fewer.logged_actions == {(1, "a"): 3}
    assert fewer.env_ids.tolist() == [1] and list(fewer.errors) == [0]


def test_an_empty_builder_builds_empty_rows():
    rows = EnvRowsBuilder().build()
    assert len(rows) == 0 and rows.stepped.dtype == np.int64 and not rows.is_first.any()
    assert rows.done_envs == {} and rows.errors == {} and rows.extra_rewards == []


def _memo_poll(memo: LayoutMemo, agents: tuple[str, ...], *, first: bool = False):
    b = EnvRowsBuilder(memo=memo)
    b.add_agent_rows(0, dict.fromkeys(agents, np.zeros(2)), {}, {}, {}, {}, first=first)
    b.add_agent_rows(2, {"x": np.ones(2)}, {"x": 1.0}, {}, {}, {})
    return b.build(stack=_stack)


def test_a_memo_shares_the_read_only_columns_of_polls_laid_out_alike():
    """``env_ids`` recur while the same agents act: one read-only array; a poll where no
    flag is set and no episode begins has one shared read-only column of False for
    ``is_first`` and both flags (a connector writing into it fails loudly, as on the dense
    single-agent path), a poll with flags its own columns, and another layout its own."""
    memo = LayoutMemo()
    one, two = _memo_poll(memo, ("a", "b")), _memo_poll(memo, ("a", "b"))
    assert one.env_ids is two.env_ids and one.stepped.tolist() == two.stepped.tolist()
    assert one.is_first is two.is_first and not one.is_first.any()
    assert one.env_ids.tolist() == [0, 0, 2] and one.stepped.tolist() == [0, 2]
    assert one.terminateds is one.truncateds is one.is_first is two.terminateds
    for column in (one.env_ids, one.is_first):
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 1
    other = _memo_poll(memo, ("a",), first=True)
    assert other.terminateds is not one.terminateds and other.terminateds.flags.writeable
    assert other.env_ids.tolist() == [0, 2] and other.stepped.tolist() == [2]
    assert other.is_first.tolist() == [True, False] and not other.plain
    b = EnvRowsBuilder(memo=memo)  # sub-envs in another order: stepped still ascends
    for e in (8, 1, 8):
        b.add_agent_rows(e, {"a": np.zeros(2)}, {}, {}, {}, {})
    assert b.build().stepped.tolist() == [1, 8]
    for k in range(70):  # more layouts than a memo keeps: each still gets its own
        rows = _memo_poll(memo, tuple(f"a{i}" for i in range(k + 1)))
        assert rows.env_ids.tolist() == [0] * (k + 1) + [2]


def test_agent_flags_that_are_all_false_leave_the_rows_plain():
    """Flag dicts that name every agent (as PettingZoo's do) but set none: no row flag."""
    b = EnvRowsBuilder()
    obs = {"a": np.zeros(2), "b": np.ones(2)}
    flags = {"a": False, "b": np.False_, "__all__": False}
    assert b.add_agent_rows(0, obs, {"a": 1.0}, flags, dict(flags), {})
    rows = b.build()
    assert rows.plain and not rows.terminateds.any() and rows.rewards.tolist() == [1.0, 0.0]


def test_agents_without_an_observation_get_extra_rewards():
    """Rewarded without an observation: the reward, with the agent's flags; done without
    either: a reward of 0 that ends its trajectory; ``__all__`` is not an agent."""
    b = EnvRowsBuilder()
    obs = {"a": np.zeros(2)}
    te = {"a": False, "c": True, "__all__": False}
    going = b.add_agent_rows(3, obs, {"a": 1.0, "b": 2.0}, te, {"b": True}, {})
    rows = b.build()
    assert going and rows.env_ids.tolist() == [3] and rows.rewards.tolist() == [1.0]
    assert sorted(rows.extra_rewards) == [
        ExtraReward(3, "b", 2.0, False, True),
        ExtraReward(3, "c", 0.0, True, False),
    ]


def test_rows_are_a_frozen_record_whose_facts_are_derived_when_read():
    """``EnvRows`` holds data fields (read-only); ``stepped``, ``done_envs``,
    ``stacked``, ``dense`` and ``plain`` are derived from them when first read, and a
    record with other fields (``_replace``, ``shifted``) derives its own."""
    ids = np.arange(3, dtype=np.int64)
    rows = EnvRowsBuilder.columns(
        ids, np.zeros((3, 2)), [1.0, 2.0, 3.0], [False, True, False], [False] * 3, [{}] * 3,
        np.array([True, False, False]),
    )  # fmt: skip
    with pytest.raises(AttributeError):
        rows.env_ids = ids[:1]  # type: ignore[misc]
    assert rows.stacked and rows.dense and not rows.plain
    assert rows.stepped.tolist() == [1, 2] and rows.done_envs == {1: (True, False)}
    moved = rows.shifted(4)
    assert moved.env_ids.tolist() == [4, 5, 6] and moved.stepped.tolist() == [5, 6]
    assert moved.done_envs == {5: (True, False)} and rows.stepped.tolist() == [1, 2]
    listed = rows._replace(obs=[np.zeros(2)] * 3)
    assert not listed.stacked and not listed.dense
    b = EnvRowsBuilder()
    b.add_agent_rows(1, {}, {}, {}, {}, {})  # stepped, every agent waits: no row
    b.add_agent_rows(0, {"a": 0}, {}, {}, {}, {})
    b.end_episode(0, False, True)
    waiting = b.build()
    assert waiting.stepped.tolist() == [0, 1] and waiting.also_stepped == (1,)
    assert waiting.done_envs == {0: (False, True)} and not waiting.dense and waiting.plain


_FACTS = ("stacked", "ascending", "dense", "plain", "stepped", "done_envs")


def _assert_facts_as_derived(rows) -> None:
    """The facts ``rows`` came with are those a fresh record of its fields derives."""
    fresh = type(rows)._make(rows)
    assert not fresh.__dict__
    for fact in _FACTS:
        given, derived = getattr(rows, fact), getattr(fresh, fact)
        if isinstance(given, np.ndarray):
            np.testing.assert_array_equal(given, derived)
        else:
            assert given == derived, fact


@pytest.mark.parametrize("seed", range(24))
def test_the_facts_columns_gives_are_those_its_fields_derive(seed: int):
    """``EnvRowsBuilder.columns`` sets the facts as it makes the rows; the same fields in
    a fresh record (``_make``: nothing set) derive the same facts, whatever the flags,
    first rows, order of ids and hint."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    ids = rng.permutation(n) if seed % 3 == 0 else np.arange(n)
    ids = ids.astype(np.int64)
    term, trunc = rng.random(n) < 0.3, rng.random(n) < 0.2
    flags: tuple = (term.tolist(), trunc.tolist()) if seed % 2 else (term, trunc)
    first = None if seed % 4 == 1 else rng.random(n) < 0.3
    in_order = seed % 3 != 0 and bool(rng.integers(2))
    rows = EnvRowsBuilder.columns(
        ids, np.zeros((n, 2)), rng.random(n), *flags, [{}] * n, first, in_order=in_order
    )
    _assert_facts_as_derived(rows)


@pytest.mark.parametrize("seed", range(16))
def test_the_facts_build_gives_are_those_its_fields_derive(seed: int):
    """Multi-agent rows of ``build`` (a memo or not, agents that wait, flags, first rows
    and episode ends or none): the facts ``build`` sets are those a fresh record derives."""
    rng = np.random.default_rng(seed)
    b = EnvRowsBuilder(memo=LayoutMemo() if seed % 2 else None)
    for e in rng.permutation(4).tolist():
        agents = [a for a in "xyz" if rng.random() < 0.7]
        if not agents:
            b.mark_stepped(e)
            continue
        flags = {a: True for a in agents if seed % 4 == 3 and rng.random() < 0.3}
        b.add_agent_rows(
            e, {a: np.zeros(2) for a in agents}, dict.fromkeys(agents, 1.0), flags, {}, {},
            first=seed % 8 == 5,
        )  # fmt: skip
        if seed % 3 == 0 and rng.random() < 0.3:
            b.end_episode(e, True, False)
    rows = b.build()
    _assert_facts_as_derived(rows)
