"""export_policy / load_policy: one file, the same actions as the runner, sessions, threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest
from deploy_cases import TinyRecurrentPolicy, assert_same_action, play, trained_runner

import rlconnect as rc


@pytest.fixture(scope="module")
def cartpole() -> rc.EnvRunner:
    return trained_runner(observation_filter="MeanStdFilter")


def test_cartpole_with_learned_statistics_acts_like_the_runner(cartpole, tmp_path):
    path = tmp_path / "cartpole.policy"
    size = rc.export_policy(cartpole, path)
    assert os.path.getsize(path) == size and os.listdir(tmp_path) == ["cartpole.policy"]
    deployed = rc.load_policy(path)
    assert deployed.policy_id == "default_policy"
    assert deployed.observation_space == gym.make("CartPole-v1").observation_space
    assert deployed.action_space == gym.spaces.Discrete(2)
    filt = deployed.agent_pipeline["MeanStdFilter"]
    live = cartpole.agent_pipeline()["MeanStdFilter"]
    assert filt.count == live.count > 0 and not filt.is_training
    np.testing.assert_array_equal(filt.mean, live.mean)
    assert play(cartpole, deployed, "CartPole-v1", episodes=3) >= 15
    assert deployed.sessions == []


def test_negative_control_fresh_statistics_change_the_actions(cartpole, tmp_path):
    """Without the learned statistics (a fresh filter) the actions differ: the file
    really carries the statistics that make them equal."""
    rc.export_policy(cartpole, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    deployed.agent_pipeline["MeanStdFilter"].set_statistics(
        {"count": np.zeros(()), "mean": np.zeros(4), "m2": np.zeros(4)}
    )
    obs = np.random.default_rng(0).normal(0, 0.3, (200, 4)).astype(np.float32)
    ours = deployed.compute_actions(list(obs))
    runner = [cartpole.compute_single_action(o) for o in obs]
    assert ours != runner


def test_batches_and_no_session_calls(cartpole, tmp_path):
    rc.export_policy(cartpole, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    obs = np.random.default_rng(1).normal(0, 0.3, (7, 4)).astype(np.float32)
    expected = [cartpole.compute_single_action(o) for o in obs]
    assert deployed.compute_actions(obs) == expected  # a stacked batch
    assert deployed.compute_actions(list(obs), sessions=list("abcdefg")) == expected
    assert [deployed.compute_action(o) for o in obs] == expected
    assert sorted(deployed.sessions) == list("abcdefg")
    mixed = deployed.compute_actions(obs[:3], sessions=[None, "h", None])
    assert mixed == expected[:3] and "h" in deployed.sessions and None not in deployed.sessions
    with pytest.raises(ValueError, match="more than once"):
        deployed.compute_actions(obs[:2], sessions=["x", "x"])
    assert "x" not in deployed.sessions


def test_frame_stack_previous_actions_and_continuous_actions(tmp_path):
    """Pendulum: FrameStack and PrevActionsRewards keep per-session state, and the Box
    actions (unsquashed into the bounds) are equal bit for bit."""

    def agent_pipeline(ctx):
        return rc.AgentConnectorPipeline(
            ctx,
            [rc.MeanStdFilter(ctx), rc.PrevActionsRewards(ctx), rc.FrameStack(ctx, num_frames=3)],
        )

    env = gym.make("Pendulum-v1")
    policy = rc.MLPPolicy(
        gym.spaces.Box(-np.inf, np.inf, (3, 3), np.float32), env.action_space, seed=0
    )
    runner = rc.EnvRunner(
        "Pendulum-v1",
        policy,
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=30, seed=0),
        agent_pipelines={"default_policy": agent_pipeline},
    )
    runner.sample()
    rc.export_policy(runner, tmp_path / "pendulum.policy")
    deployed = rc.load_policy(tmp_path / "pendulum.policy")
    assert deployed.agent_pipeline.names == ["MeanStdFilter", "PrevActionsRewards", "FrameStack"]
    assert play(runner, deployed, "Pendulum-v1", max_steps=40) == 80
    # a session keeps its frames: the second call of a session differs from a fresh start
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    first = deployed.compute_action(obs * 0, session="s")
    again = deployed.compute_action(obs, session="s")
    fresh = deployed.compute_action(obs)
    assert first.dtype == np.float32 and not np.array_equal(again, fresh)


def test_recurrent_policy_over_whole_episodes(tmp_path):
    runner = trained_runner(policy="rnn", observation_filter="MeanStdFilter")
    assert runner.agent_pipeline().names == ["MeanStdFilter", "StateBuffer"]
    rc.export_policy(runner, tmp_path / "rnn.policy")
    deployed = rc.load_policy(tmp_path / "rnn.policy")
    assert isinstance(deployed.policy, TinyRecurrentPolicy)
    assert play(runner, deployed, "CartPole-v1", episodes=3, max_steps=60) >= 15
    # the RNN state is carried by the session: a fresh call per step gives other actions
    obs = np.random.default_rng(2).normal(0, 0.5, (40, 4)).astype(np.float32)
    carried = [deployed.compute_action(o, session="s") for o in obs]
    fresh = [deployed.compute_action(o) for o in obs]
    assert carried != fresh


@pytest.mark.parametrize("kind", ["lstm", "lstm_vf"])
def test_lstm_policy_over_whole_episodes_from_a_checkpoint(kind, tmp_path):
    """The built-in LSTMPolicy (state [h, c]) rebuilt from its spec, value head included."""
    runner = trained_runner(policy=kind, observation_filter="MeanStdFilter", samples=1)
    runner.save_checkpoint(tmp_path / "ck")
    rc.export_policy(tmp_path / "ck", tmp_path / "lstm.policy")
    deployed = rc.load_policy(tmp_path / "lstm.policy")
    assert isinstance(deployed.policy, rc.LSTMPolicy)
    saved = {k: v for k, v in runner.policies["default_policy"].get_config().items() if k != "seed"}
    assert {k: deployed.policy.get_config()[k] for k in saved} == saved  # seed: load's own
    assert play(runner, deployed, "CartPole-v1", episodes=3, max_steps=60) >= 15


def test_several_policies(tmp_path):
    from deploy_cases import policy_space

    env = gym.make("CartPole-v1")
    policies = {
        pid: rc.MLPPolicy(policy_space(env), env.action_space, seed=i, hiddens=(8,))
        for i, pid in enumerate(("a", "b"))
    }
    runner = rc.EnvRunner(
        "CartPole-v1",
        policies,
        policy_mapping_fn=lambda agent_id, episode, **kw: "a",
        config=rc.RunnerConfig(num_envs=1, rollout_fragment_length=20, seed=0),
    )
    runner.sample()
    for pid in ("a", "b"):
        rc.export_policy(runner, tmp_path / pid, policy_id=pid)
        deployed = rc.load_policy(tmp_path / pid)
        assert deployed.policy_id == pid
        play(runner, deployed, "CartPole-v1", episodes=1, max_steps=30, policy_id=pid)
    with pytest.raises(KeyError, match=r"'c'.*\['a', 'b'\]"):
        rc.export_policy(runner, tmp_path / "c", policy_id="c")
    assert not (tmp_path / "c").exists()


def test_from_a_checkpoint_a_run_folder_and_a_group(cartpole, tmp_path):
    rc.export_policy(cartpole, tmp_path / "live")
    cartpole.save_checkpoint(tmp_path / "ck")
    os.makedirs(tmp_path / "run")
    cartpole.save_checkpoint(tmp_path / "run" / "checkpoint")
    rc.export_policy(tmp_path / "ck", tmp_path / "from_ck")
    rc.export_policy(str(tmp_path / "run"), tmp_path / "from_run")
    live = content_digest(tmp_path / "live")
    assert content_digest(tmp_path / "from_ck") == live
    assert content_digest(tmp_path / "from_run") == live
    group = rc.RunnerGroup("CartPole-v1", cartpole.policies["default_policy"], num_runners=0)
    rc.export_policy(group, tmp_path / "from_group")
    assert rc.load_policy(tmp_path / "from_group").policy_id == "default_policy"
    with pytest.raises(FileNotFoundError, match="neither a runner checkpoint"):
        rc.export_policy(tmp_path, tmp_path / "x")


def content_digest(path) -> str:
    """The SHA-256 over a file's content (format, structure, arrays), from its header: the
    bytes themselves may order the header's keys differently."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return header["__metadata__"]["sha256"]


