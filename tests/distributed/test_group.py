"""RunnerGroup on a local Ray instance: parallel sampling, weights, filter sync, checkpoints."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from dist_envs import (
    CountingEnv,
    TwoAgentEnv,
    constant_action_pipeline,
    env_logs,
    first_of_each_sub_env,
    gae_pipeline,
    half_reward_pipeline,
    make_env,
    make_two_agent_env,
    map_agent,
    reference_filter,
    worker_index,
)

import rlconnect as rc
from rlconnect.distributed import RunnerGroup
from rlconnect.distributed.sync import apply_deltas, pop_connector_deltas
from rlconnect.distributed.worker import RunnerSpec
from rlconnect.runner.postprocess import state_digest

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

SPACE = CountingEnv()


def assert_batches_equal(a, b):
    assert len(a) == len(b)
    assert a == b, [k for k in a if not np.array_equal(a[k], b[k])]


#: fractional CPUs, so that the module's groups fit on the 2-CPU instance together
SMALL = {"num_cpus": 0.25}


def config(**kw):
    base = {"num_envs": 2, "rollout_fragment_length": 5, "seed": 100}
    return rc.RunnerConfig(**{**base, **kw})


FILTERED = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)  # what MeanStdFilter outputs


def random_policy(filtered=False):
    obs_space = FILTERED if filtered else SPACE.observation_space
    return rc.RandomPolicy(obs_space, SPACE.action_space)


@pytest.fixture(scope="module")
def filtered_group():
    """K=2 runners with a MeanStdFilter and an MLP policy, shared by several tests."""
    policy = rc.MLPPolicy(FILTERED, SPACE.action_space, hiddens=(8,))
    group = RunnerGroup(
        make_env,
        policy,
        config=config(observation_filter="MeanStdFilter"),
        num_runners=2,
        runner_resources=SMALL,
    )
    yield group
    group.stop()


def check_transitions(batch):
    obs, new, act = batch["obs"], batch["new_obs"], batch["actions"]
    np.testing.assert_array_equal(new[:, 0], obs[:, 0])  # same sub-env
    np.testing.assert_array_equal(new[:, 1], obs[:, 1])  # same episode
    np.testing.assert_array_equal(new[:, 2], obs[:, 2] + 1)  # one step later
    np.testing.assert_array_equal(new[:, 3], act)  # the action taken


def test_parallel_sample_is_exact_and_true_to_the_simulator():
    with RunnerGroup(
        make_env, random_policy(), config=config(), num_runners=2, runner_resources=SMALL
    ) as group:
        for _ in range(3):
            batch = group.sample()
            assert len(batch) == 2 * 2 * 5
            assert batch.meta["runner_rows"] == {1: 10, 2: 10}
            check_transitions(batch)
            # sub-env j of runner k is seeded seed + k * num_envs + j
            assert set(batch["obs"][:, 0]) == {102.0, 103.0, 104.0, 105.0}
        eps = batch["eps_id"]
        runner_of = eps >> 40
        assert list(runner_of[:10]) == [1] * 10 and list(runner_of[10:]) == [2] * 10
        assert group.foreach_runner(worker_index) == [1, 2]
        metrics = group.get_metrics()
        assert metrics and {m["runner_index"] for m in metrics} == {1, 2}
        assert all(m["episode_length"] == 6 for m in metrics)


def test_each_remote_runner_equals_a_local_runner_with_its_seed():
    """Runner k's data depends on (seed, k) only: not on K, not on scheduling."""
    cfg = config()
    spec = RunnerSpec(make_env, random_policy(), None, cfg, None)
    with RunnerGroup(
        make_env, random_policy(), config=cfg, num_runners=2, runner_resources=SMALL
    ) as group:
        batches = [group.sample() for _ in range(2)]
        async_batches = list(group.sample_async(num_batches=2))
    with RunnerGroup(
        make_env, random_policy(), config=cfg, num_runners=1, runner_resources=SMALL
    ) as single:
        alone = [single.sample() for _ in range(2)]
    for k in (1, 2):
        local = spec.build(k)
        for i, batch in enumerate(batches):
            expected = local.sample()
            rows = slice((k - 1) * 10, k * 10)
            assert_batches_equal(batch[rows], expected)
            if k == 1:
                assert_batches_equal(alone[i], expected)
        third = local.sample()
        got = [b for b in async_batches if b.meta["runner_index"] == k]
        assert len(got) == 1
        assert_batches_equal(got[0], third)


