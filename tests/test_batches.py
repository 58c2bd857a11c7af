"""Tests for rlconnect.batches: hand-computed cases, then hypothesis properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tree
from hypothesis import given, settings
from hypothesis import strategies as st

from rlconnect.batches import (
    DEFAULT_AGENT_ID,
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    batches_equal,
    concat_samples,
)
from rlconnect.batches.take import take_rows

SB = SampleBatch


def make_batch(n: int = 6) -> SampleBatch:
    return SB(
        {
            SB.OBS: np.arange(n * 2, dtype=np.float32).reshape(n, 2),
            SB.ACTIONS: np.arange(n, dtype=np.int64),
            SB.EPS_ID: np.array([5, 5, 3, 5, 3, 9][:n], dtype=np.int64),
            SB.T: np.array([0, 1, 0, 2, 1, 0][:n], dtype=np.int64),
            SB.INFOS: [{"i": i} for i in range(n)],
            "nested": {"a": np.arange(n) * 10, "b": (np.ones((n, 3)), np.zeros(n, bool))},
        },
        meta={"source": "unit"},
    )


# --- construction -------------------------------------------------------------------------


def test_constants_and_defaults():
    assert DEFAULT_POLICY_ID == "default_policy"
    assert DEFAULT_AGENT_ID == "agent0"
    assert (SB.OBS, SB.NEXT_OBS, SB.TERMINATEDS, SB.EPS_ID) == (
        "obs",
        "new_obs",
        "terminateds",
        "eps_id",
    )
    assert (SB.ENV_ACTIONS, SB.RAW_OBS, SB.VF_PREDS) == ("env_actions", "raw_obs", "vf_preds")
    assert SB.state_in(0) == "state_in_0"
    assert SB.state_out(3) == "state_out_3"


def test_lists_become_arrays_and_infos_object_array():
    b = SB({"rewards": [1.0, 2.0], "infos": [{"a": [1, 2]}, {}]})
    assert b["rewards"].dtype == np.float64
    assert b["infos"].dtype == object
    assert b["infos"].shape == (2,)
    assert b["infos"][0] == {"a": [1, 2]}
    ragged = SB({"x": [[1, 2], [3]]})
    assert ragged["x"].shape == (2,)
    assert ragged["x"][1] == [3]


def test_empty_batch():
    b = SB()
    assert len(b) == 0
    assert b.count == 0
    assert list(b) == []
    assert b.nbytes == 0
    assert repr(b) == "SampleBatch(0 rows)"


def test_length_mismatch_names_columns():
    with pytest.raises(ValueError, match=r"obs=3.*actions=2"):
        SB({"obs": np.zeros((3, 4)), "actions": np.zeros(2)})
    with pytest.raises(ValueError, match=r"nested/b=4"):
        SB({"obs": np.zeros(3), "nested": {"a": np.zeros(3), "b": np.zeros(4)}})


def test_scalar_column_rejected():
    with pytest.raises(ValueError, match="leading row axis"):
        SB({"x": 3.0})


def test_mapping_protocol():
    b = make_batch()
    assert list(b.keys())[:2] == ["obs", "actions"]
    assert "obs" in b
    assert len(b.keys()) == 6  # columns, although the batch has 6 rows too
    assert len(SB({"x": np.zeros(9)}).keys()) == 1
    assert dict(b.items())["actions"] is b["actions"]
    assert "nope" not in b
    b["vf_preds"] = np.zeros(6)
    assert "vf_preds" in b
    with pytest.raises(ValueError, match="existing rows"):
        b["bad"] = np.zeros(5)
    del b["vf_preds"]
    assert "vf_preds" not in b
    assert not isinstance(b, dict)
    with pytest.raises(TypeError, match="take"):
        b[[0, 1]]


def test_replacing_only_column_may_change_length():
    b = SB({"x": np.zeros(3)})
    b["x"] = np.zeros(5)
    assert len(b) == 5
    del b["x"]
    assert len(b) == 0


def test_repr_and_nbytes():
    b = SB({"obs": np.zeros((120, 4), np.float32), "actions": np.zeros(120, np.int64)})
    assert repr(b) == "SampleBatch(120 rows: obs(4,) float32, actions int64)"
    assert b.nbytes == 120 * 4 * 4 + 120 * 8
    c = SB({"infos": [{}] * 10})
    assert c.nbytes == 80
    assert "nested/b/0(3,) float64" in repr(make_batch())


# --- slicing and take ---------------------------------------------------------------------


def test_slicing_hand_computed():
    b = make_batch()
    s = b[1:4]
    assert len(s) == 3
    np.testing.assert_array_equal(s["actions"], [1, 2, 3])
    np.testing.assert_array_equal(s["nested"]["a"], [10, 20, 30])
    assert s["nested"]["b"][1].shape == (3,)
    assert list(s["infos"]) == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert s.meta == {"source": "unit"}
    assert s.meta is not b.meta
    np.testing.assert_array_equal(b[::-2]["actions"], [5, 3, 1])
    assert len(b[10:]) == 0


def test_take_int_and_bool():
    b = make_batch()
    t = b.take([4, 0, 4])
    np.testing.assert_array_equal(t["actions"], [4, 0, 4])
    assert list(t["infos"]) == [{"i": 4}, {"i": 0}, {"i": 4}]
    m = b.take(b["eps_id"] == 3)
    np.testing.assert_array_equal(m["actions"], [2, 4])
    assert len(b.take([])) == 0
    with pytest.raises(IndexError, match="mask"):
        b.take(np.array([True, False]))


@pytest.mark.parametrize(
    "column",
    [
        np.arange(6, dtype=np.int64),
        np.arange(24, dtype=np.float32).reshape(6, 4),
        np.arange(36, dtype=np.float64).reshape(6, 2, 3),
        np.array([{"i": i} for i in range(6)], dtype=object),
        {"a": np.arange(12).reshape(6, 2), "b": (np.arange(6) > 2, np.ones((6, 1, 1)))},
    ],
)
def test_take_rows_equals_numpy_indexing(column):
    """``take_rows`` (np.take / np.compress for multi-axis leaves) gives what ``leaf[index]``
    gives: integer indices (repeated, out of order, negative, none) and boolean masks."""
    for index in (
        np.array([4, 0, 4, 5, -1]),
        np.array([], dtype=np.int64),
        np.array([True, False, True, True, False, False]),
        np.zeros(6, dtype=bool),
    ):
        got, want = take_rows(column, index), tree.map_structure(lambda c, i=index: c[i], column)
        for g, w in zip(tree.flatten(got), tree.flatten(want), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    for leaf in tree.flatten(column):  # a wrong mask or index raises as indexing does
        with pytest.raises(IndexError):
            take_rows(leaf, np.array([True, False]))
        with pytest.raises(IndexError):
            take_rows(leaf, np.array([6]))


def test_copy_shallow_and_deep():
    b = make_batch()
    shallow = b.copy()
    assert shallow["obs"] is b["obs"]
    shallow["extra"] = np.zeros(6)
    assert "extra" not in b
    deep = b.copy(deep=True)
    deep["obs"][0, 0] = 99
    deep["infos"][0]["i"] = 99
    assert b["obs"][0, 0] == 0
    assert b["infos"][0] == {"i": 0}


# --- split_by_episode ---------------------------------------------------------------------


def test_split_by_episode_order_and_time():
    b = make_batch()
    b["t"] = np.array([1, 0, 1, 2, 0, 0])  # eps 5 rows out of time order: rows 1, 0, 3
    eps = b.split_by_episode()
    assert [int(e["eps_id"][0]) for e in eps] == [5, 3, 9]
    np.testing.assert_array_equal(eps[0]["actions"], [1, 0, 3])
    np.testing.assert_array_equal(eps[0]["t"], [0, 1, 2])
    np.testing.assert_array_equal(eps[1]["actions"], [4, 2])
    np.testing.assert_array_equal(eps[2]["actions"], [5])
    assert [e["infos"][0]["i"] for e in eps] == [1, 4, 5]


def test_split_by_episode_without_t_is_stable():
    b = SB({"eps_id": [2, 1, 2, 1], "x": [0, 1, 2, 3]})
    eps = b.split_by_episode()
    np.testing.assert_array_equal(eps[0]["x"], [0, 2])
    np.testing.assert_array_equal(eps[1]["x"], [1, 3])


def test_split_by_episode_errors_and_empty():
    with pytest.raises(KeyError, match="eps_id"):
        SB({"x": [1]}).split_by_episode()
    assert SB({"eps_id": np.zeros(0, np.int64)}).split_by_episode() == []


# --- equality -----------------------------------------------------------------------------


def test_batches_equal():
    a = SB({"x": [1.0, np.nan], "infos": [{"k": 1}, {"k": 2}]})
    assert batches_equal(a, a.copy(deep=True))
    assert a == a.copy()
    assert not batches_equal(a, SB({"x": [1.0, np.nan], "infos": [{"k": 1}, {"k": 3}]}))
    assert not batches_equal(a, SB({"x": np.array([1.0, np.nan], np.float32), "infos": a["infos"]}))
    assert not batches_equal(SB({"n": {"a": [1]}}), SB({"n": ([1],)}))
    assert not batches_equal(a, SB({"x": [1.0, np.nan]}))


# --- concat -------------------------------------------------------------------------------


def test_concat_hand_computed_and_meta_merging():
    a = SB({"x": [1, 2], "infos": [{}, {"z": 1}]}, meta={"state": "s0", "run": 1})
    b = SB({"x": [3], "infos": [{"q": 2}]}, meta={"state": "s1", "run": 1, "more": True})
    c = concat_samples([a, SB(meta={"state": "s0"}), b])
    np.testing.assert_array_equal(c["x"], [1, 2, 3])
    assert c["infos"].dtype == object
    assert list(c["infos"]) == [{}, {"z": 1}, {"q": 2}]
    assert c.meta == {"state": ["s0", "s1"], "run": 1, "more": True}


@pytest.mark.parametrize("tensor", [False, True])
def test_concat_adds_up_rows_per_env_so_two_samples_fold_time_major(tensor: bool) -> None:
    """Two samples of the same sub-envs (T=2 each) fold as T=4, each sub-env's rows of the
    first then of the second; a part without ``rows_per_env`` leaves it unknown, and
    sub-envs that then have unequal rows are a named error, never a silent reshape."""
    import torch

    def sample(start: int) -> SampleBatch:
        cols = {"env_id": [0, 0, 1, 1], "t": [start, start + 1] * 2, "eps_id": [7, 7, 8, 8]}
        cols["x"] = [10 * e + t for e, t in zip(cols["env_id"], cols["t"])]
        if tensor:
            cols = {k: torch.tensor(v) for k, v in cols.items()}
        return SB(cols, meta={"rows_per_env": 2})

    both = concat_samples([sample(0), sample(2)])
    assert both.meta["rows_per_env"] == 4
    np.testing.assert_array_equal(
        np.asarray(both.time_major()["x"]), [[0, 10], [1, 11], [2, 12], [3, 13]]
    )
    multi = concat_samples(
        [MultiAgentBatch({"p": sample(0)}, 4), MultiAgentBatch({"p": sample(2)}, 4)]
    )
    assert multi.policy_batches["p"].meta["rows_per_env"] == 4
    part = sample(4)
    part = SB({k: part[k][:1] for k in part})
    uneven = concat_samples([sample(0), part])
    assert "rows_per_env" not in uneven.meta
    with pytest.raises(ValueError, match="same number of rows from every sub-env"):
        uneven.time_major()


def test_concat_column_mismatch_and_type_errors():
    with pytest.raises(ValueError, match=r"\['y'\]"):
        concat_samples([SB({"x": [1]}), SB({"x": [1], "y": [2]})])
    with pytest.raises(TypeError, match="mix"):
        concat_samples([SB({"x": [1]}), MultiAgentBatch({}, 0)])
    with pytest.raises(TypeError):
        concat_samples([{"x": [1]}])
    with pytest.raises(ValueError, match="'n'"):
        concat_samples([SB({"n": {"a": [1]}}), SB({"n": {"b": [1]}})])
    empty = concat_samples([])
    assert isinstance(empty, SampleBatch)
    assert len(empty) == 0


def test_concat_all_empty_keeps_columns_and_accepts_iterables():
    b = SB({"x": np.zeros(3, np.float32)}, meta={"k": 1})
    out = concat_samples([b[:0], SB()])
    assert len(out) == 0
    assert out["x"].dtype == np.float32
    assert out.meta == {"k": 1}
    assert len(concat_samples(x for x in [b, b])) == 6


# --- MultiAgentBatch ----------------------------------------------------------------------


def test_multi_agent_batch_counts_and_concat():
    p1 = SB({"x": np.arange(3)})
    p2 = SB({"x": np.arange(2)})
    ma = MultiAgentBatch({"p1": p1, "p2": p2}, env_steps=3)
    assert ma.env_steps() == 3
    assert ma.count == 3
    assert ma.agent_steps() == 5
    assert ma.nbytes == 5 * 8
    assert repr(ma) == "MultiAgentBatch(env_steps=3, agent_steps=5, rows={p1: 3, p2: 2})"
    other = MultiAgentBatch({"p3": SB({"x": [7]}), "p1": SB({"x": [9]})}, env_steps=1)
    cat = concat_samples([ma, other])
    assert list(cat.policy_batches) == ["p1", "p2", "p3"]
    assert cat.env_steps() == 4
    assert cat.agent_steps() == 7
    np.testing.assert_array_equal(cat.policy_batches["p1"]["x"], [0, 1, 2, 9])
    assert batches_equal(ma.copy(), ma)


@pytest.mark.parametrize(
    ("steps", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_multi_agent_batch_validates_env_steps(steps, error):
    with pytest.raises(error, match="env_steps"):
        MultiAgentBatch({}, steps)


# --- hypothesis properties ----------------------------------------------------------------

PROPS = settings(max_examples=50, deadline=None)


@st.composite
def batches(draw) -> SampleBatch:
    n = draw(st.integers(0, 12))
    num_eps = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    if n and draw(st.booleans()):
        obs[0, 0] = np.nan
    return SB(
        {
            SB.OBS: obs,
            SB.ACTIONS: rng.integers(0, 5, size=n),
            SB.EPS_ID: rng.integers(100, 100 + num_eps, size=n),
            SB.T: rng.permutation(n),
            SB.INFOS: [{"row": i, "tag": str(rng.integers(3))} for i in range(n)],
            "nested": {"pos": rng.normal(size=(n, 2)), "flags": (rng.random(n) > 0.5,)},
        }
    )


@PROPS
@given(batches(), st.lists(st.integers(0, 12), max_size=4))
def test_concat_of_slices_round_trips(batch, cuts):
    edges = [0, *sorted(min(c, len(batch)) for c in cuts), len(batch)]
    parts = [batch[a:b] for a, b in itertools.pairwise(edges)]
    assert batches_equal(concat_samples(parts), batch)


@PROPS
@given(batches(), st.integers(-14, 14) | st.none(), st.integers(-14, 14) | st.none(),
       st.sampled_from([None, 1, 2, -1, 3]))  # fmt: skip
def test_slicing_matches_numpy(batch, start, stop, step):
    s = slice(start, stop, step)
    sub = batch[s]
    assert len(sub) == len(batch["actions"][s])
    np.testing.assert_array_equal(sub["obs"], batch["obs"][s])
    np.testing.assert_array_equal(sub["nested"]["pos"], batch["nested"]["pos"][s])
    np.testing.assert_array_equal(sub["nested"]["flags"][0], batch["nested"]["flags"][0][s])
    assert list(sub["infos"]) == list(batch["infos"][s])
    assert batches_equal(sub, batch.take(np.arange(len(batch))[s]))


@PROPS
@given(batches())
def test_split_by_episode_groups_rows(batch):
    eps = batch.split_by_episode()
    assert sum(len(e) for e in eps) == len(batch)
    firsts = [int(e["eps_id"][0]) for e in eps]
    _, idx = np.unique(batch["eps_id"], return_index=True)
    assert firsts == [int(batch["eps_id"][i]) for i in sorted(idx)]
    for e in eps:
        assert len(set(e["eps_id"].tolist())) == 1
        assert np.all(np.diff(e["t"]) > 0)
    # The same rows, grouped by episode: oracle built with a plain Python sort.
    if not len(batch):
        assert eps == []
        return
    order = sorted(
        range(len(batch)), key=lambda i: (firsts.index(batch["eps_id"][i]), batch["t"][i])
    )
    assert batches_equal(concat_samples(eps), batch.take(np.array(order, dtype=np.int64)))
    assert [r["row"] for r in concat_samples(eps)["infos"]] == order


def test_split_property_can_fail():
    """Negative control: the grouping oracle rejects an ungrouped ordering."""
    b = SB({"eps_id": [1, 2, 1], "t": [0, 0, 1], "x": [0, 1, 2]})
    assert not batches_equal(concat_samples(b.split_by_episode()), b)
