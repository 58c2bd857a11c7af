"""Edits of a pipeline that feeds a policy: refused where they are made, whatever the edit
method, with the pipeline left as it was; ``editing()`` checks edits that only fit together."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


class Walk(gym.Env):
    observation_space, action_space = OBS, ACT

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(3, 0.1 * self.t, np.float32), 1.0, self.t >= 5, False, {}


@pytest.fixture
def runner():
    r = rc.EnvRunner(
        lambda ctx: Walk(),
        rc.RandomPolicy(OBS, ACT),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=4, seed=0),
    )
    r.agent_pipeline().append(rc.ClipReward(r.agent_pipeline().ctx, limit=1.0))
    yield r
    r.stop()


def _stack(pipe):
    return rc.FrameStack(pipe.ctx, num_frames=2)


EDITS = {
    "append": lambda p: p.append(_stack(p)),
    "prepend": lambda p: p.prepend(_stack(p)),
    "insert_before": lambda p: p.insert_before("ClipReward", _stack(p)),
    "insert_after": lambda p: p.insert_after("ClipReward", _stack(p)),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_that_changes_the_policy_input_is_refused_and_changes_nothing(runner, edit):
    pipe = runner.agent_pipeline()
    with pytest.raises(ValueError) as err:
        EDITS[edit](pipe)
    msg = str(err.value)
    assert edit in msg and "'FrameStack'" in msg
    assert "(2, 3), float32)" in msg and "(3,), float32)" in msg
    assert "policy 'default_policy'" in msg
    assert pipe.names == ["ClipReward"] and pipe.output_space.shape == (3,)
    assert runner.sample()["obs"].shape == (8, 3)  # the runner samples on


def test_a_removal_that_changes_the_policy_input_is_refused():
    big = gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32)
    r = rc.EnvRunner(
        lambda ctx: Walk(),
        rc.RandomPolicy(big, ACT),
        config=rc.RunnerConfig(num_envs=1, rollout_fragment_length=4),
        agent_pipelines={
            "default_policy": lambda ctx: rc.AgentConnectorPipeline(
                ctx, [rc.FrameStack(ctx, num_frames=2)]
            )
        },
    )
    pipe = r.agent_pipeline()
    with pytest.raises(ValueError, match=r"remove of connector 'FrameStack' refused.*\(3,\)"):
        pipe.remove("FrameStack")
    assert pipe.names == ["FrameStack"]
    r.stop()


def test_edits_that_fit_together_pass_inside_editing(runner):
    pipe = runner.agent_pipeline()
    with pipe.editing():
        pipe.remove("ClipReward")
        pipe.append(_stack(pipe))  # does not fit alone ...
        pipe.remove("FrameStack")  # ... but the block's result does
        pipe.append(rc.ClipReward(pipe.ctx, limit=2.0))
    assert pipe.names == ["ClipReward"] and pipe["ClipReward"].limit == 2.0
    assert len(runner.sample()) == 8


def _swap_for_a_stack(pipe):
    with pipe.editing():
        pipe.remove("ClipReward")
        pipe.append(_stack(pipe))


def _remove_then_fail(pipe):
    with pipe.editing():
        pipe.remove("ClipReward")
        pipe["missing"]


def test_a_block_whose_result_does_not_fit_is_undone_whole(runner):
    pipe = runner.agent_pipeline()
    before = pipe["ClipReward"]
    with pytest.raises(ValueError, match="remove of connector 'ClipReward', append of"):
        _swap_for_a_stack(pipe)
    assert pipe.names == ["ClipReward"] and pipe["ClipReward"] is before
    assert pipe.output_space.shape == (3,)
    with pytest.raises(KeyError):  # an error inside the block also undoes it
        _remove_then_fail(pipe)
    assert pipe.names == ["ClipReward"]


def test_a_pipeline_that_feeds_nothing_takes_any_edit_that_chains():
    ctx = rc.ConnectorContext(OBS, ACT)
    pipe = rc.AgentConnectorPipeline(ctx, [])
    pipe.append(rc.FrameStack(ctx, num_frames=2))
    assert pipe.output_space.shape == (2, 3)
    pipe.feeds("a learner", pipe.output_space)
    with pytest.raises(ValueError, match="a learner takes"):
        pipe.remove("FrameStack")
    pipe.feeds(None)
    pipe.remove("FrameStack")
    assert pipe.names == []


USER_PROGRAM = """
import gymnasium as gym
import rlconnect as rc

env = gym.make("CartPole-v1")
runner = rc.EnvRunner("CartPole-v1", rc.MLPPolicy(env.observation_space, env.action_space))
pipe = runner.agent_pipeline()
try:
    pipe.append(rc.FrameStack(pipe.ctx, num_frames=4))
except ValueError as err:
    print("refused:", err)
print("members:", pipe.names, "batch:", len(runner.sample()))
"""


def test_a_user_program_sees_the_edit_refused_where_it_is_made(tmp_path):
    """The program a newcomer writes from the docs, run as they run it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "prog.py").write_text(USER_PROGRAM)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "prog.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    refused, members = done.stdout.splitlines()
    assert refused.startswith("refused: append of connector 'FrameStack' refused")
    assert "(4, 4), float32)" in refused and "policy 'default_policy' takes" in refused
    assert "(4,), float32)" in refused
    assert members == "members: [] batch: 200"


class ToOneHot(rc.ActionConnector):
    """Declares one-hot actions (its output space is all this test needs)."""

    def output_space(self, input_space):
        return gym.spaces.MultiBinary(int(input_space.n))


def test_action_pipelines_and_restored_pipelines_stay_checked(runner, tmp_path):
    act = runner.action_pipeline()
    with pytest.raises(
        ValueError, match=r"'ToOneHot' refused.*the env of policy 'default_policy' takes"
    ):
        act.append(ToOneHot(act.ctx))
    assert "ToOneHot" not in act.names
    runner.save_checkpoint(tmp_path / "ck")
    runner.restore(tmp_path / "ck")
    for pipe in (
        runner.pipelines.agent["default_policy"],
        runner.pipelines.action["default_policy"],
    ):
        assert pipe.consumer is not None
    with pytest.raises(ValueError, match="refused"):
        runner.pipelines.agent["default_policy"].append(_stack(runner.agent_pipeline()))
