"""Tests for rlconnect.spaces: hand-computed flattening, gymnasium oracle, checks, JSON safety."""

from __future__ import annotations

import json
import tracemalloc

import gymnasium.spaces as gs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlconnect.spaces import (
    batch_in_space,
    batch_len,
    check_batch,
    clip_to_space,
    describe_space,
    flat_dim,
    flatten_batch,
    flatten_space,
    space_from_json,
    space_to_json,
    spaces_equal,
    squash,
    stack_samples,
    unsquash,
    unstack_batch,
    zeros_batch,
)

# -- hand-computed flattening ----------------------------------------------------------------


def test_discrete_with_start_one_hot():
    sp = gs.Discrete(3, start=-1)
    out = flatten_batch(sp, np.array([-1, 1, 0]))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 0, 0], [0, 0, 1], [0, 1, 0]])


def test_multidiscrete_one_hot_per_component():
    sp = gs.MultiDiscrete([2, 3], start=[1, 0])
    out = flatten_batch(sp, np.array([[1, 2], [2, 0]]))
    np.testing.assert_array_equal(out, [[1, 0, 0, 0, 1], [0, 1, 1, 0, 0]])
    assert flat_dim(sp) == 5


def test_multibinary_and_box():
    mb = gs.MultiBinary([2, 2])
    np.testing.assert_array_equal(
        flatten_batch(mb, np.array([[[1, 0], [0, 1]]], np.int8)), [[1, 0, 0, 1]]
    )
    box = gs.Box(-1.0, 1.0, (2, 2))
    x = np.arange(8, dtype=np.float64).reshape(2, 2, 2) / 10
    np.testing.assert_array_equal(flatten_batch(box, x), x.reshape(2, 4).astype(np.float32))


