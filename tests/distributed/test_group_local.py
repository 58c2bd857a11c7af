"""RunnerGroup with num_runners=0: the local runner samples and Ray is never imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
import gymnasium as gym
import rlconnect as rc
from rlconnect.distributed import RunnerGroup
env = gym.make("CartPole-v1")
policy = rc.RandomPolicy(env.observation_space, env.action_space)
config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=4, seed=0)
group = RunnerGroup("CartPole-v1", policy, config=config, num_runners=0)
assert len(group.sample()) == 8
assert [len(b) for b in group.sample_async(num_batches=2)] == [8, 8]
group.sync_connector_states()
assert group.foreach_runner(lambda r: r.num_envs) == [2]
group.stop()
print("ray" in sys.modules)
"""


def test_zero_runners_sample_locally_without_importing_ray():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_bad_num_runners_is_a_named_error():
    import gymnasium as gym

    import rlconnect as rc
    from rlconnect.distributed import RunnerGroup

    env = gym.make("CartPole-v1")
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(ValueError, match="num_runners"):
        RunnerGroup("CartPole-v1", policy, num_runners=-1)
    with pytest.raises(ValueError, match="max_runner_restarts"):
        rc.FaultTolerance(max_runner_restarts=-2)
    with pytest.raises(TypeError, match=r"\['max_runner_restarts'\] are FaultTolerance settings"):
        RunnerGroup("CartPole-v1", policy, max_runner_restarts=2)
    with pytest.raises(TypeError, match=r"fault_tolerance must be an rc\.FaultTolerance"):
        RunnerGroup("CartPole-v1", policy, fault_tolerance={"max_runner_restarts": 2})


def _frozen_config(**kw):
    import rlconnect as rc

    base = {
        "num_envs": 2,
        "rollout_fragment_length": 5,
        "seed": 7,
        "observation_filter": "MeanStdFilter",
        "observation_filter_sync": "frozen",
        "keep_raw_obs": True,
    }
    return rc.RunnerConfig(**{**base, **kw})


def _filtered_policy():
    import gymnasium as gym
    import numpy as np

    import rlconnect as rc

    return rc.RandomPolicy(gym.spaces.Box(-10.0, 10.0, (4,), np.float32), gym.spaces.Discrete(3))


@pytest.mark.parametrize("sync_mode", ["frozen", "immediate"])
def test_a_runner_alone_syncs_with_itself_at_each_sample(sync_mode):
    """Frozen, a lone runner (and a group with num_runners=0) normalises each sample() with
    the statistics of all data before that call; "immediate" is the negative control."""
    import numpy as np
    from dist_envs import env_logs, first_of_each_sub_env, make_env, reference_filter

    from rlconnect.distributed import RunnerGroup

    cfg = _frozen_config(observation_filter_sync=sync_mode)
    with RunnerGroup(make_env, _filtered_policy(), config=cfg, num_runners=0) as group:
        runner = group.local_runner
        before = reference_filter([])
        errors = []
        for i in range(5):
            ref = reference_filter(env_logs(runner))  # everything the envs returned so far
            batch = group.sample() if i % 2 else next(group.sample_async(num_batches=1))
            carried = first_of_each_sub_env(batch) & (i > 0)
            raw = batch["raw_obs"]
            want = np.where(carried[:, None], before.transform(raw), ref.transform(raw))
            errors.append(np.abs(batch["obs"] - want).max())
            before = ref
            group.sync_connector_states()  # no remote runners: nothing to merge
    if sync_mode == "immediate":
        assert max(errors) > 0.1, errors
    else:
        assert max(errors) <= 1e-6, errors


def test_a_lone_runner_continues_exactly_after_a_checkpoint(tmp_path):
    """The frozen statistics and the data not yet taken in are saved: a restored runner
    takes in the same data at its next sample() as the original."""
    import numpy as np
    from dist_envs import make_env

    import rlconnect as rc

    runner = rc.EnvRunner(make_env, _filtered_policy(), config=_frozen_config())
    for _ in range(2):
        runner.sample()
    runner.save_checkpoint(tmp_path / "ck")
    restored = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env=make_env)
    saved = runner.agent_pipeline()["MeanStdFilter"].get_statistics()
    assert float(saved["frozen"]["count"]) < float(saved["count"])  # between sync points
    for r in (runner, restored):
        assert r.agent_pipeline()["MeanStdFilter"].freeze_between_syncs
        r.sample()
    got = [
        r.agent_pipeline()["MeanStdFilter"].get_statistics()["frozen"] for r in (runner, restored)
    ]
    for key in ("count", "mean", "m2"):
        np.testing.assert_array_equal(got[0][key], saved[key])
        np.testing.assert_array_equal(got[1][key], saved[key])
    runner.stop()
    restored.stop()


def test_frozen_filters_on_remote_runners_refuse_a_background_sampler():
    pytest.importorskip("ray")
    from dist_envs import make_env

    from rlconnect.distributed import RunnerGroup

    with pytest.raises(ValueError, match="sample_async=False"):
        RunnerGroup(
            make_env, _filtered_policy(), config=_frozen_config(sample_async=True), num_runners=1
        )


def test_zero_runners_sample_a_tensor_env_on_its_device():
    """The local runner of a group takes the tensor path; two of its batches concatenate
    into one that still folds time-major (each sub-env's rows of both, in time order)."""
    import torch
    from dist_envs import make_tensor_env

    import rlconnect as rc
    from rlconnect.distributed import RunnerGroup

    env = make_tensor_env(None)
    policy = rc.MLPPolicy(env.single_observation_space, env.single_action_space, seed=0)
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=5, seed=0)
    with RunnerGroup(make_tensor_env, policy, config=config, num_runners=0) as group:
        first, second = group.sample(), group.sample()
    assert isinstance(first["obs"], torch.Tensor) and len(first) == 20
    both = rc.concat_samples([first, second])
    assert both.meta["rows_per_env"] == 10
    folded = both.time_major()["obs"]
    assert folded.shape == (10, 4, 4)
    assert torch.equal(folded[:5], first.time_major()["obs"])
    assert torch.equal(folded[5:], second.time_major()["obs"])
