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


# -- freeze_between_syncs: normalise with the statistics of the last sync point -----------------


def _frozen(**kw):
    return MeanStdFilter(_ctx(), freeze_between_syncs=True, **kw)


def _normalised(stats, x, clip=10.0, eps=1e-8):
    """What one filter holding ``stats`` outputs for ``x`` (numpy, by hand)."""
    n = float(stats["count"])
    mean = stats["mean"] if n else np.zeros(3)
    std = np.sqrt(stats["m2"] / n) if n else np.ones(3)
    return np.clip((np.asarray(x, np.float64) - mean) / (std + eps), -clip, clip)


def _stats_of(x):
    x = np.asarray(x, np.float64)
    return {"count": len(x), "mean": x.mean(0), "m2": x.var(0) * len(x)}


def test_frozen_normalises_with_the_last_sync_point_and_still_accumulates():
    obs = _obs(300, seed=11)
    f = _frozen()
    out = f(_data(obs[:100]))["obs"]
    np.testing.assert_allclose(out, np.clip(obs[:100], -10, 10), rtol=1e-6)  # no sync yet
    assert float(f.get_statistics()["count"]) == 100  # the totals and the delta grow
    assert float(f.get_delta()["count"]) == 100
    assert float(f.get_statistics()["frozen"]["count"]) == 0
    f.refreeze()  # a lone filter's sync point: it takes in the data it kept
    second = f(_data(obs[100:200]))["obs"]
    np.testing.assert_allclose(second, _normalised(_stats_of(obs[:100]), obs[100:200]), atol=1e-6)
    # negative control: a filter without freezing uses the batch's own data at once
    g = MeanStdFilter(_ctx())
    g(_data(obs[:100]))
    assert not np.allclose(g(_data(obs[100:200]))["obs"], second, atol=1e-3)
    assert float(f.get_delta()["count"]) == 200  # refreeze leaves the delta alone


def test_frozen_sync_points_set_statistics_and_reset_delta():
    obs = _obs(300, seed=12)
    f = _frozen()
    f(_data(obs[:100]))
    f.reset_delta()  # handed over for merging: it comes back through the sync only
    f.refreeze()
    assert float(f.get_statistics()["frozen"]["count"]) == 0
    merged = _stats_of(obs[:250])  # what a driver merged from every runner
    f.set_statistics(merged)
    st = f.get_statistics()
    for key in ("count", "mean", "m2"):
        np.testing.assert_allclose(st["frozen"][key], merged[key])
        np.testing.assert_allclose(st[key], merged[key])
    assert float(f.get_delta()["count"]) == 0
    f.refreeze()  # nothing kept since the sync: no change
    np.testing.assert_array_equal(f.get_statistics()["frozen"]["mean"], st["frozen"]["mean"])
    x = obs[250:]
    np.testing.assert_allclose(f(_data(x))["obs"], _normalised(merged, x), atol=1e-6)


def test_frozen_eval_mode_neither_updates_nor_refreezes():
    obs = _obs(200, seed=13)
    f = _frozen()
    f(_data(obs[:100]))
    before = f.get_statistics()
    f.in_eval()
    f(_data(obs[100:]))
    f.refreeze()
    after = f.get_statistics()
    assert float(after["count"]) == 100
    assert float(after["frozen"]["count"]) == 0
    np.testing.assert_array_equal(before["mean"], after["mean"])
    f.in_training()
    f.refreeze()
    assert float(f.get_statistics()["frozen"]["count"]) == 100


@pytest.mark.parametrize("freeze", [True, False])
def test_outputs_depend_on_how_the_data_was_split_only_without_freezing(freeze):
    """The group protocol with 1, 2 and 3 filters on the same stream of chunks: frozen
    filters output what one reference filter, updated only at the sync points, would."""
    chunks = np.split(_obs(1200, seed=14), 12)
    rng = np.random.default_rng(0)
    sync_after = {3, 4, 8}  # sync points, as chunk indices
    outputs = {}
    for n in (1, 2, 3):
        filters = [MeanStdFilter(_ctx(), freeze_between_syncs=freeze) for _ in range(n)]
        total = merge_statistics([filters[0].get_statistics()])
        got = []
        for i, chunk in enumerate(chunks):
            f = filters[rng.integers(n)]  # any runner may get any chunk
            got.append(f(_data(chunk))["obs"])
            if i in sync_after:
                deltas = [g.get_delta() for g in filters]
                for g in filters:
                    g.reset_delta()
                total = merge_statistics([total, *deltas])
                for g in filters:
                    g.set_statistics(total)
        outputs[n] = np.concatenate(got)
    # the reference: statistics of every chunk before the last sync point
    last_sync = [max((s for s in sync_after if s < i), default=-1) for i in range(12)]
    want = np.concatenate(
        [
            _normalised(_stats_of(np.concatenate(chunks[: s + 1])), c)
            if s >= 0
            else np.clip(c, -10, 10)
            for c, s in zip(chunks, last_sync)
        ]
    )
    for n in (1, 2, 3):
        matches = np.allclose(outputs[n], want, rtol=1e-6, atol=1e-6)
        assert matches == freeze, n