def test_explore_uses_the_deployed_policys_own_seeded_generator(cartpole, tmp_path):
    rc.export_policy(cartpole, tmp_path / "p")
    obs = np.random.default_rng(4).normal(0, 0.3, (64, 4)).astype(np.float32)
    a = rc.load_policy(tmp_path / "p", seed=5).compute_actions(obs, explore=True)
    b = rc.load_policy(tmp_path / "p", seed=5).compute_actions(obs, explore=True)
    c = rc.load_policy(tmp_path / "p", seed=6).compute_actions(obs, explore=True)
    mode = rc.load_policy(tmp_path / "p", seed=5).compute_actions(obs)
    assert a == b and a != c and a != mode


def test_threads_with_different_sessions_get_what_one_thread_gets(tmp_path):
    runner = trained_runner(policy="rnn", observation_filter="MeanStdFilter", samples=1)
    rc.export_policy(runner, tmp_path / "rnn")
    obs = np.random.default_rng(5).normal(0, 0.5, (8, 50, 4)).astype(np.float32)
    solo = rc.load_policy(tmp_path / "rnn")
    expected = [[solo.compute_action(o, session=s) for o in obs[s]] for s in range(8)]
    shared = rc.load_policy(tmp_path / "rnn")
    got: dict[int, list] = {}

    def serve(s: int) -> None:
        got[s] = [shared.compute_action(o, session=s) for o in obs[s]]

    threads = [threading.Thread(target=serve, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [got[s] for s in range(8)] == expected


def test_rewards_reach_prev_rewards_and_a_failed_call_changes_no_session(tmp_path):
    env = gym.make("CartPole-v1")
    stacked = gym.spaces.Box(-np.inf, np.inf, (2, 4), np.float32)
    policy = rc.MLPPolicy(stacked, env.action_space, seed=0)
    runner = rc.EnvRunner(
        "CartPole-v1",
        policy,
        agent_pipelines={
            "default_policy": lambda ctx: rc.AgentConnectorPipeline(
                ctx, [rc.PrevActionsRewards(ctx), rc.FrameStack(ctx, num_frames=2)]
            )
        },
        config=rc.RunnerConfig(num_envs=1, seed=0),
    )
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    seen = []
    deployed.agent_pipeline.append(_Spy(deployed.agent_pipeline.ctx, seen))
    obs = np.zeros(4, np.float32)
    deployed.compute_action(obs, session="s", reward=5.0)
    deployed.compute_action(obs + 0.1, session="s", reward=2.5)
    assert [float(r[0]) for r in seen] == [0.0, 2.5]  # ignored at the session's first call
    frames = deployed.agent_pipeline["FrameStack"]._slots["frames"].copy()
    for bad in (np.full(4, np.nan, np.float32), np.zeros(5, np.float32), "text"):
        with pytest.raises(rc.EnvCheckError, match="obs"):
            deployed.compute_action(bad, session="s")
        with pytest.raises(rc.EnvCheckError, match="obs"):
            deployed.compute_action(bad, session="new")
    with pytest.raises(rc.EnvCheckError, match="reward"):
        deployed.compute_action(obs, session="s", reward=float("inf"))
    np.testing.assert_array_equal(deployed.agent_pipeline["FrameStack"]._slots["frames"], frames)
    assert deployed.sessions == ["s"] and len(seen) == 2


class _Spy(rc.AgentConnector):
    """Records the prev_rewards column it sees (test only; never saved)."""

    def __init__(self, ctx, seen):
        super().__init__(ctx)
        self.seen = seen

    def __call__(self, data):
        self.seen.append(np.array(data["prev_rewards"]))
        return data


def test_wrong_observations_name_the_field(tmp_path):
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "mode": gym.spaces.Discrete(3)}
    )
    flat = gym.spaces.Box(0, 1, (5,), np.float32)
    policy = rc.RandomPolicy(flat, gym.spaces.Discrete(2), seed=0)
    env = _DictEnv(space)
    runner = rc.EnvRunner(lambda ctx: env, policy, config=rc.RunnerConfig(num_envs=1))
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    good = {"pos": np.zeros(2, np.float32), "mode": 1}
    assert deployed.compute_action(good) in (0, 1)
    cases = {
        "obs\\['pos'\\].*shape": {"pos": np.zeros(3, np.float32), "mode": 1},
        "obs\\['pos'\\].*non-finite": {"pos": np.array([0, np.nan], np.float32), "mode": 1},
        "obs\\['mode'\\].*cannot be cast": {"pos": np.zeros(2, np.float32), "mode": 1.0},
        "obs\\['mode'\\].*outside": {"pos": np.zeros(2, np.float32), "mode": 7},
        "obs.*keys differ": {"pos": np.zeros(2, np.float32)},
        "obs.*expected a dict": np.zeros(2),
        "obs\\['pos'\\].*cannot be cast": {"pos": np.array(["a", "b"]), "mode": 1},
    }
    for pattern, obs in cases.items():
        with pytest.raises(rc.EnvCheckError, match=pattern):
            deployed.compute_action(obs)


