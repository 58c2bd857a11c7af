"""MeanStdFilter: running statistics against numpy, eval freeze, NaN errors, merging, saving."""

import gymnasium as gym
import numpy as np
import pytest

from rlconnect.connectors import (
    AgentConnectorPipeline,
    AgentData,
    ConnectorContext,
    MeanStdFilter,
    get_connector,
    merge_statistics,
)

SPACE = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


def _ctx():
    return ConnectorContext(SPACE, gym.spaces.Discrete(2))


def _data(obs, env0=0):
    n = len(obs)
    return AgentData(np.arange(env0, env0 + n), ["a"] * n, {"obs": np.asarray(obs)})


def _feed(conn, obs, chunks):
    for part in np.split(obs, chunks):
        conn(_data(part))


def _obs(n=1200, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 3)) * [1.0, 5.0, 0.01] + [3.0, -2.0, 1e3]).astype(np.float32)


def _var(stats):
    return stats["m2"] / stats["count"]


def test_matches_numpy_over_uneven_chunks():
    obs = _obs()
    f = MeanStdFilter(_ctx())
    _feed(f, obs, [1, 7, 300, 301, 999])
    s = f.get_statistics()
    assert s["count"].shape == ()
    assert float(s["count"]) == 1200
    ref = obs.astype(np.float64)
    np.testing.assert_allclose(s["mean"], ref.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_var(s), ref.var(0), rtol=1e-6, atol=1e-9)


def test_normalises_after_the_update_and_clips():
    f = MeanStdFilter(_ctx(), clip=1.0)
    obs = np.array([[0.0, 1, 2], [2, 1, 0], [4, 1, -2]], np.float32)
    got = f(_data(obs))["obs"]
    # statistics include this batch: mean [2, 1, 0], std [sqrt(8/3), 0, sqrt(8/3)]
    s = np.sqrt(8 / 3)
    expected = np.array([[-2 / s, 0, 2 / s], [0, 0, 0], [2 / s, 0, -2 / s]])
    np.testing.assert_allclose(got, np.clip(expected, -1.0, 1.0), rtol=1e-6)
    assert got.dtype == np.float32
    assert np.abs(got).max() == 1.0  # the clip bites: 2 / s = 1.22
    assert np.abs(expected).max() > 1.2


def test_first_batch_of_one_row_is_zero():
    f = MeanStdFilter(_ctx())
    got = f(_data([[1.0, 2.0, 3.0]]))["obs"]
    np.testing.assert_array_equal(got, np.zeros((1, 3), np.float32))


def test_eval_mode_freezes_statistics():
    f = MeanStdFilter(_ctx())
    f(_data(_obs(100)))
    before = f.get_statistics()
    f.in_eval()
    x = np.full((2, 3), 1e6, np.float32)
    frozen = f(_data(x))["obs"]
    after = f.get_statistics()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    f.in_training()
    f(_data(x))
    assert float(f.get_statistics()["count"]) == 102  # negative control: training updates
    assert frozen.shape == (2, 3)


