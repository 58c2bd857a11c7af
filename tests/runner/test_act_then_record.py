"""Every policy acts before rows are recorded; with one policy and no
``on_episode_created`` hook, episodes of first observations open after the actions went
out. Neither changes a row, a metric or the order callbacks see."""

from __future__ import annotations

import importlib.util

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc


class _Created(rc.Callbacks):
    """Logs episode creation and starts (its on_episode_created keeps the early opening)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def on_episode_created(self, *, episode, env_index, **kwargs) -> None:
        self.log.append(("created", env_index, episode.episode_id))

    def on_episode_start(self, *, episode, env_index, **kwargs) -> None:
        self.log.append(("start", env_index, episode.episode_id))


class _Started(rc.Callbacks):
    def __init__(self, log: list) -> None:
        self.log = log

    def on_episode_start(self, *, episode, env_index, **kwargs) -> None:
        self.log.append(("start", env_index, episode.episode_id))


class _LoggedPolicy(rc.RandomPolicy):
    def __init__(self, *args, log: list, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log = log

    def compute_actions(self, input_batch, explore=True):
        self.log.append(("act", int(input_batch["t"].min())))
        return super().compute_actions(input_batch, explore=explore)


def _run(env, hook: bool, **cfg):
    log: list = []
    space = gym.make("CartPole-v1")
    policy = _LoggedPolicy(space.observation_space, space.action_space, seed=1, log=log)
    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=25, seed=3, **cfg)
    callbacks = _Created(log) if hook else _Started(log)
    runner = rc.EnvRunner(env, policy, config=config, callbacks=callbacks)
    try:
        batches = [runner.sample() for _ in range(3)]
        return batches, runner.get_metrics(), log
    finally:
        runner.stop()


_ENVPOOL = pytest.param(
    "envpool:CartPole-v1",
    marks=pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="no envpool"),
)


@pytest.mark.parametrize("env", ["CartPole-v1", _ENVPOOL])
def test_opening_episodes_after_acting_changes_no_row_metric_or_start(env):
    early, late = _run(env, hook=True), _run(env, hook=False)
    for a, b in zip(early[0], late[0]):
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            if k != "infos":
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert early[1] == late[1]
    starts = [e for e in early[2] if e[0] == "start"]
    assert starts == [e for e in late[2] if e[0] == "start"] and len(starts) > 4


def test_with_an_on_episode_created_hook_episodes_exist_before_the_policy_acts():
    batches, _, log = _run("CartPole-v1", hook=True)
    # every poll with a first row (t == 0) is acted on after that episode was created
    for i, event in enumerate(log):
        if event == ("act", 0):
            assert any(e[0] == "created" for e in log[max(0, i - 5) : i]), log[max(0, i - 5) : i]
