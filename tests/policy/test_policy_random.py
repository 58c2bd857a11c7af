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


@pytest.mark.parametrize("name", ["discrete", "box", "dict", "tuple"])
def test_random_state_snapshot_replays_the_same_actions(name: str) -> None:
    """``get_random_state`` / ``set_random_state`` (what ``evaluate()`` uses): after a
    restore the policy draws exactly what it would have drawn without the calls between."""
    p = RandomPolicy(OBS, SPACES[name], seed=5)
    p.compute_actions({"obs": np.zeros((3, 2), np.float32)})
    state = p.get_random_state()
    sizes = [64, 1, 0, 700]
    expected = [p.compute_actions({"obs": np.zeros((k, 2), np.float32)})[0] for k in sizes]
    p.set_random_state(state)
    for k, want in zip(sizes, expected, strict=True):
        got = p.compute_actions({"obs": np.zeros((k, 2), np.float32)})[0]
        for a, b in zip(tree.flatten(got), tree.flatten(want), strict=True):
            np.testing.assert_array_equal(a, b)
