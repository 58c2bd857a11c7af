"""The single-agent fast path gives exactly the batches, metrics and episodes of the
general step, in every configuration it accepts (and steps aside where it does not)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, EpisodeLog

import rlconnect as rc
from rlconnect.runner import recorder
from rlconnect.testing import recording


def _run(dense: bool, env, policy_fn, samples: int, block: int = 0, pack=False, **cfg):
    """Sample with dense polls buffered in blocks (of ``block`` polls, 0: the default) or
    every poll recorded on its own; ``pack``: as an env stepping while the runner records."""
    callbacks = EpisodeLog()
    handed = []  # the blocks handed to the collectors
    hand_over = recorder.RowBlock.hand_over
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recorder.RowBlock, "hand_over", lambda b, *a: handed.append(hand_over(b, *a)))
        if block:
            patch.setattr(recorder, "BLOCK_POLLS", block)
        with recording(blocks=dense, steps_while_recording=pack):
            config = rc.RunnerConfig(**cfg)
            runner = rc.EnvRunner(env, policy_fn(), config=config, callbacks=callbacks)
        batches = [runner.sample() for _ in range(samples)]
    assert bool(handed) == dense  # the fast path really ran (or not)
    out = (batches, runner.get_metrics(), callbacks.events, runner.perf_stats())
    runner.stop()
    return out


def _assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x.keys()) == list(y.keys())
        for k in x:
            if k == "infos":
                assert [dict(i) for i in x[k]] == [dict(i) for i in y[k]]
            else:
                np.testing.assert_array_equal(x[k], y[k], err_msg=k)
                assert np.asarray(x[k]).dtype == np.asarray(y[k]).dtype, k
        assert x.meta.get("connector_state") == y.meta.get("connector_state")


def _cartpole_mlp():
    env = gym.make("CartPole-v1")
    return rc.MLPPolicy(env.observation_space, env.action_space, seed=3)


def _counter_random():
    env = CounterEnv()
    return rc.RandomPolicy(env.observation_space, env.action_space, seed=1)


def _stacked_random():
    obs = gym.spaces.Box(-1e6, 1e6, (2, 3), np.float32)
    return rc.RandomPolicy(obs, CounterEnv().action_space, seed=1)


CASES = {
    "cartpole-n1": ("CartPole-v1", _cartpole_mlp, {"num_envs": 1, "rollout_fragment_length": 300}),
    "cartpole-n5-filter": (
        "CartPole-v1",
        _cartpole_mlp,
        {
            "num_envs": 5,
            "rollout_fragment_length": 70,
            "observation_filter": "MeanStdFilter",
            "clip_rewards": 0.5,
            "keep_raw_obs": True,
            "record_env_actions": True,
        },
    ),
    "cartpole-agent-steps-greedy": (
        "CartPole-v1",
        _cartpole_mlp,
        {
            "num_envs": 4,
            "rollout_fragment_length": 40,
            "count_steps_by": "agent_steps",
            "explore": False,
        },
    ),
    "cartpole-complete": (
        "CartPole-v1",
        _cartpole_mlp,
        {"num_envs": 3, "rollout_fragment_length": 50, "batch_mode": "complete_episodes"},
    ),
    "counter-horizon": (
        lambda ctx: CounterEnv(length=7),
        _counter_random,
        {"num_envs": 4, "rollout_fragment_length": 9, "horizon": 4},
    ),
    "counter-truncating-framestack": (
        lambda ctx: CounterEnv(length=3, truncate=True),
        _stacked_random,
        {"num_envs": 2, "rollout_fragment_length": 5, "framestack": 2},
    ),
}


@pytest.mark.parametrize("pack", [False, True], ids=["", "packed"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_path_equals_general_step(case, pack, monkeypatch):
    from rlconnect.runner.recorder import PackedColumns

    taken = []  # the columns handed over as packed arrays
    take = PackedColumns.take

    def counted(self, name, rows):
        column = take(self, name, rows)
        if column is not None:
            taken.append(name)
        return column

    monkeypatch.setattr(PackedColumns, "take", counted)
    env, policy_fn, cfg = CASES[case]
    fast = _run(True, env, policy_fn, 4, seed=11, pack=pack, **cfg)
    assert ("obs" in taken and "actions" in taken and "env" in taken) == pack
    slow = _run(False, env, policy_fn, 4, seed=11, **cfg)
    _assert_same_batches(fast[0], slow[0])
    assert fast[1] == slow[1]  # episode metrics
    assert fast[2] == slow[2]  # callbacks, in order
    assert set(fast[3]) == set(slow[3])  # the same perf stats are reported


@pytest.mark.parametrize("pack", [False, True], ids=["", "packed"])
def test_fast_path_steps_aside_for_a_failing_sub_env(pack):
    """A sub-env that raises takes the general step (restart, drop), then the fast path
    resumes; the batches are those of the general step throughout."""

    def env(ctx):
        return CounterEnv(length=6, fail_at=17 if ctx.vector_index == 1 else None)

    cfg = {"num_envs": 3, "rollout_fragment_length": 8, "restart_failed_sub_environments": True}
    fast = _run(True, env, _counter_random, 5, seed=2, pack=pack, **cfg)
    slow = _run(False, env, _counter_random, 5, seed=2, **cfg)
    _assert_same_batches(fast[0], slow[0])
    assert fast[1] == slow[1]
    assert any(m["episode_faulty"] for m in fast[1])
    assert all(len(b) == 24 for b in fast[0])


class _ResetFails(CounterEnv):
    """Raises in its third reset (while other sub-envs step in the same poll)."""

    resets = 0

    def reset(self, *, seed=None, options=None):
        type(self).resets += 1
        if type(self).resets == 3:
            raise RuntimeError("reset failed")
        return super().reset(seed=seed, options=options)


def test_fast_path_steps_aside_for_a_failing_reset():
    def env(ctx):
        return _ResetFails(length=4) if ctx.vector_index == 0 else CounterEnv(length=3)

    cfg = {"num_envs": 3, "rollout_fragment_length": 6, "restart_failed_sub_environments": True}
    runs = []
    for dense in (True, False):
        _ResetFails.resets = 0
        runs.append(_run(dense, env, _counter_random, 4, seed=5, **cfg))
    _assert_same_batches(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    assert _ResetFails.resets >= 3
    assert any(m["episode_faulty"] for m in runs[0][1])


def test_long_runs_keep_few_chunks_and_stay_exact(monkeypatch):
    """Steps are merged into chunks as they come (memory per row, not per step), on both
    paths, without changing a single value."""
    from rlconnect.collectors import store

    monkeypatch.setattr(store, "MERGE_EVERY", 4)
    cfg = {"num_envs": 3, "rollout_fragment_length": 50, "observation_filter": "MeanStdFilter"}
    fast = _run(True, "CartPole-v1", _cartpole_mlp, 2, block=8, seed=4, **cfg)
    packed = _run(True, "CartPole-v1", _cartpole_mlp, 2, block=8, pack=True, seed=4, **cfg)
    slow = _run(False, "CartPole-v1", _cartpole_mlp, 2, seed=4, **cfg)
    monkeypatch.undo()
    ref = _run(False, "CartPole-v1", _cartpole_mlp, 2, seed=4, **cfg)
    _assert_same_batches(fast[0], ref[0])
    _assert_same_batches(packed[0], ref[0])
    _assert_same_batches(slow[0], ref[0])


def test_chunks_are_merged_while_appending(monkeypatch):
    from rlconnect.collectors import store

    monkeypatch.setattr(store, "MERGE_EVERY", 4)
    s = store.ColumnStore()
    for i in range(30):
        s.append({"x": np.array([i, i]), "k": i, "info": [{}, {"i": i}]}, 2)
        s.write_last("y", np.array([2.0 * i]), np.array([False, True]))
    assert len(s._chunks) <= 4 + 1 + 30 // 4
    np.testing.assert_array_equal(s.column("x"), np.repeat(np.arange(30), 2))
    np.testing.assert_array_equal(s.column("k"), np.repeat(np.arange(30), 2))
    np.testing.assert_array_equal(s.column("y")[1::2], 2.0 * np.arange(30))
    assert not s.column("y")[::2].any()
    assert [d.get("i") for d in s.column("info")[1::2]] == list(range(30))


def test_block_merges_scalars_that_change_between_polls():
    from rlconnect.runner.recorder import _merge

    assert _merge([3, 3, 3], [2, 2, 2]) == 3
    np.testing.assert_array_equal(_merge([1, 2], [3, 3]), [1, 1, 1, 2, 2, 2])
    np.testing.assert_array_equal(_merge([1, 2], [1, 2]), [1, 2, 2])
    two = [np.array([1, 2]), np.array([3, 4])]
    np.testing.assert_array_equal(_merge(two, [2, 2]), [1, 2, 3, 4])
    nest = _merge([{"a": np.zeros(2)}, {"a": np.ones(2)}], [2, 2])
    np.testing.assert_array_equal(nest["a"], [0, 0, 1, 1])


def test_packed_columns_give_up_what_is_not_one_array_per_poll():
    from rlconnect.runner.recorder import PackedColumns

    p = PackedColumns(capacity=2)  # too small: it grows, keeping what it holds
    for k in range(5):
        cols = {"x": np.full((2, 3), k, np.float32), "k": k, "infos": [{}, {}]}
        cols["late"] = np.zeros(2) if k >= 1 else None  # absent from the first poll
        cols["dtype"] = np.zeros(2, np.int32 if k < 3 else np.int64)
        if k != 2:  # missing from one poll
            cols["gap"] = np.ones(2)
        if k != 3:  # missing from the poll where "dtype" is given up
            cols["gap2"] = np.ones(2)
        p.add(2, {c: v for c, v in cols.items() if v is not None}, {"t": np.array([k, k])})
    np.testing.assert_array_equal(p.take("x", 10), np.repeat(np.arange(5), 2)[:, None] * [1, 1, 1])
    np.testing.assert_array_equal(p.take("t", 10), np.repeat(np.arange(5), 2))
    for name in ("k", "infos", "late", "dtype", "gap", "gap2", "unknown"):
        assert p.take(name, 10) is None, name
    assert p.take("x", 8) is None  # not every row: the caller merges
    p.pad_to(12)  # a poll whose rows read as zeros
    p.pad_to(11)  # (no rows to add)
    np.testing.assert_array_equal(p.take("t", 12)[-4:], [4, 4, 0, 0])


class _CreatedLog(EpisodeLog):
    """EpisodeLog that also logs ``on_episode_created``: the runner then makes a new
    episode's object before it acts on the poll, not after."""

    def on_episode_created(self, *, episode, env_index, **kwargs) -> None:
        self.events.append(("created", env_index, episode.episode_id))


