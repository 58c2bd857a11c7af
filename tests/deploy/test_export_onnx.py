"""export_onnx: one ONNX model, connectors and states included, run with onnxruntime over
whole episodes against the deployed policy."""

from __future__ import annotations

import copy
import json
import os
import types

import gymnasium as gym
import numpy as np
import onnx
import pytest
import torch
from deploy_cases import OnnxEpisodes, play_onnx, trained_runner

import rlconnect as rc
from rlconnect.deploy.onnx_file import describe_onnx_file
from rlconnect.deploy.onnx_forms import BUILTIN_FORMS, ConnectorForm


def test_cartpole_mlp_with_mean_std_filter(tmp_path):
    runner = trained_runner(observation_filter="MeanStdFilter")
    interface = rc.export_onnx(runner, tmp_path / "m.onnx")
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    assert play_onnx(deployed, tmp_path / "m.onnx", "CartPole-v1", episodes=3) >= 15
    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    stored = json.loads(meta["rlconnect"])
    assert stored == json.loads(json.dumps(interface))
    assert set(stored) >= {"inputs", "outputs", "observation_space", "action_space"}
    assert stored["inputs"] == [
        {
            "name": "obs",
            "shape": ["batch", 4],
            "dtype": "float32",
            "meaning": "the raw observation from the env",
            "initial": None,
        }
    ]
    assert [(o["name"], o["dtype"]) for o in stored["outputs"]] == [("actions", "int64")]
    assert rc.spaces.space_from_json(stored["observation_space"]) == deployed.observation_space


def test_pendulum_with_frames_previous_actions_rewards_and_clipping(tmp_path):
    def agent_pipeline(ctx):
        return rc.AgentConnectorPipeline(
            ctx,
            [
                rc.MeanStdFilter(ctx),
                rc.ClipReward(ctx, limit=1.0),
                rc.PrevActionsRewards(ctx),
                rc.FrameStack(ctx, num_frames=3),
            ],
        )

    env = gym.make("Pendulum-v1")
    space = gym.spaces.Box(-np.inf, np.inf, (3, 3), np.float32)
    runner = rc.EnvRunner(
        "Pendulum-v1",
        rc.MLPPolicy(space, env.action_space, seed=0),
        config=rc.RunnerConfig(num_envs=1, rollout_fragment_length=30, seed=0, clip_actions=True),
        agent_pipelines={"default_policy": agent_pipeline},
    )
    runner.sample()
    interface = rc.export_onnx(runner, tmp_path / "m.onnx")
    names = [(i["name"], i["dtype"], i["shape"]) for i in interface["inputs"]]
    assert names == [
        ("obs", "float32", ["batch", 3]),
        ("state_in_0", "float32", ["batch"]),  # the reward
        ("state_in_1", "float32", ["batch", 1]),  # the previous action
        ("state_in_2", "bool", ["batch"]),
        ("state_in_3", "float32", ["batch", 3, 3]),  # the frames
        ("state_in_4", "bool", ["batch"]),
    ]
    assert [o["name"] for o in interface["outputs"]] == ["actions"] + [
        f"state_out_{i}" for i in range(5)
    ]
    assert interface["inputs"][2]["initial"] == [0.0]
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    assert play_onnx(deployed, tmp_path / "m.onnx", "Pendulum-v1", rewards=True) == 120


def test_recurrent_model_state_over_whole_episodes(tmp_path):
    runner = trained_runner(policy="rnn", observation_filter="MeanStdFilter", samples=1)
    interface = rc.export_onnx(runner, tmp_path / "m.onnx")
    states = [i for i in interface["inputs"] if i["name"].startswith("state_in")]
    assert [(s["shape"], s["initial"][0]) for s in states] == [
        (["batch", 8], 0.0),
        (["batch", 8], 0.5),
    ]
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    assert play_onnx(deployed, tmp_path / "m.onnx", "CartPole-v1", episodes=3) >= 15


@pytest.mark.parametrize("kind", ["lstm", "lstm_vf"])
def test_lstm_policy_with_explicit_state(kind, tmp_path):
    runner = trained_runner(policy=kind, observation_filter="MeanStdFilter", samples=1)
    interface = rc.export_onnx(runner, tmp_path / "m.onnx")
    states = [i for i in interface["inputs"] if i["name"].startswith("state_in")]
    assert [(s["shape"], s["dtype"]) for s in states] == [(["batch", 8], "float32")] * 2
    assert all(s["initial"] == [0.0] * 8 for s in states)  # [h, c] zeros at the start
    rc.export_policy(runner, tmp_path / "p")
    deployed = rc.load_policy(tmp_path / "p")
    assert play_onnx(deployed, tmp_path / "m.onnx", "CartPole-v1", episodes=3) >= 15