def test_weights_broadcast_with_one_put(filtered_group, monkeypatch):
    import ray

    weights = filtered_group.get_weights()
    new = {pid: {k: v + 0.5 for k, v in w.items()} for pid, w in weights.items()}
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda *a, **k: puts.append(1) or real_put(*a, **k))
    filtered_group.sync_weights(new)
    assert len(puts) == 1
    for remote in filtered_group.foreach_runner(lambda r: r.get_weights()):
        for name, value in new["default_policy"].items():
            np.testing.assert_array_equal(remote["default_policy"][name], value)


def test_sync_weights_sets_the_learners_version_on_every_runner(filtered_group):
    group = filtered_group
    versions = lambda r: r.policies["default_policy"].weights_seq  # noqa: E731
    group.sync_weights(group.get_weights(), weights_seq=40)
    assert [versions(group.local_runner), *group.foreach_runner(versions)] == [40, 40, 40]
    batch = group.sample()
    assert set(np.unique(batch["weights_seq"]).tolist()) <= {40} | set(range(40))
    group.local_runner.set_weights(group.get_weights())  # the local runner counts one...
    assert versions(group.local_runner) == 41
    group.sync_weights()  # ...and the remote runners take the local runner's versions
    assert [versions(group.local_runner), *group.foreach_runner(versions)] == [41, 41, 41]
    batch = group.sample()  # rows acted before the sync lag one version
    assert batch["weights_seq"].dtype == np.int64
    assert set(np.unique(batch["weights_seq"]).tolist()) <= {40, 41}
    lag = batch.meta["weights_lag"]
    assert lag["max"] == 41 - int(batch["weights_seq"].min())
    streamed = next(iter(group.sample_async(num_batches=1)))
    assert streamed.meta["weights_lag"]["max"] in (0, 1)


def reference_statistics(group):
    logs = np.concatenate([x for per in group.foreach_runner(env_logs) for x in per])
    return len(logs), logs.mean(axis=0), logs.var(axis=0) * len(logs)