def test_episodes_made_after_the_actions_equal_those_made_before():
    """One policy, one agent: new episodes' objects (and the mapping function's call) come
    after the poll's actions; batches, metrics, callbacks, mapping calls and the episodes
    postprocessing sees are those of the order with ``on_episode_created``."""
    seen: dict[str, list] = {"late": [], "early": []}

    class Post(rc.RandomPolicy):
        def postprocess_trajectory(self, batch, other_agent_batches=None, episode=None):
            seen[self.mode].append((episode.episode_id, int(batch["eps_id"][0]), len(batch)))
            return batch

    def run(mode: str, callbacks: EpisodeLog):
        calls: list[int] = []

        def mapping(agent_id, episode, **kwargs):
            calls.append(episode.episode_id)
            return "default_policy"

        policy = Post(CounterEnv().observation_space, CounterEnv().action_space, seed=1)
        policy.mode = mode
        config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=6, seed=5)
        runner = rc.EnvRunner(lambda ctx: CounterEnv(length=4), policy, mapping, config, callbacks)
        out = [runner.sample() for _ in range(3)], runner.get_metrics(), calls
        runner.stop()
        return out

    late_log, log = EpisodeLog(), _CreatedLog()
    late, early = run("late", late_log), run("early", log)
    _assert_same_batches(late[0], early[0])
    assert late[1] == early[1] and late[1]
    assert late[2] == early[2] and len(late[2]) == len({*late[2]})  # once per episode
    assert [e for e in log.events if e[0] != "created"] == late_log.events
    created = [e[2] for e in log.events if e[0] == "created"]
    assert created == [e[2] for e in log.events if e[0] == "start"]
    assert (
        seen["late"] == seen["early"] and seen["late"] and all(a == b for a, b, _ in seen["late"])
    )
