"""Learner pipelines on offline input: run on each batch as written, before shuffling."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def _policy() -> rc.MLPPolicy:
    return rc.MLPPolicy(OBS, ACT, vf_head=True, seed=0)


def _write(path) -> None:
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=25, seed=0, output=str(path))
    with rc.EnvRunner("CartPole-v1", _policy(), config=config) as runner:
        for _ in range(4):
            runner.sample()


def _gae(ctx: rc.ConnectorContext) -> list[rc.LearnerConnector]:
    return [rc.GAE(ctx, gamma=0.9, lambda_=0.8)]


def _reader(input_spec, learner=_gae, **cfg) -> rc.EnvRunner:
    config = rc.RunnerConfig(
        num_envs=1, rollout_fragment_length=10, seed=3, input=input_spec, **cfg
    )
    return rc.EnvRunner(
        "CartPole-v1", _policy(), config=config, learner_pipelines={"default_policy": learner}
    )


def _expected(path) -> dict[tuple[int, int], float]:
    """GAE of every written row, computed on the batches as written."""
    ctx = rc.ConnectorContext.from_policy(_policy())
    pipe = rc.LearnerConnectorPipeline(ctx, _gae(ctx))
    out = {}
    for read in rc.read_batches(str(path)):
        done = pipe(read, _policy())
        for e, t, a in zip(done["eps_id"], done["t"], done["advantages"]):
            out[int(e), int(t)] = float(a)
    return out


def test_shuffled_offline_rows_carry_the_signal_of_their_whole_trajectories(tmp_path):
    _write(tmp_path)
    want = _expected(tmp_path)
    with _reader(str(tmp_path), shuffle_buffer_size=100) as runner:
        got = rc.concat_samples([runner.sample() for _ in range(10)])
    keys = list(zip(got["eps_id"].tolist(), got["t"].tolist()))
    assert keys != sorted(keys)  # shuffled ...
    expected = np.array([want[k] for k in keys], np.float32)
    np.testing.assert_allclose(got["advantages"], expected, rtol=1e-6, atol=1e-6)  # ... exact


def test_live_batches_of_mixed_input_get_the_signal_too(tmp_path):
    _write(tmp_path)
    with _reader({"sampler": 0.5, str(tmp_path): 0.5}) as runner:
        got = [runner.sample() for _ in range(12)]
    assert {b.meta["input"] for b in got} == {"sampler", str(tmp_path)}
    assert all("advantages" in b and "value_targets" in b for b in got)


@rc.register_connector("FailsOnFirstOfflineBatch")
class _FailsOnce(rc.LearnerConnector):
    calls = 0

    def __call__(self, batch: rc.SampleBatch, policy: rc.Policy) -> rc.SampleBatch:
        type(self).calls += 1
        if type(self).calls == 1:
            raise ValueError("a bad batch")
        batch["seen"] = np.ones(len(batch), np.float32)
        return batch


def test_a_learner_connector_that_raises_loses_one_read_batch_only(tmp_path):
    _write(tmp_path)
    with _reader(str(tmp_path), learner=lambda ctx: [_FailsOnce(ctx)]) as runner:
        with pytest.raises(ValueError, match="a bad batch"):
            runner.sample()
        later = [runner.sample() for _ in range(3)]
    assert all("seen" in b for b in later)