def test_filter_sync_equals_one_filter_fed_all_data(filtered_group):
    group = filtered_group
    group.sample()
    group.sync_connector_states()
    group.sample()
    for _ in group.sample_async(num_batches=3):
        pass
    group.sync_connector_states()
    n, mean, m2 = reference_statistics(group)
    states = [
        group.get_connector_states(),
        *group.foreach_runner(lambda r: r.get_connector_states()),
    ]
    for st in states:
        f = st["default_policy"]["agent"]["MeanStdFilter"]
        assert float(f["count"]) == n
        np.testing.assert_allclose(f["mean"], mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(f["m2"], m2, rtol=1e-6, atol=1e-6)
    # repeated syncs without new data change nothing (no double counting)
    before = group.get_connector_states()
    group.sync_connector_states()
    group.sync_connector_states()
    after = group.foreach_runner(lambda r: r.get_connector_states())
    for st in [group.get_connector_states(), *after]:
        for key in ("count", "mean", "m2"):
            np.testing.assert_array_equal(
                st["default_policy"]["agent"]["MeanStdFilter"][key],
                before["default_policy"]["agent"]["MeanStdFilter"][key],
            )
    # negative control: summing every runner's totals (instead of deltas) double counts
    totals = [s["default_policy"]["agent"]["MeanStdFilter"]["count"] for s in after]
    assert float(sum(totals)) != n


def _reference_filter(group):
    """One filter fed every observation the runners' envs returned so far."""
    return reference_filter([x for per in group.foreach_runner(env_logs) for x in per])


def _run_sync_protocol(group, num_runners):
    """sample, sync, sample, sample_async, sync, sample. Returns, for every batch, how far
    its processed obs are from the reference's normalisation of its raw obs, where the
    reference is the one of the last sync before the sample() call in which the env
    returned the observation."""
    ref = _reference_filter(group)  # no data yet
    previous_call_ref = {}  # runner index -> the reference during its previous call
    ended_last = {}  # runner index -> sub-envs whose last row in the previous batch was done
    errors = []

    def check(batch):
        sizes = batch.meta.get("runner_rows") or {batch.meta["runner_index"]: len(batch)}
        start = 0
        for k, n in sizes.items():
            rows = batch[start : start + n]
            start += n
            first = first_of_each_sub_env(rows) & (k in previous_call_ref)
            # a sub-env whose episode ended on the previous batch's last step reset either
            # in that call or in this one (timing): either reference is right for that row
            either = first & np.isin(rows["env_id"], list(ended_last.get(k, ())))
            before = previous_call_ref.get(k, ref)
            old, new = before.transform(rows["raw_obs"]), ref.transform(rows["raw_obs"])
            err_old = np.abs(rows["obs"] - old).max(axis=1)
            err_new = np.abs(rows["obs"] - new).max(axis=1)
            err = np.where(either, np.minimum(err_old, err_new), np.where(first, err_old, err_new))
            errors.append(err.max())
            previous_call_ref[k] = ref
            done = rows["terminateds"] | rows["truncateds"]
            last = np.unique(rows["env_id"][::-1], return_index=True)[1]
            last_rows = len(rows) - 1 - last
            ended_last[k] = set(rows["env_id"][last_rows][done[last_rows]].tolist())

    check(group.sample())
    group.sync_connector_states()
    ref = _reference_filter(group)
    check(group.sample())
    for batch in group.sample_async(num_batches=3 * num_runners):  # any schedule
        check(batch)
    group.sync_connector_states()
    ref = _reference_filter(group)
    check(group.sample())
    return np.array(errors)


@pytest.mark.parametrize(
    ("num_runners", "sync_mode"),
    [(1, "frozen"), (2, "frozen"), (3, "frozen"), (1, "immediate")],
)
def test_frozen_filters_make_processed_data_independent_of_the_runners(num_runners, sync_mode):
    """With observation_filter_sync="frozen", processed rows are the raw rows normalised by
    one filter updated only at the sync points, for 1, 2 or 3 runners and any sample_async
    schedule; "immediate" (the default) is the negative control."""
    cfg = config(
        observation_filter="MeanStdFilter", observation_filter_sync=sync_mode, keep_raw_obs=True
    )
    with RunnerGroup(
        make_env, random_policy(True), config=cfg, num_runners=num_runners, runner_resources=SMALL
    ) as group:
        errors = _run_sync_protocol(group, num_runners)
        if sync_mode == "immediate":
            assert errors.max() > 0.1, errors  # the default mode does not have the property
            return
        assert errors.max() <= 1e-6, errors
        # the merge is exact and repeated syncs count nothing twice, in this mode too
        group.sync_connector_states()
        want = _reference_filter(group).get_statistics()
        for _ in range(2):
            states = [group.get_connector_states(), *group.foreach_runner(_filter_states)]
            for st in states:
                f = st["default_policy"]["agent"]["MeanStdFilter"]
                for got in (f, f["frozen"]):
                    assert float(got["count"]) == float(want["count"])
                    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-6, atol=1e-6)
                    np.testing.assert_allclose(got["m2"], want["m2"], rtol=1e-6, atol=1e-6)
            group.sync_connector_states()


def _filter_states(runner):
    return runner.get_connector_states()


def test_filtered_data_is_a_deterministic_function_of_the_seed():
    """The group equals a serial replay of the sync protocol: timing plays no part."""
    cfg = config(observation_filter="MeanStdFilter")

    # the serial replay: one runner per index, each with its own policy (as actors have)
    def spec():
        return RunnerSpec(make_env, random_policy(True), None, cfg, None)

    driver, runners = spec().build(0), {k: spec().build(k) for k in (1, 2)}
    with RunnerGroup(
        make_env, random_policy(True), config=cfg, num_runners=2, runner_resources=SMALL
    ) as group:
        for _ in range(3):
            batch = group.sample()
            group.sync_connector_states()
            deltas = []
            for k, r in runners.items():
                assert_batches_equal(batch[(k - 1) * 10 : k * 10], r.sample())
                deltas.append(pop_connector_deltas(r))
            merged = apply_deltas(driver, deltas)
            for r in runners.values():
                r.set_connector_states(merged)
            assert state_digest(driver.agent_pipeline()) == state_digest(
                group.local_runner.agent_pipeline()
            )


