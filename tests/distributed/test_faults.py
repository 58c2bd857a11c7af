"""Remote runners that die mid-sample: restarted, skipped, or named in the error."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import ray
from dist_envs import CountingEnv, env_logs, make_env

import rlconnect as rc
from machine_speed import scaled
from rlconnect.distributed import RunnerFailedError, RunnerGroup
from rlconnect.runner.postprocess import state_digest

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

SPACE = CountingEnv()
FILTERED = gym.spaces.Box(-10.0, 10.0, (4,), np.float32)
SMALL = {"num_cpus": 0.25}
FRAG, N = 5, 2
PROMISED = 2 * FRAG * N


def group(env_config=None, filtered=False, **faults):
    config = rc.RunnerConfig(
        num_envs=N,
        rollout_fragment_length=FRAG,
        seed=7,
        env_config=env_config or {},
        observation_filter="MeanStdFilter" if filtered else "NoFilter",
    )
    obs_space = FILTERED if filtered else SPACE.observation_space
    policy = rc.MLPPolicy(obs_space, SPACE.action_space, hiddens=(8,))
    return RunnerGroup(
        make_env,
        policy,
        config=config,
        num_runners=2,
        runner_resources=SMALL,
        fault_tolerance=rc.FaultTolerance(**faults),
    )


def test_killed_runner_is_restarted_with_current_state(tmp_path):
    # runner 2's process dies at its 8th step: inside the second sample() call
    crash = {"crash_worker": 2, "crash_at": 8, "crash_mode": "exit", "marker": str(tmp_path / "m")}
    with group(crash, filtered=True, restart_failed_runners=True) as g:
        first = g.sample()
        logs_before = g.foreach_runner(env_logs)
        g.sync_connector_states()
        weights = {k: v + 1.0 for k, v in g.get_weights()["default_policy"].items()}
        g.sync_weights({"default_policy": weights})
        expected_digest = state_digest(g.local_runner.agent_pipeline())
        batch = g.sample()
        assert len(first) == len(batch) == PROMISED  # the promised size, despite the crash
        # both runners started this batch from the synced statistics (the restarted one too)
        assert batch.meta["connector_state"] == expected_digest
        metrics = g.fault_metrics()
        assert metrics["num_runner_restarts"] == 1 and metrics["num_healthy_runners"] == 2
        (failure,) = metrics["failures"]
        assert failure["runner_index"] == 2 and failure["action"] == "restarted"
        assert failure["error_type"] == "ActorDiedError" and failure["missing_rows"] == 0
        assert "exit" in failure["cause"].lower()
        assert batch.meta["runner_failures"] == [failure]
        for w in g.foreach_runner(lambda r: r.get_weights()):
            for name, value in weights.items():
                np.testing.assert_array_equal(w["default_policy"][name], value)
        # fresh seeds and episode ids: the restarted runner never replays old data
        eps = np.concatenate([first["eps_id"], batch["eps_id"]])
        assert len(set(first["eps_id"]) & set(batch["eps_id"][batch["eps_id"] >> 40 == 2])) == 0
        assert set(batch["obs"][10:, 0]).isdisjoint(first["obs"][:, 0])
        assert (eps >> 40).min() >= 1
        # statistics: exactly the data of the batches the caller received
        g.sync_connector_states()
        logs_now = g.foreach_runner(env_logs)
        data = np.concatenate([*logs_before[1], *logs_now[0], *logs_now[1]])
        st = g.get_connector_states()["default_policy"]["agent"]["MeanStdFilter"]
        assert float(st["count"]) == len(data)
        np.testing.assert_allclose(st["mean"], data.mean(axis=0), rtol=1e-6, atol=1e-6)


def test_failed_runner_is_restarted_within_budget_then_skipped():
    crash = {"crash_worker": 2, "crash_at": 3, "crash_mode": "exit"}  # every incarnation
    with group(
        crash, restart_failed_runners=True, max_runner_restarts=1, ignore_runner_failures=True
    ) as g:
        batch = g.sample()
        assert len(batch) == PROMISED // 2
        assert set(batch["obs"][:, 0]) == {9.0, 10.0}  # runner 1 only: seeds 7 + 1 * 2 + j
        restarted, ignored = batch.meta["runner_failures"]
        assert restarted["action"] == "restarted" and restarted["incarnation"] == 0
        assert ignored["action"] == "ignored" and ignored["incarnation"] == 1
        assert {restarted["runner_index"], ignored["runner_index"]} == {2}
        assert ignored["missing_rows"] == PROMISED // 2 == batch.meta["missing_rows"]
        assert "exit" in ignored["cause"].lower()
        again = g.sample()  # the dropped runner's rows stay counted as missing
        assert len(again) == PROMISED // 2 and again.meta["missing_rows"] == PROMISED // 2
        assert again.meta["runner_failures"] == []
        assert g.healthy_runner_indices == [1]
        metrics = g.fault_metrics()
        assert metrics["num_healthy_runners"] == 1 and metrics["num_runner_restarts"] == 1


def wait_dead(actor, timeout_s: float = 30.0) -> None:
    """``ray.kill`` returns at once: wait until calls to the actor fail as a dead one's."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_without_flags_the_error_names_runner_and_cause():
    crash = {"crash_worker": 2, "crash_at": 4, "crash_mode": "raise"}
    with group(crash) as g:
        with pytest.raises(RunnerFailedError) as info:
            g.sample()
        msg = str(info.value)
        assert "remote runner 2" in msg and "simulated crash at step 4" in msg
        assert "restart_failed_runners=True" in msg
        assert info.value.failure.runner_index == 2
        # killed actors (no flags): the error names the runner and that its actor died
        for actor in g._actors.values():
            ray.kill(actor, no_restart=True)
            wait_dead(actor)  # else runner 2 may still answer, with its RunnerStateError
        with pytest.raises(RunnerFailedError, match=r"remote runner [12] failed in sample\(\)"):
            g.sample()
        assert g.fault_metrics()["failures"][-1]["error_type"] == "ActorDiedError"


