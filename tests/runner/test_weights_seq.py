"""Policy versions: ``policy.weights_seq`` and the ``weights_seq`` column of every row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.envs import ExternalEnv
from rlconnect.errors import EnvError

CARTPOLE = gym.make("CartPole-v1")
OBS, ACT = CARTPOLE.observation_space, CARTPOLE.action_space


def mlp(seed: int = 0) -> rc.MLPPolicy:
    return rc.MLPPolicy(OBS, ACT, hiddens=(8,), seed=seed)


class Counting(rc.RandomPolicy):
    """An override that calls ``super().set_weights``: still one version per call."""

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        super().set_weights(weights)


class OwnWeights(rc.RandomPolicy):
    """An override that never calls the base class: it counts all the same."""

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.loaded = dict(weights)


def test_every_set_weights_is_one_new_version():
    for policy in (mlp(), rc.RandomPolicy(OBS, ACT), Counting(OBS, ACT), OwnWeights(OBS, ACT)):
        assert policy.weights_seq == 0
        for want in (1, 2, 3):
            policy.set_weights(policy.get_weights())
            assert policy.weights_seq == want, type(policy).__name__


def test_weights_that_do_not_load_are_no_new_version():
    policy = mlp()
    with pytest.raises(ValueError, match="missing entries"):
        policy.set_weights({})
    assert policy.weights_seq == 0


def runner(**cfg: Any) -> rc.EnvRunner:
    base = {"num_envs": 3, "rollout_fragment_length": 20, "seed": 0, "horizon": 30}
    return rc.EnvRunner("CartPole-v1", mlp(), config=rc.RunnerConfig(**{**base, **cfg}))


def rows_per_version(batch: rc.SampleBatch) -> dict[int, int]:
    assert batch["weights_seq"].dtype == np.int64
    values, counts = np.unique(batch["weights_seq"], return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"num_env_workers": 2},
        {"num_env_workers": 3, "env_poll_size": 1},
        {"num_envs": 4},
    ],
    ids=["in-process", "env-workers", "async-polls", "four-envs"],
)
def test_rows_carry_the_version_that_chose_their_action(cfg):
    r = runner(**cfg)
    try:
        first = r.sample()
        assert rows_per_version(first) == {0: len(first)}
        assert first.meta["weights_lag"] == {"max": 0, "mean": 0.0}
        r.set_weights(r.get_weights())
        second = r.sample()
        # rows whose action was chosen before set_weights (the pending row of each
        # episode that went on, and the rest of a poll the last batch ended in the middle
        # of) are version 0, every later one version 1; never the other way round
        carried = rows_per_version(second).get(0, 0)
        assert 0 < carried <= 2 * r.num_envs
        assert rows_per_version(second)[1] == len(second) - carried
        assert second.meta["weights_lag"]["max"] == 1
        for eps in np.unique(second["eps_id"]):
            seq = second["weights_seq"][second["eps_id"] == eps]
            assert (np.diff(seq) >= 0).all()
        r.set_weights(r.get_weights(), weights_seq=41)
        assert r.policies["default_policy"].weights_seq == 41
        third = r.sample()
        assert set(rows_per_version(third)) <= {1, 41}
    finally:
        r.stop()


def test_sample_async_rows_show_their_lag():
    r = runner(sample_async=True, num_envs=2, rollout_fragment_length=10)
    try:
        r.sample()
        for k in range(1, 4):
            r.set_weights(r.get_weights(), weights_seq=10 * k)
        batch = r.sample()  # sampled (in part) before the three versions: it lags
        lag = batch.meta["weights_lag"]
        assert lag["max"] == 30 - int(batch["weights_seq"].min()) > 0
        assert np.isin(batch["weights_seq"], [0, 10, 20, 30]).all()
    finally:
        r.stop()


def test_envpool_rows_carry_versions():
    pytest.importorskip("envpool")
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=10, seed=1)
    r = rc.EnvRunner("envpool:CartPole-v1", mlp(), config=config)
    try:
        assert rows_per_version(r.sample()) == {0: 40}
        r.set_weights(r.get_weights(), weights_seq=5)
        assert set(rows_per_version(r.sample())) == {0, 5}
    finally:
        r.stop()


class Sim(ExternalEnv):
    """Episodes of 4 steps, every action asked of the runner."""

    def __init__(self) -> None:
        super().__init__(ACT, OBS)

    def run(self) -> None:
        try:
            for _ in range(100):
                eid = self.start_episode()
                obs = np.zeros(4, np.float32)
                for _ in range(4):
                    self.get_action(eid, obs)
                    self.log_returns(eid, 1.0)
                self.end_episode(eid, obs)
        except EnvError:  # the runner stopped
            pass


def test_external_env_rows_carry_versions():
    sim = Sim()
    config = rc.RunnerConfig(rollout_fragment_length=8, seed=0)
    r = rc.EnvRunner(lambda ctx: sim, mlp(), config=config)
    try:
        assert set(rows_per_version(r.sample())) == {0}
        r.set_weights(r.get_weights(), weights_seq=3)
        later = [r.sample() for _ in range(2)]
        assert rows_per_version(later[-1]) == {3: len(later[-1])}
    finally:
        r.stop()


def test_weights_seq_by_policy_and_bad_versions():
    r = runner()
    try:
        w = r.get_weights()
        r.set_weights(w, weights_seq={"default_policy": 9})
        assert r.policies["default_policy"].weights_seq == 9
        for bad in (-1, True, 1.5, "3"):
            with pytest.raises(ValueError, match="weights_seq"):
                r.set_weights(w, weights_seq=bad)
        with pytest.raises(ValueError, match="get no weights"):
            r.set_weights(w, weights_seq={"other": 1})
        assert r.policies["default_policy"].weights_seq == 9  # nothing changed on error
    finally:
        r.stop()


def test_checkpoints_keep_versions_and_a_restore_is_no_new_version(tmp_path):
    r = runner()
    try:
        r.sample()
        r.set_weights(r.get_weights(), weights_seq=12)
        r.save_checkpoint(tmp_path / "ck")
        r.set_weights(r.get_weights())
        assert r.policies["default_policy"].weights_seq == 13
        r.restore(tmp_path / "ck")
        assert r.policies["default_policy"].weights_seq == 12
        batch = r.sample()
        assert set(rows_per_version(batch)) == {0, 12}  # 0: acted before the restore
    finally:
        r.stop()
    rebuilt = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")
    try:
        assert rebuilt.policies["default_policy"].weights_seq == 12
        assert rows_per_version(rebuilt.sample()) == {12: 60}
    finally:
        rebuilt.stop()


def test_group_sync_weights_sets_the_learners_version_locally():
    group = rc.RunnerGroup(
        "CartPole-v1", mlp(), config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=5)
    )
    try:
        group.sync_weights(group.get_weights(), weights_seq=100)
        assert group.local_runner.policies["default_policy"].weights_seq == 100
        group.sync_weights(weights_seq=101)
        assert group.local_runner.policies["default_policy"].weights_seq == 101
        group.sample()
        assert group.sample().meta["weights_lag"]["max"] == 0
    finally:
        group.stop()


@rc.register_policy("test_weights_seq.SetCounting")
class SetCounting(rc.MLPPolicy):
    """Counts the ``set_weights`` calls of this instance."""

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        self.sets = getattr(self, "sets", 0) + 1
        super().set_weights(weights)


def test_from_checkpoint_sets_the_saved_weights_once_with_their_version(tmp_path):
    r = rc.EnvRunner("CartPole-v1", SetCounting(OBS, ACT, hiddens=(8,), seed=0))
    try:
        r.set_weights({"default_policy": mlp(seed=3).get_weights()}, weights_seq=7)
        r.save_checkpoint(tmp_path / "ck")
    finally:
        r.stop()
    rebuilt = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")
    try:
        policy = rebuilt.policies["default_policy"]
        assert type(policy) is SetCounting and policy.sets == 1
        assert policy.weights_seq == 7
        for key, value in mlp(seed=3).get_weights().items():
            np.testing.assert_array_equal(policy.get_weights()[key], value)
    finally:
        rebuilt.stop()
