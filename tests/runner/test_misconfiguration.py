"""Misconfigurations a runner refuses when it is built (or at the step that shows them),
with an error naming what is wrong and the fix, never silently (issue 55)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from cases import TurnTakingEnv

import rlconnect as rc

CARTPOLE = gym.make("CartPole-v1")
OBS, ACT = CARTPOLE.observation_space, CARTPOLE.action_space
FRAG = rc.RunnerConfig(rollout_fragment_length=5, seed=0)


def two_policies() -> dict[str, rc.Policy]:
    return {"attacker": rc.RandomPolicy(OBS, ACT), "defender": rc.RandomPolicy(OBS, ACT)}


@pytest.mark.parametrize("kind", ["agent_pipelines", "action_pipelines", "learner_pipelines"])
def test_pipelines_keyed_by_a_misspelled_policy_id_are_refused(kind):
    """Before, an agent or action pipeline for ``'atacker'`` was ignored, silently."""
    pipe = {
        "agent_pipelines": lambda ctx: rc.AgentConnectorPipeline(ctx, []),
        "action_pipelines": lambda ctx: rc.ActionConnectorPipeline(ctx, []),
        "learner_pipelines": [],
    }[kind]
    with pytest.raises(ValueError) as info:
        rc.EnvRunner(
            "CartPole-v1",
            two_policies(),
            policy_mapping_fn=lambda agent, episode, **kw: "attacker",
            config=FRAG,
            **{kind: {"atacker": pipe}},
        )
    msg = str(info.value)
    assert f"{kind} has an entry for policy id 'atacker'" in msg
    assert "did you mean 'attacker'?" in msg and "['attacker', 'defender']" in msg


@pytest.mark.parametrize("policies", [two_policies(), {"attacker": rc.RandomPolicy(OBS, ACT)}])
def test_a_mapping_to_an_unknown_policy_id_is_a_named_error(policies):
    """Before: a bare ``KeyError: 'atacker'`` from the kernel with two policies, and with
    one policy every agent went to it, whatever the function returned."""
    runner = rc.EnvRunner(
        "CartPole-v1", policies, policy_mapping_fn=lambda a, ep, **kw: "atacker", config=FRAG
    )
    with pytest.raises(ValueError) as info:
        runner.sample()
    assert not isinstance(info.value, KeyError)
    msg = str(info.value)
    assert "mapped agent 'agent0' to policy id 'atacker'" in msg
    assert f"{list(policies)}" in msg and "did you mean 'attacker'?" in msg


def test_a_multi_agent_mapping_to_an_unknown_id_names_the_agent():
    env = TurnTakingEnv()
    space, act = env.observation_spaces["a"], env.action_spaces["a"]
    policies = {"pa": rc.RandomPolicy(space, act), "pb": rc.RandomPolicy(space, act)}
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        policies,
        lambda agent, episode, **kw: "pa" if agent == "a" else "pc",
        config=FRAG,
    )
    with pytest.raises(ValueError, match=r"mapped agent '\w' to policy id 'pc'.*'pa', 'pb'"):
        runner.sample()


@pytest.mark.parametrize(
    "policy_space",
    [
        gym.spaces.Box(-1.0, 1.0, (2,), np.float32),  # Box policy, Discrete env
        gym.spaces.Discrete(3),  # another size
        gym.spaces.MultiDiscrete([2]),
    ],
)
def test_a_policy_acting_in_another_space_than_the_env_is_refused_at_construction(
    policy_space,
):
    """Before, a Box-action policy on CartPole was accepted until the first sample()."""
    policy = rc.MLPPolicy(OBS, policy_space, seed=0)
    with pytest.raises(ValueError) as info:
        rc.EnvRunner("CartPole-v1", policy, config=FRAG)
    msg = str(info.value)
    assert "policy 'default_policy' (MLPPolicy) acts in" in msg
    assert "take Discrete(2)" in msg and "action_pipelines" in msg


def test_box_bounds_may_differ_and_a_given_action_pipeline_may_map_between_spaces():
    """The default chain unsquashes a [-1, 1] policy into the env's bounds; a user's own
    action pipeline takes the responsibility of mapping other spaces."""
    pendulum = gym.make("Pendulum-v1")
    policy = rc.MLPPolicy(pendulum.observation_space, gym.spaces.Box(-1, 1, (1,)), seed=0)
    assert len(rc.EnvRunner("Pendulum-v1", policy, config=FRAG).sample()) == 5
    rc.register_lambda("issue55_to_index", lambda a: (np.asarray(a)[:, 0] > 0).astype(np.int64))
    box = rc.MLPPolicy(OBS, gym.spaces.Box(-1.0, 1.0, (1,), np.float32), seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1",
        box,
        config=FRAG,
        action_pipelines={
            "default_policy": lambda ctx: rc.ActionConnectorPipeline(
                ctx, [rc.get_connector("ActionLambda", ctx, {"fn": "issue55_to_index"})]
            )
        },
    )
    assert len(runner.sample()) == 5


class Doubled(rc.AgentConnector):
    """A user connector that emits twice the features it declares (its bug)."""

    def __call__(self, data: rc.AgentData) -> rc.AgentData:
        data["obs"] = np.concatenate([data["obs"], data["obs"]], axis=1)
        return data


def test_a_connector_emitting_the_wrong_shape_is_blamed_not_the_policy():
    """Before: ``PolicyError: policy 'default_policy' (MLPPolicy) raised ValueError: obs
    rows have 8 elements, expected 4``: the policy was blamed for a connector's bug."""
    rc.register_connector("Issue55Doubled", Doubled, override=True)
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(OBS, ACT, seed=0),
        config=FRAG,
        agent_pipelines={
            "default_policy": lambda ctx: rc.AgentConnectorPipeline(ctx, [Doubled(ctx)])
        },
    )
    with pytest.raises(ValueError) as info:
        runner.sample()
    assert not isinstance(info.value, rc.PolicyError)
    msg = str(info.value)
    assert msg.startswith("connector 'Issue55Doubled' in the agent pipeline of policy")
    assert "shape (8,)" in msg and "declares (4,)" in msg and "output_space()" in msg