class _DictEnv(gym.Env):
    def __init__(self, space):
        self.observation_space, self.action_space = space, gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


def test_loading_imports_no_ray_ale_envpool_and_torch_only_for_torch_policies(tmp_path):
    env = gym.make("CartPole-v1")
    random_runner = rc.EnvRunner(
        "CartPole-v1", rc.RandomPolicy(env.observation_space, env.action_space)
    )
    rc.export_policy(random_runner, tmp_path / "random")
    rc.export_policy(trained_runner(samples=0), tmp_path / "mlp")
    code = (
        "import sys, numpy as np, rlconnect as rc\n"
        "p = rc.load_policy(sys.argv[1])\n"
        "p.compute_action(np.zeros(4, np.float32), session=1)\n"
        "print(sorted(m for m in ('torch', 'ray', 'ale_py', 'envpool') if m in sys.modules))\n"
    )
    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = {
        name: subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=env_vars,
            check=True,
        ).stdout.strip()
        for name in ("random", "mlp")
    }
    assert out == {"random": "[]", "mlp": "['torch']"}


def test_an_unregistered_torch_policy_raises_export_error_and_writes_nothing(tmp_path):
    import torch

    env = gym.make("CartPole-v1")
    policy = rc.TorchPolicy(torch.nn.Linear(4, 2), env.observation_space, env.action_space)
    runner = rc.EnvRunner("CartPole-v1", policy)
    with pytest.raises(rc.ExportError, match=r"register_policy.*export_onnx"):
        rc.export_policy(runner, tmp_path / "p")
    assert os.listdir(tmp_path) == []


def test_same_actions_after_restore_into_a_fresh_runner(cartpole, tmp_path):
    """A runner rebuilt from the checkpoint and the deployed file agree (negative control:
    the untrained runner does not)."""
    cartpole.save_checkpoint(tmp_path / "ck")
    rc.export_policy(tmp_path / "ck", tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    rebuilt = rc.EnvRunner.from_checkpoint(tmp_path / "ck", env="CartPole-v1")
    obs = np.random.default_rng(6).normal(0, 0.3, (100, 4)).astype(np.float32)
    assert deployed.compute_actions(obs) == [rebuilt.compute_single_action(o) for o in obs]
    for a, b in zip(deployed.compute_actions(obs[:3]), obs[:3]):
        assert_same_action(a, rebuilt.compute_single_action(b))