def test_checkpoint_round_trip_of_a_group(filtered_group, tmp_path):
    group = filtered_group
    group.sample()
    group.save_checkpoint(tmp_path / "ck")  # syncs first
    saved_w, saved_s = group.get_weights(), group.get_connector_states()

    def same(states_a, states_b):
        a = states_a["default_policy"]["agent"]["MeanStdFilter"]
        b = states_b["default_policy"]["agent"]["MeanStdFilter"]
        return all(np.array_equal(a[key], b[key]) for key in ("count", "mean", "m2"))

    with RunnerGroup.from_checkpoint(
        tmp_path / "ck", env=make_env, num_runners=2, runner_resources=SMALL
    ) as restored:
        assert restored.config.seed == 100
        for w in [restored.get_weights(), *restored.foreach_runner(lambda r: r.get_weights())]:
            for name, value in saved_w["default_policy"].items():
                np.testing.assert_array_equal(w["default_policy"][name], value)
        remote_states = restored.foreach_runner(lambda r: r.get_connector_states())
        assert all(same(s, saved_s) for s in [restored.get_connector_states(), *remote_states])
        assert len(restored.sample()) == 20
    # restore() into a running group: weights and statistics reach every runner
    group.sample()
    group.sync_connector_states()
    group.sync_weights({"default_policy": {k: v * 0 for k, v in saved_w["default_policy"].items()}})
    group.restore(tmp_path / "ck")
    for s in [
        group.get_connector_states(),
        *group.foreach_runner(lambda r: r.get_connector_states()),
    ]:
        assert same(s, saved_s)
    for w in group.foreach_runner(lambda r: r.get_weights()):
        for name, value in saved_w["default_policy"].items():
            np.testing.assert_array_equal(w["default_policy"][name], value)


def test_multi_agent_group_sample():
    env = TwoAgentEnv()
    space, actions = env.observation_spaces["a"], env.action_spaces["a"]
    policies = {pid: rc.RandomPolicy(space, actions) for pid in ("pa", "pb")}
    cfg = config(batch_mode="truncate_episodes")
    with RunnerGroup(
        make_two_agent_env, policies, map_agent, config=cfg, num_runners=2, runner_resources=SMALL
    ) as group:
        for _ in range(2):
            batch = group.sample()
            assert isinstance(batch, rc.MultiAgentBatch)
            assert batch.env_steps() == cfg.rollout_fragment_length * cfg.num_envs * 2
            assert group.last_sample_info["runner_rows"] == {1: 10, 2: 10}
            assert set(batch.policy_batches) == {"pa", "pb"}
            for agent, pid in enumerate(("pa", "pb")):
                pb = batch.policy_batches[pid]
                assert len(pb) == 20  # both agents act every env step
                obs, new = pb["obs"], pb["new_obs"]
                assert set(obs[:, 0]) == {agent}  # the mapping sent each agent to its policy
                # sub-env j of runner k is seeded seed + k * num_envs + j
                assert set(obs[:, 1]) == {102.0, 103.0, 104.0, 105.0}
                np.testing.assert_array_equal(new[:, :3], obs[:, :3])
                np.testing.assert_array_equal(new[:, 3], obs[:, 3] + 1)
                np.testing.assert_array_equal(new[:, 4], pb["actions"])
                # within each agent trajectory, new_obs[t] == obs[t + 1]
                keys = set(zip(pb["eps_id"].tolist(), pb["agent_index"].tolist()))
                chained = 0
                for eps, idx in keys:
                    rows = np.flatnonzero((pb["eps_id"] == eps) & (pb["agent_index"] == idx))
                    rows = rows[np.argsort(pb["t"][rows], kind="stable")]
                    np.testing.assert_array_equal(np.diff(pb["t"][rows]), 1)
                    np.testing.assert_array_equal(new[rows[:-1]], obs[rows[1:]])
                    chained += len(rows) - 1
                assert chained > 0