def test_nested_tuple_dict():
    sp = gs.Dict({"b": gs.Discrete(2), "a": gs.Tuple((gs.Box(0.0, 5.0, (1,)), gs.Discrete(2)))})
    batch = {"b": np.array([1]), "a": (np.array([[4.0]]), np.array([0]))}
    # Dict order is space.spaces order (gymnasium sorts plain dict keys: a, b)
    np.testing.assert_array_equal(flatten_batch(sp, batch), [[4.0, 1, 0, 0, 1]])
    assert flat_dim(sp) == 5
    fs = flatten_space(sp)
    np.testing.assert_array_equal(fs.low, [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(fs.high, [5, 1, 1, 1, 1])
    assert fs.dtype == np.float32


def test_out_of_range_discrete_raises():
    with pytest.raises(ValueError, match="out of range"):
        flatten_batch(gs.Discrete(3, start=1), np.array([1, 4]))
    with pytest.raises(ValueError, match="out of range"):
        flatten_batch(gs.MultiDiscrete([2, 2]), np.array([[0, -1]]))
    with pytest.raises(ValueError, match="integers"):
        flatten_batch(gs.Discrete(3), np.array([0.0, 1.0]))


# -- oracle: gymnasium.spaces.flatten per sample ----------------------------------------------

_leaf_spaces = st.one_of(
    st.builds(lambda n, s: gs.Discrete(n, start=s), st.integers(1, 5), st.integers(-3, 3)),
    st.builds(
        lambda nv, s: gs.MultiDiscrete(nv, start=[s] * len(nv)),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        st.integers(-2, 2),
    ),
    st.builds(gs.MultiBinary, st.lists(st.integers(1, 3), min_size=1, max_size=2)),
    st.builds(
        lambda shape, lo, w, dt: gs.Box(lo, lo + w, tuple(shape), dt),
        st.lists(st.integers(1, 3), min_size=0, max_size=2),
        st.floats(-5, 5),
        st.floats(0.5, 5),
        st.sampled_from([np.float32, np.float64]),
    ),
    st.just(gs.Box(-np.inf, np.inf, (3,), np.float32)),
    st.just(gs.Box(0, 255, (2, 2), np.uint8)),
)
_spaces = st.recursive(
    _leaf_spaces,
    lambda inner: st.one_of(
        st.builds(lambda xs: gs.Tuple(xs), st.lists(inner, min_size=1, max_size=3)),
        st.builds(
            lambda d: gs.Dict(d),
            st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3),
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(_spaces, st.integers(0, 2**31 - 1), st.integers(1, 4))
def test_flatten_batch_matches_gymnasium(space, seed, n):
    space.seed(seed)
    samples = [space.sample() for _ in range(n)]
    batch = stack_samples(space, samples)
    assert batch_len(batch) == n
    expected = np.stack([gs.flatten(space, s).astype(np.float32) for s in samples])
    np.testing.assert_array_equal(flatten_batch(space, batch), expected)
    assert flatten_batch(space, batch).shape == (n, flat_dim(space))
    assert batch_in_space(space, batch).all()
    assert flatten_space(space).contains(flatten_batch(space, batch)[0])
    for row, sample in zip(unstack_batch(batch), samples):
        np.testing.assert_array_equal(gs.flatten(space, row), gs.flatten(space, sample))
    zeros = zeros_batch(space, 2)
    assert batch_len(zeros) == 2
    assert flatten_batch(space, zeros).shape == (2, flat_dim(space))


@settings(max_examples=60, deadline=None)
@given(_spaces)
def test_json_round_trip(space):
    back = space_from_json(json.loads(json.dumps(space_to_json(space))))
    assert back == space
    assert spaces_equal(back, space)
    assert describe_space(back) == describe_space(space)


def test_json_round_trip_special_spaces():
    box = gs.Box(np.float32([-np.inf, 0.0]), np.float32([np.inf, 1.5]), dtype=np.float32)
    text = gs.Text(8, min_length=2, charset="abc")
    md = gs.MultiDiscrete([[2, 3], [4, 5]], dtype=np.int32)
    for sp in (box, text, md, gs.MultiBinary(4), gs.Discrete(4, start=-2, dtype=np.int32)):
        encoded = json.dumps(space_to_json(sp), allow_nan=False)  # pure JSON, no NaN tokens
        assert space_from_json(json.loads(encoded)) == sp
    assert space_to_json(box)["low"] == ["-inf", 0.0]


# -- membership and error messages -----------------------------------------------------------


def test_batch_in_space_rows():
    sp = gs.Tuple((gs.Box(-1.0, 1.0, (2,)), gs.Discrete(3)))
    batch = (np.array([[0, 0], [np.nan, 0], [0, 2], [0, 0]]), np.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(batch_in_space(sp, batch), [True, False, False, False])
    assert not batch_in_space(sp, (np.zeros((4, 3)), np.zeros(4, int))).any()
    inf_box = gs.Box(-np.inf, np.inf, (1,))
    np.testing.assert_array_equal(batch_in_space(inf_box, np.array([[np.inf], [np.nan]])), [1, 0])


def test_check_batch_messages_name_field_rows_and_reason():
    sp = gs.Dict({"pos": gs.Box(-1.0, 1.0, (2,)), "id": gs.Discrete(4)})
    pos = np.zeros((8, 2))
    pos[1, 0] = np.nan
    pos[2:9, 1] = 3.0
    labels = [f"env {i} / agent 'a'" for i in range(8)]
    batch = {"pos": pos, "id": np.arange(8) % 4}
    with pytest.raises(ValueError) as info:
        check_batch(sp, batch, field="new_obs", row_labels=labels)
    msg = str(info.value)
    assert "new_obs['pos']" in msg
    assert "NaN" in msg
    assert "env 1 / agent 'a'" in msg
    assert "outside [-1.0, 1.0]" in msg
    assert "and 1 more" in msg  # rows 2..7: five shown, one more
    assert "env 7 / agent 'a'" not in msg


def test_check_batch_shape_dtype_and_structure():
    sp = gs.Dict({"a": gs.Discrete(2), "b": gs.Box(0.0, 1.0, (3,))})
    with pytest.raises(ValueError, match=r"wrong dtype: got float64, expected integers"):
        check_batch(sp, {"a": np.array([0.0, 1.0]), "b": np.zeros((2, 3))}, field="obs")
    with pytest.raises(ValueError, match=r"obs\['b'\]: wrong shape: expected \(2, 3\), got"):
        check_batch(sp, {"a": np.array([0, 1]), "b": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="missing"):
        check_batch(sp, {"a": np.array([0, 1]), "c": np.zeros((2, 3))}, field="actions")
    with pytest.raises(ValueError, match="infinite"):
        check_batch(gs.Box(0.0, 1.0, (1,)), np.array([[np.inf]]))
    check_batch(sp, {"a": np.array([0, 1]), "b": np.zeros((2, 3))})  # negative control


# -- Box helpers ------------------------------------------------------------------------------

_BOX = gs.Box(np.float32([-2.0, 0.0, -np.inf, 1.0]), np.float32([2.0, 10.0, np.inf, np.inf]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=4, max_size=4))
def test_unsquash_always_in_bounds(values):
    out = unsquash(_BOX, np.array([values]))
    assert out.dtype == np.float32
    assert _BOX.contains(out[0])


def test_unsquash_squash_round_trip_and_hand_values():
    np.testing.assert_allclose(
        unsquash(_BOX, np.array([-1.0, 0.5, -0.3, 5.0])), [-2.0, 7.5, -0.3, 1.0]
    )
    x = np.array([[0.5, -0.5, 0.2, 0.9], [-1.0, 1.0, -1.0, 1.0]], np.float32)
    back = squash(_BOX, unsquash(_BOX, x))
    np.testing.assert_allclose(back[:, :3], x[:, :3], atol=1e-6)
    np.testing.assert_allclose(clip_to_space(_BOX, [5.0, -1.0, 7.0, 0.0]), [2, 0, 7, 1])
    with pytest.raises(TypeError, match="Discrete"):
        unsquash(gs.Discrete(2), np.zeros(1))


# -- hostile JSON -----------------------------------------------------------------------------

_GOOD_BOX = {"type": "Box", "dtype": "float32", "shape": [2], "low": [0, 0], "high": [1, 1]}


def _nested_tuple(depth):
    obj = {"type": "Discrete", "n": 2}
    for _ in range(depth):
        obj = {"type": "Tuple", "spaces": [obj]}
    return obj


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"type": "Graph"}, "known types"),
        ("Box", "expected an object"),
        ({**_GOOD_BOX, "dtype": "object"}, "dtype 'object' is not allowed"),
        ({**_GOOD_BOX, "dtype": "O"}, "not allowed"),
        ({**_GOOD_BOX, "shape": [2**20, 2**20], "low": 0, "high": 1}, "more than"),
        ({**_GOOD_BOX, "shape": [-1]}, "outside"),
        ({**_GOOD_BOX, "shape": "2"}, "shape: expected a list"),
        ({**_GOOD_BOX, "low": [0, 0, 0]}, "low: does not match shape"),
        ({**_GOOD_BOX, "low": [0, "zero"]}, "low: expected a number"),
        ({**_GOOD_BOX, "low": [0, True]}, "low: expected a number"),
        ({**_GOOD_BOX, "extra": 1}, "unexpected field"),
        ({"type": "Box", "shape": [1], "low": [0]}, "missing field"),
        ({**_GOOD_BOX, "low": [2, 2]}, "invalid Box"),
        ({"type": "Discrete", "n": "3"}, "n: expected an integer"),
        ({"type": "Discrete", "n": 0}, r"n: 0 is outside"),
        ({"type": "Discrete", "n": 2, "start": 2**70}, "start"),
        ({"type": "MultiDiscrete", "nvec": [0, 2]}, "invalid MultiDiscrete"),
        ({"type": "MultiDiscrete", "nvec": [[2, 3], [2]]}, "nvec: does not match shape"),
        ({"type": "MultiDiscrete", "nvec": [2, 3], "dtype": "float32"}, "not allowed"),
        ({"type": "MultiBinary", "n": 2**30}, "outside"),
        ({"type": "Dict", "spaces": {"a": {"type": "Discrete", "n": 2}}}, "expected a list"),
        ({"type": "Dict", "spaces": [[1, {"type": "Discrete", "n": 2}]]}, "string key"),
        (_nested_tuple(40), "deeper than 32"),
    ],
)
def test_hostile_json_raises_value_error(obj, expected):
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=expected):
            space_from_json(obj)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # never allocates what the file claims


def test_nesting_within_limit_is_accepted():
    assert isinstance(space_from_json(_nested_tuple(30)), gs.Tuple)
