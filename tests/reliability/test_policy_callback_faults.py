"""Policies that raise or return actions outside the space; callbacks that raise.

- A policy that raises gives ``PolicyError`` naming the policy id, the original as
  ``__cause__``.
- A policy action outside the env's action space gives ``PolicyError`` naming the policy
  id and the value; the env is never stepped with it (TraceEnv asserts its actions). Box
  actions are clipped into the bounds only where documented (``clip_actions``,
  ``normalize_actions``); a NaN action is an error even then.
- A callback that raises gives ``CallbackError`` naming class and hook.
- After any of these ``sample()`` raised midway, and the runner refuses to sample again
  (``RunnerStateError`` with the first error as cause) instead of hanging or sampling
  from half-processed episodes; ``stop()`` and ``get_metrics()`` still work.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from faults import (
    FaultSchedule,
    FaultyEnvCreator,
    InjectedFault,
    KeyedPolicy,
    Ledger,
    RaisingCallbacks,
    TraceEnv,
)
from invariants import Figures, Run, check_truth, make_runner

import rlconnect as rc
from rlconnect.errors import CallbackError, PolicyError, RunnerStateError
from rlconnect.runner.callbacks import HOOKS

pytestmark = pytest.mark.reliability

FIGURES = Figures()
NO_FAULTS = FaultSchedule(0, ())


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_policy_callback_faults")


def _runner(policy: rc.Policy, ledger: Ledger) -> rc.EnvRunner:
    config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=10, seed=1)
    return rc.EnvRunner(
        FaultyEnvCreator(NO_FAULTS, ledger),
        {"pilot": policy},
        lambda *a, **k: "pilot",
        config=config,
    )


def _assert_refuses_after(runner: rc.EnvRunner, first: BaseException) -> None:
    with pytest.raises(RunnerStateError, match="midway") as again:
        runner.sample()
    assert again.value.__cause__ is first
    assert isinstance(runner.get_metrics(), list)
    runner.stop()


@pytest.mark.parametrize("kind", ["raise", "out_of_space", "negative", "float"])
@pytest.mark.parametrize("seed", range(6))
def test_a_failing_policy_is_named_and_never_reaches_the_env(kind, seed):
    call = int(np.random.default_rng(seed).integers(2, 40))
    ledger = Ledger()
    policy = KeyedPolicy(TraceEnv.observation_space, TraceEnv.action_space, bad={call: kind})
    runner = _runner(policy, ledger)
    run = Run(runner, ledger)
    with pytest.raises(PolicyError, match=r"policy 'pilot'") as info:
        run.sample(20)
    msg = str(info.value)
    if kind == "raise":
        assert isinstance(info.value.__cause__, InjectedFault)
        assert "raised InjectedFault: injected policy failure" in msg
    else:
        value = {"out_of_space": "7", "negative": "-1", "float": r"\d\.5"}[kind]
        assert "outside the action space Discrete(3)" in msg and "the env was not stepped" in msg
        assert re.search(rf"(?<![\d.]){value} for env \d / agent 'agent0'", msg)
    assert all(TraceEnv.action_space.contains(s.action) for s in ledger.steps.values())
    check_truth(run, FIGURES)  # what was handed out before is true
    _assert_refuses_after(runner, info.value)
    FIGURES.faults_injected[f"policy_{kind}"] += 1


class BoxEnv(TraceEnv):
    """TraceEnv with a Box(-1, 1, (2,)) action space; asserts every action it gets."""

    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, np.float32)):
            raise AssertionError(f"BoxEnv got an action outside its space: {action!r}")
        return self._advance(int(abs(action[0]) * 2.99))


class BoxPolicy(rc.Policy):
    """Actions ``scale * obs[:2]``; ``nan_at`` puts a NaN in one call's first action."""

    def __init__(self, scale: float, nan_at: int | None = None) -> None:
        super().__init__(TraceEnv.observation_space, BoxEnv.action_space, seed=0)
        self.scale, self.nan_at, self.calls = scale, nan_at, 0

    def compute_actions(self, input_batch, explore=True):
        self.calls += 1
        actions = (np.asarray(input_batch["obs"])[:, :2] * self.scale).astype(np.float32)
        if self.calls == self.nan_at:
            actions[0, 1] = np.nan
        return actions, [], {}


def _box_runner(policy: rc.Policy, **cfg) -> rc.EnvRunner:
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0, **cfg)
    return rc.EnvRunner(lambda ctx: BoxEnv(), policy, config=config)


def test_box_actions_out_of_bounds_are_an_error_unless_clipping_is_asked_for():
    with pytest.raises(PolicyError, match=r"outside the action space Box\(-1.0, 1.0, \(2,\)"):
        _box_runner(BoxPolicy(50.0), normalize_actions=False).sample()
    for cfg in ({"normalize_actions": False, "clip_actions": True}, {}):  # documented clipping
        batch = _box_runner(BoxPolicy(50.0), record_env_actions=True, **cfg).sample()
        assert np.abs(batch["env_actions"]).max() <= 1.0 < np.abs(batch["actions"]).max()
    with pytest.raises(PolicyError, match=r"\[\S+, nan\] for env 0 / agent 'agent0'"):
        _box_runner(BoxPolicy(0.5, nan_at=4)).sample()  # clipping keeps a NaN a NaN
    FIGURES.faults_injected["policy_box_out_of_bounds"] += 3
    FIGURES.faults_injected["policy_nan_action"] += 1


def test_the_failing_policy_of_several_is_named():
    ledger = Ledger()
    good = KeyedPolicy(TraceEnv.observation_space, TraceEnv.action_space)
    bad = KeyedPolicy(TraceEnv.observation_space, TraceEnv.action_space, bad={3: "raise"})
    runner = rc.EnvRunner(
        FaultyEnvCreator(NO_FAULTS, ledger),
        {"good": good, "bad": bad},
        lambda agent, episode, **kw: "bad" if episode.env_id == 1 else "good",
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0),
    )
    with pytest.raises(PolicyError, match=r"policy 'bad' \(KeyedPolicy\) raised .*\(env ids \[1\]"):
        runner.sample()
    FIGURES.faults_injected["policy_raise"] += 1


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("seed", range(4))
def test_a_raising_callback_is_named_and_the_runner_refuses_to_go_on(hook, seed):
    rng = np.random.default_rng([seed, len(hook)])
    at = 1 + int(rng.integers(0, 3 if hook == "on_sample_end" else 8))
    ledger = Ledger()
    callbacks = RaisingCallbacks(hook, at)
    runner = make_runner(NO_FAULTS, ledger, num_envs=3, frag=10, callbacks=callbacks)
    with pytest.raises(
        CallbackError,
        match=rf"callback RaisingCallbacks\.{hook}\b.* raised "
        r"InjectedFault: injected callback failure",
    ) as info:
        Run(runner, ledger).sample(10)
    assert isinstance(info.value.__cause__, InjectedFault)
    assert callbacks.calls[hook] == at
    _assert_refuses_after(runner, info.value)
    FIGURES.faults_injected["callback_raise"] += 1