def test_pipelines_reach_every_runner(tmp_path):
    crash = {"crash_worker": 2, "crash_at": 3, "crash_mode": "exit", "marker": str(tmp_path / "m")}
    with RunnerGroup(
        make_env,
        random_policy(),
        config=config(env_config=crash),
        num_runners=2,
        runner_resources=SMALL,
        agent_pipelines={"default_policy": half_reward_pipeline},
        action_pipelines={"default_policy": constant_action_pipeline},
        fault_tolerance=rc.FaultTolerance(restart_failed_runners=True),  # restarted: them too
    ) as group:
        for _ in range(2):
            batch = group.sample()
            assert len(batch) == 20
            np.testing.assert_array_equal(batch["new_obs"][:, 3], 2)  # the env got action 2
            np.testing.assert_array_equal(batch["rewards"], 0.5)  # 1.0 clipped
        assert group.fault_metrics()["num_runner_restarts"] == 1

        def members(runner):
            return [type(c).__name__ for c in runner.agent_pipeline()]

        assert [members(group.local_runner), *group.foreach_runner(members)] == [["ClipReward"]] * 3


def test_a_recurrent_policy_is_rebuilt_in_remote_runners_and_records_its_state():
    policy = rc.LSTMPolicy(SPACE.observation_space, SPACE.action_space, cell_size=4, seed=1)
    with RunnerGroup(
        make_env, policy, config=config(), num_runners=1, runner_resources=SMALL
    ) as group:
        batch = group.sample()
        (remote,) = group.foreach_runner(lambda r: r.policies["default_policy"].get_config())
    del remote["seed"]  # each runner's policy samples with a seed of its own
    assert remote == {k: v for k, v in policy.get_config().items() if k != "seed"}
    seq = rc.chop_into_sequences(batch, 3)
    with torch.no_grad():
        dist, _ = policy.model.forward_sequences(
            torch.from_numpy(seq["obs"]).float(),
            [torch.from_numpy(seq["state_in_0"]), torch.from_numpy(seq["state_in_1"])],
            torch.from_numpy(seq.mask),
        )
    np.testing.assert_allclose(seq.unpad(dist.numpy()), batch["action_dist_inputs"], atol=1e-5)


def test_learner_pipelines_run_on_each_remote_runner_with_its_policy():
    policy = rc.MLPPolicy(
        SPACE.observation_space, SPACE.action_space, hiddens=(8,), vf_head=True, seed=0
    )
    with RunnerGroup(
        make_env,
        policy,
        config=config(horizon=4),
        num_runners=2,
        runner_resources=SMALL,
        learner_pipelines={"default_policy": gae_pipeline},
    ) as group:
        assert group.foreach_runner(lambda r: r.learner_pipeline().names) == [["GAE"], ["GAE"]]
        batch = group.sample()
        assert batch.meta["runner_rows"] == {1: 10, 2: 10}
        # the same pipeline here, with the same weights, gives what the runners computed
        raw = rc.SampleBatch(
            {k: batch[k] for k in batch if k not in ("advantages", "value_targets")}
        )
        again = group.local_runner.learner_pipeline()(
            raw, group.local_runner.policies["default_policy"]
        )
        np.testing.assert_allclose(again["advantages"], batch["advantages"], rtol=1e-5, atol=1e-5)
        assert batch["truncateds"].any()  # the horizon cut some: bootstrapped remotely


def test_a_remote_runner_samples_a_tensor_env_on_its_own_device():
    from dist_envs import make_tensor_env

    env = make_tensor_env(None)
    policy = rc.MLPPolicy(env.single_observation_space, env.single_action_space, seed=0)
    with RunnerGroup(
        make_tensor_env,
        policy,
        config=config(num_envs=4, rollout_fragment_length=5),
        num_runners=1,
        runner_resources=SMALL,
    ) as group:
        assert group.foreach_runner(lambda r: type(r._kernel).__name__) == ["TensorKernel"]
        batch = group.sample()
        assert isinstance(batch["obs"], torch.Tensor) and batch.device == torch.device("cpu")
        assert len(batch) == 20 and batch.meta["rows_per_env"] == 5
        assert batch.time_major()["obs"].shape == (5, 4, 4)
        assert group.metrics()["env_steps"] == 20
