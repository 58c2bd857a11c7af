"""``RunnerGroup.metrics()``: the runners' ``metrics()`` merged (issue 54); K=0 without
Ray, K=2 on a local Ray instance."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dist_envs import CountingEnv, make_env

import rlconnect as rc
from rlconnect.distributed import RunnerGroup

SPACE = CountingEnv()


def _group(num_runners: int, **kw) -> RunnerGroup:
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=100)
    policy = rc.RandomPolicy(SPACE.observation_space, SPACE.action_space)
    return RunnerGroup(make_env, policy, config=config, num_runners=num_runners, **kw)


def _check_against_records(m: dict, records: list[dict], env_steps: int) -> None:
    rets = [r["episode_reward"] for r in records if not r["episode_faulty"]]
    assert m["env_steps"] == env_steps
    assert m["num_episodes"] == len(rets) > 0
    assert m["episode_return_mean"] == pytest.approx(np.mean(rets))
    assert m["episode_return_max"] == max(rets)
    assert json.loads(json.dumps(m)) == m


def test_zero_runners_report_the_local_runners_metrics(tmp_path):
    group = _group(0)
    group.add_logger(rc.loggers.JsonlLogger(tmp_path / "m.jsonl"))
    group.sample()
    group.sample()
    group.stop()
    (first, second) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert first["env_steps"] == second["env_steps"] == 20
    assert second["env_steps_lifetime"] == 40
    assert first["num_runners_merged"] == first["num_healthy_runners"] == 1


def test_zero_runners_merge_nothing_away():
    group = _group(0)
    group.sample()
    records = group.get_metrics()
    _check_against_records(group.metrics(), records, env_steps=20)
    group.stop()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_remote_runners_are_merged_by_their_counts():
    group = _group(2, runner_resources={"num_cpus": 0.25})
    try:
        group.sample()
        group.sample()
        records = group.get_metrics()  # apart from metrics(): both see every episode
        m = group.metrics()
        _check_against_records(m, records, env_steps=80)
        assert m["num_runners_merged"] == m["num_healthy_runners"] == 2
        assert m["num_runner_failures_lifetime"] == 0
        assert m["env_steps_lifetime"] == 80 and m["num_batches"] == 4
        assert m["time/env"] > 0 and 0 <= m["time/overhead_share"] <= 1
        per_runner = group.foreach_runner(lambda r: r.metrics())  # (a new, empty window)
        assert [r["env_steps"] for r in per_runner] == [0, 0]
    finally:
        group.stop()