def test_frozen_statistics_survive_saving_and_old_states_still_load(tmp_path):
    from rlconnect.checkpoints import load_pipeline, save_pipeline

    obs = _obs(150, seed=15)
    pipe = AgentConnectorPipeline(_ctx(), [_frozen(clip=5.0)])
    pipe(_data(obs[:50]))
    pipe["MeanStdFilter"].refreeze()
    pipe(_data(obs[50:100]))  # totals 100 rows, frozen 50: a checkpoint between syncs
    save_pipeline(pipe, tmp_path / "p")
    again = load_pipeline(tmp_path / "p", _ctx())
    f, g = pipe["MeanStdFilter"], again["MeanStdFilter"]
    assert g.freeze_between_syncs and g.clip == 5.0
    for key in ("count", "mean", "m2"):
        np.testing.assert_array_equal(g.get_statistics()[key], f.get_statistics()[key])
        np.testing.assert_array_equal(
            g.get_statistics()["frozen"][key], f.get_statistics()["frozen"][key]
        )
    x = obs[100:]
    np.testing.assert_array_equal(f.transform(x), g.transform(x))
    f.refreeze()  # the loaded filter still owes the same refreeze
    g.refreeze()
    np.testing.assert_array_equal(f.transform(x), g.transform(x))
    assert float(g.get_statistics()["frozen"]["count"]) == 100
    # a state saved before this mode existed: no "frozen" key, no param -> it normalises
    # with the totals as before; loaded into a freezing filter, the totals are the sync point
    name, params = MeanStdFilter(_ctx()).to_state()
    assert "freeze_between_syncs" not in params and name == "MeanStdFilter"
    old = MeanStdFilter(_ctx())
    old(_data(obs[:60]))
    state = old.get_statistics()
    assert "frozen" not in state
    h = _frozen()
    h.set_statistics(state)
    np.testing.assert_array_equal(h.get_statistics()["frozen"]["mean"], state["mean"])
    np.testing.assert_array_equal(h.transform(x), old.transform(x))
    old.set_statistics(f.get_statistics())  # a filter without freezing ignores "frozen"
    np.testing.assert_array_equal(old.mean, f.mean)


def test_frozen_mode_from_config_and_bad_values():
    import rlconnect as rc

    config = {"observation_filter": "MeanStdFilter", "observation_filter_sync": "frozen"}
    pipe = rc.default_agent_pipeline(ConnectorContext(SPACE, gym.spaces.Discrete(2), config))
    assert pipe["MeanStdFilter"].freeze_between_syncs
    plain = rc.default_agent_pipeline(
        ConnectorContext(SPACE, gym.spaces.Discrete(2), {"observation_filter": "MeanStdFilter"})
    )
    assert not plain["MeanStdFilter"].freeze_between_syncs
    cfg = rc.RunnerConfig(observation_filter="MeanStdFilter", observation_filter_sync="frozen")
    assert cfg.connector_config()["observation_filter_sync"] == "frozen"
    assert rc.RunnerConfig().observation_filter_sync == "immediate"
    with pytest.raises(ValueError, match="observation_filter_sync"):
        rc.RunnerConfig(observation_filter_sync="lazy")
    with pytest.raises(ValueError, match="observation_filter_sync"):
        rc.default_agent_pipeline(
            ConnectorContext(SPACE, gym.spaces.Discrete(2), {"observation_filter_sync": 1})
        )
    with pytest.raises(ValueError, match="freeze_between_syncs"):
        MeanStdFilter(_ctx(), freeze_between_syncs="yes")
    with pytest.raises(ValueError, match="frozen"):
        _frozen().set_statistics({**_stats_of(_obs(5)), "frozen": 3})
