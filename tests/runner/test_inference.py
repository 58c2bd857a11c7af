"""compute_single_action / compute_actions and evaluate: eval mode, and no trace in training."""

from __future__ import annotations

import copy
import types

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, TurnTakingEnv

import rlconnect as rc

CARTPOLE = gym.make("CartPole-v1")
OBS = np.random.default_rng(3).normal(0.0, 0.5, size=(6, 4)).astype(np.float32)


class RecordingPolicy(rc.RandomPolicy):
    """A RandomPolicy that records the obs batches and explore flags it is called with."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[np.ndarray, bool]] = []

    def compute_actions(self, input_batch, explore=True):
        self.calls.append((np.array(input_batch["obs"]), explore))
        return super().compute_actions(input_batch, explore)


class NestedRandomPolicy(rc.Policy):
    """Draws its actions from a generator inside another object, which the default random
    state snapshot does not see, so it extends ``get_random_state`` / ``set_random_state``
    (what ``evaluate()`` relies on to leave training as it was)."""

    def __init__(self, *args, seed=None, **kwargs) -> None:
        super().__init__(*args, seed=seed, **kwargs)
        self.sampler = types.SimpleNamespace(rng=np.random.default_rng(seed))

    def compute_actions(self, input_batch, explore=True):
        n = len(input_batch["obs"])
        return self.sampler.rng.integers(0, 2, size=n), [], {}

    def get_random_state(self):
        return super().get_random_state(), copy.deepcopy(self.sampler.rng.bit_generator.state)

    def set_random_state(self, state):
        generators, self.sampler.rng.bit_generator.state = state
        super().set_random_state(generators)


def runner(policy_kind="mlp", seed=0, env="CartPole-v1", **cfg) -> rc.EnvRunner:
    cfg.setdefault("observation_filter", "MeanStdFilter")
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=25, seed=seed, **cfg)
    k = cfg.get("framestack") or 0
    obs_space = gym.spaces.Box(-np.inf, np.inf, (k, 4) if k else (4,), np.float32)
    cls = {
        "mlp": rc.MLPPolicy,
        "random": rc.RandomPolicy,
        "recording": RecordingPolicy,
        "nested": NestedRandomPolicy,
    }
    policy = cls[policy_kind](obs_space, CARTPOLE.action_space, seed=seed)
    return rc.EnvRunner(env, policy, config=config)


def assert_same_batches(a: rc.SampleBatch, b: rc.SampleBatch) -> None:
    assert sorted(a.keys()) == sorted(b.keys())
    for k in sorted(a.keys()):
        if k == "infos":
            assert list(a[k]) == list(b[k])
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def stats(r: rc.EnvRunner) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in r.agent_pipeline().get_statistics()["MeanStdFilter"].items()}


# -- compute_single_action / compute_actions ---------------------------------------------------


def test_compute_single_action_runs_the_training_pipelines_in_eval_mode():
    r = runner()
    r.sample()
    before = stats(r)
    action = r.compute_single_action(OBS[0])
    # the same as a frozen copy of the pipeline, then the policy's mode
    pipe = r.agent_pipeline()
    ctx = rc.ConnectorContext(pipe.ctx.observation_space, pipe.ctx.action_space)
    frozen = rc.AgentConnectorPipeline.from_state(ctx, pipe.to_state())
    frozen.in_eval()
    filtered = frozen(rc.AgentData([0], ["x"], {"obs": OBS[:1]}))["obs"]
    _, _, extra = r.policies["default_policy"].compute_actions({"obs": filtered}, explore=False)
    assert action == int(np.argmax(extra["action_dist_inputs"][0]))
    assert action in (0, 1)
    for k, v in stats(r).items():
        np.testing.assert_array_equal(v, before[k])
    assert pipe.is_training and all(c.is_training for c in pipe)
    assert [r.compute_single_action(o) for o in OBS] == [r.compute_single_action(o) for o in OBS]


def test_inference_calls_do_not_disturb_sampling():
    a, b = runner(framestack=2), runner(framestack=2)
    assert_same_batches(a.sample(), b.sample())
    calls = a.agent_pipeline()._calls
    for _ in range(3):
        a.compute_single_action(OBS[0])
        a.compute_actions({"x": OBS[1], "y": OBS[2]}, policy_id="default_policy")
    a.compute_single_action(OBS[0], env_id=77)  # state kept under its own id
    assert a.agent_pipeline()._calls == calls  # perf timings untouched
    for _ in range(3):
        assert_same_batches(a.sample(), b.sample())
    assert a.get_metrics() == b.get_metrics()


def test_eval_runner_pipelines_stay_in_eval_mode():
    r = runner(explore=False)
    r.compute_single_action(OBS[0])
    assert not r.agent_pipeline().is_training
    assert not any(c.is_training for c in r.agent_pipeline())


def test_state_is_dropped_after_each_call_unless_an_env_id_is_given():
    r = runner("recording", framestack=2, observation_filter="NoFilter")
    policy = r.policies["default_policy"]
    r.compute_single_action(OBS[0])
    r.compute_single_action(OBS[1])
    np.testing.assert_array_equal(policy.calls[-1][0][0], [OBS[1], OBS[1]])  # fresh start
    r.compute_single_action(OBS[0], env_id=100)
    r.compute_single_action(OBS[1], env_id=100)
    np.testing.assert_array_equal(policy.calls[-1][0][0], [OBS[0], OBS[1]])  # stacked
    assert all(explore is False for _, explore in policy.calls)
    r.agent_pipeline().reset(100)
    r.compute_single_action(OBS[2], env_id=100)
    np.testing.assert_array_equal(policy.calls[-1][0][0], [OBS[2], OBS[2]])
    with pytest.raises(ValueError, match="sampling sub-envs"):
        r.compute_single_action(OBS[0], env_id=1)


def test_compute_actions_maps_agents_to_their_policies():
    env = TurnTakingEnv()
    space = env.observation_spaces["a"]
    policies = {
        "p0": RecordingPolicy(space, env.action_spaces["a"], seed=0),
        "p1": RecordingPolicy(space, env.action_spaces["a"], seed=1),
    }
    r = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        policies,
        policy_mapping_fn=lambda agent, episode, **kw: "p0" if agent == "a" else "p1",
    )
    obs = {a: np.array([i, 0], np.float32) for i, a in enumerate("abc")}
    actions = r.compute_actions(obs)
    assert list(actions) == ["a", "b", "c"]
    assert all(v in (0, 1) for v in actions.values())
    assert len(policies["p0"].calls[-1][0]) == 1
    assert len(policies["p1"].calls[-1][0]) == 2
    r.compute_actions(obs, policy_id="p0")
    assert len(policies["p0"].calls[-1][0]) == 3
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        r.compute_actions(obs, policy_id="nope")


PENDULUM = gym.make("Pendulum-v1")
BAD_OBS = [
    np.array([np.nan, 0.0, 0.0], np.float32),
    np.array([0.0, np.inf, 0.0]),
    np.zeros(4, np.float32),
    np.zeros((1, 3), np.float32),
    np.zeros(3, np.complex64),
    "abc",
]


@pytest.mark.parametrize("bad", BAD_OBS, ids=lambda b: str(getattr(b, "dtype", b)))
def test_a_refused_observation_leaves_the_sessions_state_unchanged(bad):
    """An LSTM policy, no filter: a NaN or wrongly shaped observation given with an
    ``env_id`` raises ``EnvCheckError`` naming ``obs``, as a deployed policy does, and the
    session's RNN state is as it was: its next actions equal a twin session's, exactly."""
    policy = rc.LSTMPolicy(PENDULUM.observation_space, PENDULUM.action_space, seed=0)
    r = rc.EnvRunner("Pendulum-v1", policy, config=rc.RunnerConfig(num_envs=1, seed=0))
    good = np.array([0.3, -0.5, 0.2], np.float32)
    for eid in (100, 101):
        r.compute_single_action(good, env_id=eid)
    with pytest.raises(rc.EnvCheckError, match=r"^obs: "):
        r.compute_single_action(bad, env_id=100)
    for step in range(3):
        a = r.compute_single_action(good * step, env_id=100)
        b = r.compute_single_action(good * step, env_id=101)
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def test_compute_actions_checks_every_agent_before_any_state_changes():
    env = TurnTakingEnv()
    space = env.observation_spaces["a"]
    policies = {
        "p0": RecordingPolicy(space, env.action_spaces["a"], seed=0),
        "p1": RecordingPolicy(space, env.action_spaces["a"], seed=1),
    }
    r = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        policies,
        policy_mapping_fn=lambda agent, episode, **kw: "p0" if agent == "a" else "p1",
    )
    obs = {"a": np.array([1, 0], np.float32), "b": np.array([np.nan, 0], np.float32)}
    with pytest.raises(rc.EnvCheckError, match=r"obs\['b'\]: non-finite"):
        r.compute_actions(obs, env_id=100)
    assert not policies["p0"].calls and not policies["p1"].calls  # no policy ran


# -- evaluate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mlp", "random", "nested"])
def test_evaluate_leaves_no_trace_in_training(kind):
    a, b = runner(kind), runner(kind)
    assert_same_batches(a.sample(), b.sample())
    before = stats(a)
    records = a.evaluate(num_episodes=5)
    assert len(records) == 5
    for k, v in stats(a).items():
        np.testing.assert_array_equal(v, before[k])
    for _ in range(3):
        assert_same_batches(a.sample(), b.sample())
    train_records = a.get_metrics()
    assert train_records == b.get_metrics()
    assert set(records[0]) == set(train_records[0])
    assert all(not r["episode_faulty"] and r["episode_length"] > 0 for r in records)


def test_evaluate_does_not_explore_and_freezes_filters():
    r = runner("recording")
    r.sample()
    policy = r.policies["default_policy"]
    assert all(explore for _, explore in policy.calls)
    n = len(policy.calls)
    r.evaluate(num_episodes=3)
    assert len(policy.calls) > n
    assert all(explore is False for _, explore in policy.calls[n:])


def test_evaluate_is_a_fixed_seeded_set_of_episodes():
    r = runner()
    r.sample()
    first = [x["episode_reward"] for x in r.evaluate(num_episodes=4)]
    assert first == [x["episode_reward"] for x in r.evaluate(num_episodes=4)]


def test_evaluate_needs_an_env_it_can_rebuild():
    env = CounterEnv()
    r = rc.EnvRunner(env, rc.RandomPolicy(env.observation_space, env.action_space))
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        r.evaluate(2)
    records = r.evaluate(2, env=lambda ctx: CounterEnv(length=3))
    assert [x["episode_length"] for x in records] == [3, 3]
    with pytest.raises(ValueError, match="num_episodes"):
        r.evaluate(0, env=lambda ctx: CounterEnv())


class Halve(rc.ObservationConnector):
    """An unregistered connector: evaluation copies its pipeline object instead."""

    def transform(self, value):
        return value * 0.5


def test_evaluate_copies_pipelines_with_unregistered_connectors():
    def make():
        policy = RecordingPolicy(CARTPOLE.observation_space, CARTPOLE.action_space, seed=0)
        config = rc.RunnerConfig(rollout_fragment_length=10, seed=0)
        return rc.EnvRunner(
            "CartPole-v1",
            policy,
            config=config,
            agent_pipelines={
                "default_policy": lambda ctx: rc.AgentConnectorPipeline(
                    ctx, [Halve(ctx), rc.MeanStdFilter(ctx)]
                )
            },
        )

    a, b = make(), make()
    assert_same_batches(a.sample(), b.sample())
    before = stats(a)
    n = len(a.policies["default_policy"].calls)
    assert len(a.evaluate(num_episodes=2)) == 2
    assert len(a.policies["default_policy"].calls) > n
    for k, v in stats(a).items():
        np.testing.assert_array_equal(v, before[k])
    assert a.agent_pipeline().is_training
    assert_same_batches(a.sample(), b.sample())