def test_ray_kill_mid_sample(tmp_path):
    stepping = tmp_path / "stepping"  # runner 1's sub-envs write it when they step
    slow = {"sleep": 0.1, "stepping": str(stepping)}  # 5 steps of 2 sub-envs: ~1 s a sample
    with group(slow, restart_failed_runners=True) as g:
        stepping.unlink(missing_ok=True)  # written by the checks of a new runner, if any
        out = []
        thread = threading.Thread(target=lambda: out.append(g.sample()))
        thread.start()
        deadline = time.monotonic() + 60
        while not stepping.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stepping.exists(), "runner 1 did not start sampling within 60 s"

        ray.kill(g._actors[1], no_restart=True)
        thread.join(timeout=60)
        assert len(out[0]) == PROMISED
        (failure,) = g.fault_metrics()["failures"]
        assert failure["runner_index"] == 1 and failure["action"] == "restarted"


def test_hanging_runner_times_out():
    hang = {"crash_worker": 2, "crash_at": 2, "crash_mode": "hang", "hang_s": 30}
    with group(hang, ignore_runner_failures=True, sample_timeout_s=3) as g:
        start = time.monotonic()
        batch = g.sample()
        assert time.monotonic() - start < min(scaled(15), 29)  # before the 30 s hang ends
        assert len(batch) == PROMISED // 2
        (failure,) = batch.meta["runner_failures"]
        assert failure["runner_index"] == 2 and failure["error_type"] == "GetTimeoutError"


def test_runner_that_cannot_be_placed_fails_at_start():
    with pytest.raises(RunnerFailedError, match="not started within"):
        RunnerGroup(
            make_env,
            rc.RandomPolicy(SPACE.observation_space, SPACE.action_space),
            num_runners=1,
            runner_resources={"num_cpus": 64},
            fault_tolerance=rc.FaultTolerance(start_timeout_s=2),
        )


def check_transitions(batch):
    obs, new = batch["obs"], batch["new_obs"]
    np.testing.assert_array_equal(new[:, :2], obs[:, :2])  # same sub-env, same episode
    np.testing.assert_array_equal(new[:, 2], obs[:, 2] + 1)
    np.testing.assert_array_equal(new[:, 3], batch["actions"])


def test_sample_async_skips_a_killed_runner():
    crash = {"crash_worker": 2, "crash_at": 3, "crash_mode": "exit"}  # dies in its 1st batch
    with group(crash, ignore_runner_failures=True) as g:
        batches = list(g.sample_async(num_batches=4))
        assert len(batches) == 4  # the healthy runner makes up the count
        assert all(len(b) == PROMISED // 2 for b in batches)
        assert {b.meta["runner_index"] for b in batches} == {1}
        for b in batches:
            check_transitions(b)
            assert set(b["obs"][:, 0]) == {9.0, 10.0}  # runner 1's sub-envs only
        (failure,) = [f for b in batches for f in b.meta["runner_failures"]]
        assert failure["runner_index"] == 2 and failure["action"] == "ignored"
        assert failure["call"] == "sample_async" and failure["error_type"] == "ActorDiedError"
        assert failure["missing_rows"] == PROMISED // 2
        assert g.fault_metrics()["failures"] == [failure]
        # iterating the group keeps going on the healthy runner
        it = iter(g)
        more = [next(it) for _ in range(3)]
        it.close()
        assert [b.meta["runner_index"] for b in more] == [1, 1, 1]
        assert all(b.meta["runner_failures"] == [] for b in more)
        assert g.healthy_runner_indices == [1]


def test_sample_async_restarts_a_killed_runner(tmp_path):
    crash = {"crash_worker": 2, "crash_at": 3, "crash_mode": "exit", "marker": str(tmp_path / "m")}
    crash["sleep"] = 0.005  # runner 1 keeps yielding while runner 2 restarts
    with group(crash, restart_failed_runners=True) as g:
        batches = []
        for b in g:  # until the restarted runner has delivered twice (bounded)
            batches.append(b)
            if sum(x.meta["runner_index"] == 2 for x in batches) == 2 or len(batches) > 500:
                break
        assert sum(b.meta["runner_index"] == 2 for b in batches) == 2
        assert all(len(b) == PROMISED // 2 for b in batches)  # full-size batches
        for b in batches:
            check_transitions(b)
        (failure,) = [f for b in batches for f in b.meta["runner_failures"]]
        assert failure["runner_index"] == 2 and failure["action"] == "restarted"
        assert failure["missing_rows"] == 0
        metrics = g.fault_metrics()
        assert metrics["num_runner_restarts"] == 1 and metrics["num_healthy_runners"] == 2