def test_update_false_never_updates():
    f = MeanStdFilter(_ctx(), update=False)
    f(_data(_obs(10)))
    assert float(f.get_statistics()["count"]) == 0
    # no statistics: mean 0, std 1 -> identity up to clip
    got = f(_data([[0.5, -3.0, 20.0]]))["obs"]
    np.testing.assert_allclose(got, [[0.5, -3.0, 10.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_raises_and_leaves_stats(bad):
    f = MeanStdFilter(_ctx())
    f(_data(_obs(20)))
    before = f.get_statistics()
    obs = np.zeros((4, 3), np.float32)
    obs[1, 2] = bad
    obs[3, 0] = bad
    data = AgentData([5, 6, 7, 8], ["a", "b", "c", "d"], {"obs": obs})
    with pytest.raises(ValueError, match="MeanStdFilter") as err:
        f(data)
    msg = str(err.value)
    assert "(env_id=6, agent_id='b')" in msg
    assert "(env_id=8, agent_id='d')" in msg
    assert "[2]" in msg
    assert "[0]" in msg
    assert str(bad) in msg
    assert "env_id=5" not in msg
    after = f.get_statistics()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])
    np.testing.assert_array_equal(f.get_delta()["count"], 20)


def test_merge_equals_one_filter_fed_everything():
    obs = _obs(1500, seed=3)
    a, b, whole = MeanStdFilter(_ctx()), MeanStdFilter(_ctx()), MeanStdFilter(_ctx())
    _feed(a, obs[:400], [13, 200])
    _feed(b, obs[400:], [555])
    _feed(whole, obs, [3, 900])
    merged = merge_statistics([a.get_statistics(), b.get_statistics()])
    ref = whole.get_statistics()
    assert float(merged["count"]) == 1500
    np.testing.assert_allclose(merged["mean"], ref["mean"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(merged["m2"], ref["m2"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(merged["mean"], obs.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(_var(merged), obs.astype(np.float64).var(0), rtol=1e-6)


def test_merge_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one"):
        merge_statistics([])
    f = MeanStdFilter(_ctx())
    other = {"count": np.float64(1), "mean": np.zeros(2), "m2": np.zeros(2)}
    with pytest.raises(ValueError, match="shapes differ"):
        merge_statistics([f.get_statistics(), other])
    with pytest.raises(ValueError, match="lack"):
        merge_statistics([{"count": 1}])


def test_delta_sync_between_runners():
    obs = _obs(1000, seed=7)
    runners = [MeanStdFilter(_ctx()), MeanStdFilter(_ctx())]
    total = merge_statistics([runners[0].get_statistics()])  # empty
    for step in range(2):
        for i, r in enumerate(runners):
            lo = step * 500 + i * 250
            _feed(r, obs[lo : lo + 250], [100])
        deltas = [r.get_delta() for r in runners]
        for r in runners:
            r.reset_delta()
            assert float(r.get_delta()["count"]) == 0
        total = merge_statistics([total, *deltas])
        for r in runners:
            r.set_statistics(total)
    assert float(total["count"]) == 1000
    np.testing.assert_allclose(total["mean"], obs.astype(np.float64).mean(0), rtol=1e-6)
    np.testing.assert_allclose(_var(total), obs.astype(np.float64).var(0), rtol=1e-6)
    np.testing.assert_array_equal(runners[1].get_statistics()["m2"], total["m2"])


def test_statistics_survive_to_state_from_state():
    f = MeanStdFilter(_ctx(), clip=5.0)
    f(_data(_obs(50)))
    name, params = f.to_state()
    assert name == "MeanStdFilter"
    g = get_connector(name, _ctx(), params)
    assert g.clip == 5.0
    for k, v in f.get_statistics().items():
        np.testing.assert_array_equal(g.get_statistics()[k], v)
    x = _obs(4, seed=9)
    f.in_eval()
    g.in_eval()
    np.testing.assert_array_equal(f(_data(x))["obs"], g(_data(x))["obs"])


def test_pipeline_state_round_trip_keeps_statistics():
    pipe = AgentConnectorPipeline(_ctx(), [MeanStdFilter(_ctx())])
    pipe(_data(_obs(30)))
    again = AgentConnectorPipeline.from_state(_ctx(), pipe.to_state())
    np.testing.assert_array_equal(
        again["MeanStdFilter"].get_statistics()["mean"], pipe["MeanStdFilter"].mean
    )


def test_needs_float_box():
    for space in [gym.spaces.Discrete(3), gym.spaces.Box(0, 255, (2,), np.uint8)]:
        with pytest.raises(ValueError, match="MeanStdFilter needs a float Box"):
            MeanStdFilter(ConnectorContext(space, gym.spaces.Discrete(2))).bind(space)
    out = MeanStdFilter(_ctx(), clip=3.0).bind(SPACE)
    assert out == gym.spaces.Box(-3.0, 3.0, (3,), np.float32)


@pytest.mark.parametrize("kw", [{"clip": 0}, {"epsilon": -1.0}, {"update": "yes"}])
def test_rejects_bad_params(kw):
    with pytest.raises(ValueError, match="MeanStdFilter"):
        MeanStdFilter(_ctx(), **kw)