def _source(obs_space, action_space, agent, action=None, policy=None):
    """A minimal export source: one policy and its two pipelines."""
    ctx = rc.ConnectorContext(obs_space, action_space, is_training=False)
    agent_pipe = rc.AgentConnectorPipeline(ctx, [cls(ctx, **kw) for cls, kw in agent])
    out = agent_pipe.output_space
    policy = policy or rc.MLPPolicy(out, action_space, seed=1, hiddens=(16,))
    ctx.initial_states = policy.get_initial_state()
    agent_pipe = rc.AgentConnectorPipeline(ctx, [cls(ctx, **kw) for cls, kw in agent])
    action_ctx = rc.ConnectorContext(obs_space, action_space, is_training=False)
    action_pipe = rc.ActionConnectorPipeline(
        action_ctx, [cls(action_ctx, **kw) for cls, kw in (action or [])]
    )
    return types.SimpleNamespace(
        policies={"default_policy": policy},
        agent_pipeline=lambda pid="default_policy": agent_pipe,
        action_pipeline=lambda pid="default_policy": action_pipe,
    )


IMAGE = gym.spaces.Box(0, 255, (12, 10, 3), np.uint8)
FLOAT_IMAGE = gym.spaces.Box(0.0, 1.0, (12, 10, 3), np.float32)
VECTOR = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
MOVE = gym.spaces.Box(-2.0, 1.0, (2,), np.float32)

# one case per built-in connector with an ONNX form: (obs space, agent, action members)
CASES = {
    "FlattenObservations-Discrete": (
        gym.spaces.Discrete(5, start=2),
        [(rc.FlattenObservations, {})],
        [],
    ),
    "FlattenObservations-MultiDiscrete": (
        gym.spaces.MultiDiscrete([3, 4]),
        [(rc.FlattenObservations, {})],
        [],
    ),
    "FlattenObservations-MultiBinary": (
        gym.spaces.MultiBinary(4),
        [(rc.FlattenObservations, {})],
        [],
    ),
    "FlattenObservations-Box": (gym.spaces.Box(-1, 1, (2, 3)), [(rc.FlattenObservations, {})], []),
    "MeanStdFilter": (VECTOR, [(rc.MeanStdFilter, {"clip": 1.5})], []),
    "ClipReward": (VECTOR, [(rc.ClipReward, {}), (rc.PrevActionsRewards, {})], []),
    "FrameStack": (VECTOR, [(rc.FrameStack, {"num_frames": 3})], []),
    "PrevActionsRewards": (VECTOR, [(rc.PrevActionsRewards, {})], []),
    "Grayscale": (IMAGE, [(rc.Grayscale, {})], []),
    "ScalePixels": (IMAGE, [(rc.ScalePixels, {})], []),
    "CropObservations": (IMAGE, [(rc.CropObservations, {"top": 2, "left": 1, "right": 3})], []),
    "TransposeImage": (IMAGE, [(rc.TransposeImage, {})], []),
    "Resize": (FLOAT_IMAGE, [(rc.Resize, {"height": 5, "width": 4})], []),
    "ConvertToNumpy": (VECTOR, [], [(rc.ConvertToNumpy, {})]),
    "ImmutableActions": (VECTOR, [], [(rc.ImmutableActions, {})]),
    "UnsquashActions": (VECTOR, [], [(rc.UnsquashActions, {})]),
    "ClipActions": (VECTOR, [], [(rc.ClipActions, {})]),
}


def test_every_builtin_form_has_a_round_trip_case():
    covered = {cls for _, agent, action in CASES.values() for cls, _ in agent + action}
    assert set(BUILTIN_FORMS) - covered == {rc.StateBuffer}  # the recurrent tests cover it


