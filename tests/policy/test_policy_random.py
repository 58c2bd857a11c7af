"""RandomPolicy: batched samples lie in the space; seeding; no weights."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import tree

from rlconnect.policy import RandomPolicy

OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
INF = np.inf
SPACES = {
    "discrete": gym.spaces.Discrete(5, start=-3),
    "multidiscrete": gym.spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, 1], [-2, 3]]),
    "multibinary": gym.spaces.MultiBinary([2, 3]),
    "box": gym.spaces.Box(-2.0, 3.0, (3, 2), np.float32),
    "box_unbounded": gym.spaces.Box(-INF, INF, (4,), np.float32),
    "box_mixed": gym.spaces.Box(
        np.array([-INF, 0.0, -INF, -1.0]), np.array([INF, INF, 1.0, 1.0]), dtype=np.float64
    ),
    "box_int": gym.spaces.Box(0, 4, (3,), np.int64),
    "box_int_mixed": gym.spaces.Box(np.array([0, -INF]), np.array([3, INF]), dtype=np.int32),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(0, 1, (2,))]),
    "dict": gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.MultiBinary(3)}),
}


def _rows(actions, n: int) -> list:
    return [tree.map_structure(lambda x, i=i: x[i], actions) for i in range(n)]


@pytest.mark.parametrize("name", sorted(SPACES))
def test_samples_lie_in_space(name: str) -> None:
    space = SPACES[name]
    p = RandomPolicy(OBS, space, seed=0)
    actions, states, extra = p.compute_actions({"obs": np.zeros((50, 2), np.float32)})
    assert states == []
    assert extra == {}
    for leaf in tree.flatten(actions):
        assert leaf.shape[0] == 50
    for row in _rows(actions, 50):
        assert space.contains(row), (name, row)


def test_discrete_covers_the_range() -> None:
    p = RandomPolicy(OBS, SPACES["discrete"], seed=0)
    actions = p.compute_actions({"obs": np.zeros((500, 2))})[0]
    assert set(actions.tolist()) == {-3, -2, -1, 0, 1}


def test_unbounded_box_is_standard_normal() -> None:
    p = RandomPolicy(OBS, SPACES["box_unbounded"], seed=0)
    actions = p.compute_actions({"obs": np.zeros((20_000, 2))})[0]
    assert abs(actions.mean()) < 0.03
    assert abs(actions.std() - 1.0) < 0.03


def test_seeding_is_deterministic_and_private() -> None:
    def run(seed: int):
        p = RandomPolicy(OBS, SPACES["box"], seed=seed)
        np.random.seed(1234 + seed)  # noqa: NPY002  (global state must not matter)
        return p.compute_actions({"obs": np.zeros((10, 2))})[0]

    np.testing.assert_array_equal(run(0), run(0))
    assert not np.array_equal(run(0), run(1))


def test_fallback_space_and_nested_obs() -> None:
    space = gym.spaces.Text(5)
    p = RandomPolicy(gym.spaces.Dict({"x": OBS}), space, seed=0)
    actions = p.compute_actions({"obs": {"x": np.zeros((4, 2))}})[0]
    assert actions.shape == (4,)
    assert all(space.contains(a) for a in actions)


def test_no_weights() -> None:
    p = RandomPolicy(OBS, SPACES["discrete"])
    assert p.get_weights() == {}
    p.set_weights({})
    with pytest.raises(ValueError, match=r"unexpected entries \['w'\]"):
        p.set_weights({"w": np.zeros(2)})
    assert not p.is_recurrent()
    batch = {"obs": np.zeros((3, 2))}
    assert p.postprocess_trajectory(batch) is batch


def test_bad_seed_and_missing_obs() -> None:
    with pytest.raises(ValueError, match="seed"):
        RandomPolicy(OBS, SPACES["discrete"], seed=-1)
    with pytest.raises(TypeError, match="seed"):
        RandomPolicy(OBS, SPACES["discrete"], seed=1.5)  # type: ignore[arg-type]
    p = RandomPolicy(OBS, SPACES["discrete"])
    with pytest.raises(KeyError, match="'obs' column"):
        p.compute_actions({"observations": np.zeros((2, 2))})


@pytest.mark.parametrize("name", ["discrete", "box", "dict", "tuple", "multibinary"])
def test_actions_drawn_ahead_are_handed_out_in_order(name: str) -> None:
    """Array spaces are drawn a block of rows at a time: calls of any size (one larger than
    a block too) get fresh rows in the space, the same for the same seed and calls, rows
    handed out never change afterwards, and re-seeding starts over."""
    space = SPACES[name]
    sizes = [61, 64, 1, 0, 5000, 64, 3]  # 5000 rows: more than a block

    def run(p):
        return [p.compute_actions({"obs": np.zeros((k, 2), np.float32)})[0] for k in sizes]

    p = RandomPolicy(OBS, space, seed=3)
    first = run(p)
    kept = tree.map_structure(np.copy, first)
    later = run(p)  # more draws must not write into what was handed out
    for got, want in zip(tree.flatten(first), tree.flatten(kept), strict=True):
        np.testing.assert_array_equal(got, want)
    for out, k in zip(first + later, sizes + sizes, strict=True):
        for leaf in tree.flatten(out):
            assert leaf.shape[0] == k
        assert all(space.contains(row) for row in _rows(out, k))
    again = run(RandomPolicy(OBS, space, seed=3))
    for got, want in zip(tree.flatten(again), tree.flatten(kept), strict=True):
        np.testing.assert_array_equal(got, want)
    p.seed(3)  # starts over
    for got, want in zip(tree.flatten(run(p)), tree.flatten(kept), strict=True):
        np.testing.assert_array_equal(got, want)
    # consecutive calls get different rows, not the same ones again
    a, b = first[0], first[1]
    assert not all(np.array_equal(x[:61], y[:61]) for x, y in zip(tree.flatten(a), tree.flatten(b)))


def test_random_state_snapshot_restores_the_rows_drawn_ahead() -> None:
    """``get_random_state`` / ``set_random_state`` (what ``evaluate()`` uses): after a
    restore the policy draws exactly what it would have drawn without the calls between."""
    p = RandomPolicy(OBS, SPACES["discrete"], seed=5)
    obs = {"obs": np.zeros((64, 2), np.float32)}
    p.compute_actions(obs)
    state = p.get_random_state()
    expected = [p.compute_actions(obs)[0].copy() for _ in range(70)]  # past a block
    p.set_random_state(state)
    for want in expected:
        np.testing.assert_array_equal(p.compute_actions(obs)[0], want)
