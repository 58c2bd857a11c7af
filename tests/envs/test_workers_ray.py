"""A RunnerGroup on Ray whose runners step their sub-envs in env workers."""

from __future__ import annotations

import os

import numpy as np
import pytest
from env_cases import make_indexed, spaces

import rlconnect as rc

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    path = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},  # actors import env_cases
    )
    yield ray
    ray.shutdown()


@pytest.mark.usefixtures("ray_local")
def test_each_ray_runner_has_its_env_workers_and_samples_its_own_seeds():
    base = {"num_envs": 2, "rollout_fragment_length": 6, "seed": 40, "num_env_workers": 2}
    policy = rc.RandomPolicy(*spaces(make_indexed))
    group = rc.RunnerGroup(
        make_indexed,
        policy,
        config=rc.RunnerConfig(**base),
        num_runners=1,
        runner_resources={"num_cpus": 0.5},
    )
    try:
        batch = group.sample()
    finally:
        group.stop()
    assert len(batch) == 12
    # runner k of a group seeds its sub-env j with seed + k * num_envs + j: 40 + 1 * 2 + j
    offsets = batch["obs"][:, 3] - batch["obs"][:, 3] % 1000
    expected = 10_000 * batch["env_id"] + 100_000 * (42 + batch["env_id"])
    np.testing.assert_array_equal(offsets, expected)