@pytest.mark.parametrize("case", sorted(CASES))
def test_connector_round_trip(case, tmp_path):
    obs_space, agent, action = CASES[case]
    src = _source(obs_space, MOVE, agent, action)
    for c in src.agent_pipeline():
        if isinstance(c, rc.MeanStdFilter):  # statistics that change the output
            c.set_statistics(
                {"count": np.float64(10), "mean": np.full(3, 0.5), "m2": np.full(3, 2.5)}
            )
    rc.export_onnx(src, tmp_path / "m.onnx")
    rc.export_policy(src, tmp_path / "p")
    deployed, model = rc.load_policy(tmp_path / "p"), OnnxEpisodes(tmp_path / "m.onnx")
    obs_space.seed(3)
    rng = np.random.default_rng(3)
    for _ in range(12):
        obs = obs_space.sample()
        reward = float(rng.normal())
        want = deployed.compute_action(obs, session="s", reward=reward)
        got = model.act(obs, reward)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_members_without_an_onnx_form_raise_export_error_naming_them(tmp_path):
    rc.register_lambda("double_for_onnx_test", lambda x: x * 2)
    src = _source(VECTOR, MOVE, [(rc.AgentLambda, {"fn": "double_for_onnx_test"})])
    with pytest.raises(rc.ExportError, match=r"'AgentLambda'.*onnx_form"):
        rc.export_onnx(src, tmp_path / "m.onnx")
    src = _source(
        VECTOR, gym.spaces.Discrete(2), [], policy=rc.RandomPolicy(VECTOR, gym.spaces.Discrete(2))
    )
    with pytest.raises(rc.ExportError, match="RandomPolicy"):
        rc.export_onnx(src, tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


@rc.register_connector("ShiftForOnnxTest")
class Shift(rc.ObservationConnector):
    """A user connector with its own ONNX form."""

    def __init__(self, ctx, by: float = 1.0):
        super().__init__(ctx, by=by)
        self.by = by

    def transform(self, value):
        return np.asarray(value, np.float32) + np.float32(self.by)

    def onnx_form(self) -> ConnectorForm:
        by = self.by

        class ShiftForm(ConnectorForm):
            def forward(self, cols, states):
                return {**cols, "obs": cols["obs"].to(torch.float32) + by}, states

        return ShiftForm()


def test_a_user_connector_supplies_its_onnx_form(tmp_path):
    src = _source(VECTOR, MOVE, [(Shift, {"by": 0.25}), (rc.MeanStdFilter, {})])
    rc.export_onnx(src, tmp_path / "m.onnx")
    rc.export_policy(src, tmp_path / "p")
    deployed, model = rc.load_policy(tmp_path / "p"), OnnxEpisodes(tmp_path / "m.onnx")
    for obs in np.random.default_rng(0).uniform(-2, 2, (5, 3)).astype(np.float32):
        np.testing.assert_allclose(model.act(obs), deployed.compute_action(obs), atol=1e-5)


def test_any_torch_policy_model_torch_can_export(tmp_path):
    """export_onnx takes a TorchPolicy around an arbitrary module (export_policy cannot)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    policy = rc.TorchPolicy(model, VECTOR, gym.spaces.Discrete(2), seed=0)
    src = _source(VECTOR, gym.spaces.Discrete(2), [], policy=policy)
    rc.export_onnx(src, tmp_path / "m.onnx")
    runner_like = OnnxEpisodes(tmp_path / "m.onnx")
    for obs in np.random.default_rng(1).uniform(-2, 2, (20, 3)).astype(np.float32):
        want = policy.compute_single_action(obs, explore=False)[0]
        assert runner_like.act(obs) == want


@pytest.mark.slow
def test_pong_with_the_atari_preset(tmp_path):
    """The Atari preset (env-side frames, ClipReward, FrameStack of uint8 frames): the
    runner, the policy file and the ONNX model agree step by step."""
    from rlconnect.envs.atari import make_atari_env

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    config = rc.RunnerConfig(num_envs=1, rollout_fragment_length=20, seed=0, preset="atari")
    pong = make_atari_env("ALE/Pong-v5")
    runner = rc.EnvRunner(
        "ALE/Pong-v5",
        rc.MLPPolicy(space, pong.action_space, seed=0, hiddens=(16,)),
        config=config,
    )
    runner.sample()
    assert runner.agent_pipeline().names == ["ClipReward", "FrameStack"]
    rc.export_policy(runner, tmp_path / "pong.policy")
    rc.export_onnx(runner, tmp_path / "pong.onnx")
    deployed, model = rc.load_policy(tmp_path / "pong.policy"), OnnxEpisodes(tmp_path / "pong.onnx")
    assert deployed.observation_space == pong.observation_space
    obs, _ = pong.reset(seed=5)
    for _ in range(60):
        want = runner.compute_single_action(obs, env_id=7)
        got = deployed.compute_action(obs, session=7)
        assert got == want and model.act(obs) == want
        obs, *_ = pong.step(got)


DICT_OBS = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        "mode": gym.spaces.Discrete(3, start=1),
        "more": gym.spaces.Tuple((gym.spaces.MultiBinary(2), gym.spaces.MultiDiscrete([2, 3]))),
    }
)


class DictEnv(gym.Env):
    """Dict observations sampled from the seeded space; rewards that depend on the action."""

    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.observation_space = copy.deepcopy(DICT_OBS)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        reward = float(action) - 1.0 + 0.25 * self.t
        return self.observation_space.sample(), reward, False, self.t >= 9, {}


def test_a_dict_observation_is_one_named_input_per_part(tmp_path):
    """A Dict observation (a Tuple nested in it) flattened by the agent pipeline: the graph
    takes one input per part, flattens them as FlattenObservations does, and onnxruntime
    and onnx's reference evaluator act as the deployed policy does, over whole episodes
    with previous actions and rewards."""

    def agent_pipeline(ctx):
        members = [rc.FlattenObservations(ctx), rc.MeanStdFilter(ctx), rc.PrevActionsRewards(ctx)]
        return rc.AgentConnectorPipeline(ctx, members)

    flat = rc.spaces.flatten_space(DICT_OBS)
    runner = rc.EnvRunner(
        lambda ctx: DictEnv(),
        rc.MLPPolicy(flat, DictEnv.action_space, seed=0, hiddens=(16,)),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=20, seed=0),
        agent_pipelines={"default_policy": agent_pipeline},
    )
    runner.sample()
    interface = rc.export_onnx(runner, tmp_path / "m.onnx")
    rc.export_policy(runner, tmp_path / "p")
    runner.stop()
    obs_inputs = [(i["name"], i["dtype"], i["shape"], i["path"]) for i in interface["inputs"][:4]]
    assert obs_inputs == [
        ("obs.mode", "int64", ["batch"], ["mode"]),
        ("obs.more.0", "int8", ["batch", 2], ["more", 0]),
        ("obs.more.1", "int64", ["batch", 2], ["more", 1]),
        ("obs.pos", "float32", ["batch", 2], ["pos"]),
    ]
    assert interface["inputs"][4]["meaning"].startswith("the reward")
    described = describe_onnx_file(tmp_path / "m.onnx")  # what rlconnect inspect shows
    assert [i["name"] for i in described["inputs"][:4]] == [n for n, *_ in obs_inputs]
    deployed = rc.load_policy(tmp_path / "p")
    runtimes = [OnnxEpisodes(tmp_path / "m.onnx", reference=ref) for ref in (False, True)]
    for model in runtimes:
        env, actions = DictEnv(), set()
        for ep in range(2):
            obs, _ = env.reset(seed=10 + ep)
            model.start()
            reward, done = None, False
            while not done:
                want = deployed.compute_action(obs, session=ep, reward=reward)
                got = model.act(obs, reward)
                assert got.dtype == want.dtype and got == want
                actions.add(int(want))
                obs, reward, _, done, _ = env.step(want)
            deployed.end_session(ep)
        assert len(actions) > 1  # the observations and rewards changed the actions


class _DictModel(torch.nn.Module):
    def forward(self, obs):
        return obs["pos"]


def test_refused_exports_write_nothing_and_keep_an_older_file(tmp_path):
    """A Dict the pipeline does not flatten, a part with no ONNX input, a model the
    exporter cannot trace: ExportError, no file and no temporary left, a file already at
    the path unchanged."""
    text = gym.spaces.Dict({"pos": VECTOR, "name": gym.spaces.Text(5)})
    cases = {
        "FlattenObservations": (DICT_OBS, rc.TorchPolicy(_DictModel(), DICT_OBS, MOVE)),
        r"obs\['name'\]": (text, rc.TorchPolicy(_DictModel(), text, MOVE)),
    }
    for pattern, (space, policy) in cases.items():
        with pytest.raises(rc.ExportError, match=pattern):
            rc.export_onnx(_source(space, MOVE, [], policy=policy), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []

    class Untraceable(torch.nn.Module):
        def forward(self, obs):
            if torch.jit.is_tracing():
                raise RuntimeError("no ONNX form for this")
            return obs[:, :2]

    policy = rc.TorchPolicy(Untraceable(), VECTOR, MOVE)
    (tmp_path / "m.onnx").write_bytes(b"an older model")
    with pytest.raises(rc.ExportError, match="no ONNX form for this"):
        rc.export_onnx(_source(VECTOR, MOVE, [], policy=policy), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == ["m.onnx"]
    assert (tmp_path / "m.onnx").read_bytes() == b"an older model"
