"""Env worker processes run one thread per numeric library and the scheduling class they
were started with; the runner's own process is left alone, and an env creator can still
ask for more threads."""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import pytest
from env_cases import StepCountEnv

from rlconnect.envs.workers import WorkerEnvs
from rlconnect.envs.workers.tuning import THREAD_VARIABLES


class ReportingEnv(StepCountEnv):
    """Its reset info tells how the process that built it is set up."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["env"] = {name: os.environ.get(name) for name in THREAD_VARIABLES}
        info["policy"] = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        torch = sys.modules.get("torch")
        info["torch_threads"] = None if torch is None else torch.get_num_threads()
        return obs, info


def first_infos(creator, num_envs: int = 2, num_workers: int = 2) -> list[dict]:
    env = WorkerEnvs(creator, num_envs, num_workers=num_workers, seed=0)
    try:
        return list(env.poll().infos)  # the first poll resets every sub-env
    finally:
        env.close()


def test_worker_processes_get_one_thread_per_library():
    infos = first_infos(lambda ctx: gym.wrappers.TimeLimit(ReportingEnv(), 5))
    assert len(infos) == 2
    for info in infos:
        assert info["env"] == dict.fromkeys(THREAD_VARIABLES, "1")
        if hasattr(os, "sched_getscheduler"):  # the runner's own, as any child process
            assert info["policy"] == os.sched_getscheduler(0)


def test_torch_imported_before_the_workers_start_gets_one_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        infos = first_infos(lambda ctx: gym.wrappers.TimeLimit(ReportingEnv(), 5))
        assert [i["torch_threads"] for i in infos] == [1, 1]
        assert torch.get_num_threads() == 2  # this process is untouched
    finally:
        torch.set_num_threads(before)


def test_an_env_creator_can_ask_for_more_threads():
    torch = pytest.importorskip("torch")

    def creator(ctx):
        torch.set_num_threads(2)  # runs after the worker was tuned: it wins
        return gym.wrappers.TimeLimit(ReportingEnv(), 5)

    infos = first_infos(creator, num_envs=1, num_workers=1)
    assert infos[0]["torch_threads"] == 2
