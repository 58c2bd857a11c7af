"""Shared pieces of the deploy tests: a small registered recurrent policy, runners, and a
player that feeds the same observations to a runner and to a deployed policy."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import rlconnect as rc


class TinyRecurrentModel(nn.Module):
    """Two state tensors, like an LSTM's [h, c]: h' = tanh(Wx x + Wh h + c / 4), c' = c + h'."""

    def __init__(self, in_dim: int, out_dim: int, cell: int) -> None:
        super().__init__()
        self.cell = cell
        self.wx = nn.Linear(in_dim, cell)
        self.wh = nn.Linear(cell, cell, bias=False)
        self.head = nn.Linear(cell, out_dim)

    def get_initial_state(self) -> list[torch.Tensor]:
        return [torch.zeros(self.cell), torch.full((self.cell,), 0.5)]

    def forward(self, obs: torch.Tensor, state: list[torch.Tensor]) -> Any:
        x = obs.reshape(obs.shape[0], -1)
        h = torch.tanh(self.wx(x) + self.wh(state[0]) + state[1] / 4)
        return self.head(h), [h, state[1] + h]


@rc.register_policy("TinyRecurrentPolicy")
class TinyRecurrentPolicy(rc.TorchPolicy):
    """A recurrent TorchPolicy rebuildable by name (its config holds every argument)."""

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: dict | None = None,
        *,
        cell: int = 8,
        seed: int | None = None,
    ) -> None:
        from rlconnect.policy import ActionDistSpec

        with torch.random.fork_rng():
            torch.manual_seed(0 if seed is None else seed)
            model = TinyRecurrentModel(
                int(np.prod(observation_space.shape)), ActionDistSpec(action_space).width, cell
            )
        self.cell = cell
        super().__init__(model, observation_space, action_space, config, seed=seed)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "cell": self.cell}


def policy_space(env: gym.Env, framestack: int | None = None) -> gym.spaces.Box:
    shape = env.observation_space.shape
    shape = (framestack, *shape) if framestack else shape
    return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)


def trained_runner(
    env_id: str = "CartPole-v1", policy: str = "mlp", samples: int = 2, **cfg: Any
) -> rc.EnvRunner:
    """A runner whose filters have learned something (``samples`` batches in training)."""
    env = gym.make(env_id)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=50, seed=1, **cfg)
    space = policy_space(env, cfg.get("framestack"))
    kinds: dict[str, Any] = {
        "mlp": rc.MLPPolicy,
        "rnn": TinyRecurrentPolicy,
        "lstm": lambda *a, **kw: rc.LSTMPolicy(*a, hiddens=(16,), cell_size=8, **kw),
        "lstm_vf": lambda *a, **kw: rc.LSTMPolicy(*a, cell_size=8, vf_head=True, **kw),
    }
    r = rc.EnvRunner(env_id, kinds[policy](space, env.action_space, seed=3), config=config)
    for _ in range(samples):
        r.sample()
    return r


def assert_same_action(a: Any, b: Any) -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    np.testing.assert_array_equal(a, b)


def play(
    runner: rc.EnvRunner,
    deployed: rc.DeployedPolicy,
    env_id: str,
    *,
    episodes: int = 2,
    max_steps: int = 80,
    policy_id: str = rc.DEFAULT_POLICY_ID,
) -> int:
    """Whole episodes stepped with the deployed actions, each compared to the runner's
    ``compute_single_action`` under one env id per episode; returns the steps played."""
    env = gym.make(env_id)
    steps = 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=100 + ep)
        env_id_ = runner.config.num_envs + ep
        for _ in range(max_steps):
            expected = runner.compute_single_action(obs, policy_id=policy_id, env_id=env_id_)
            action = deployed.compute_action(obs, session=("episode", ep))
            assert_same_action(action, expected)
            obs, _, terminated, truncated, _ = env.step(action)
            steps += 1
            if terminated or truncated:
                break
        runner.agent_pipeline(policy_id).reset(env_id_)
        runner.action_pipeline(policy_id).reset(env_id_)
        deployed.end_session(("episode", ep))
    return steps


class OnnxEpisodes:
    """Runs an exported ONNX model with onnxruntime (or, ``reference=True``, with onnx's
    reference evaluator) as a deployment would: a Dict or Tuple observation fed one input
    per part (by each input's ``path``), the states from the metadata's initial values, fed
    back from call to call within an episode."""

    def __init__(self, path: Any, *, reference: bool = False) -> None:
        import json

        import onnx
        import onnxruntime as ort

        model = onnx.load(str(path))
        meta = {p.key: p.value for p in model.metadata_props}
        self.interface = json.loads(meta["rlconnect"])
        if reference:
            from onnx.reference import ReferenceEvaluator

            self.session: Any = ReferenceEvaluator(model)
        else:
            self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.states: list[np.ndarray] = []
        self.start()

    def start(self) -> None:
        self.states = [
            np.asarray(i["initial"], dtype=i["dtype"])[None]
            for i in self.interface["inputs"]
            if i["name"].startswith("state_in_")
        ]

    def act(self, obs: Any, reward: float | None = None) -> np.ndarray:
        inputs = self.interface["inputs"]
        state_names = [i["name"] for i in inputs if i["name"].startswith("state_in_")]
        states = list(self.states)
        first = next((i for i in inputs if i["name"].startswith("state_in_")), None)
        if reward is not None and first is not None and first["meaning"].startswith("the reward"):
            states[0] = np.array([reward], np.float32)
        feeds = {}
        for entry in inputs:
            if entry["name"] not in state_names:
                part = obs
                for key in entry.get("path", []):  # a part of a Dict or Tuple observation
                    part = part[key]
                feeds[entry["name"]] = np.asarray(part)[None]
        feeds.update(zip(state_names, states))
        actions, *self.states = self.session.run(None, feeds)
        return actions[0]


def play_onnx(
    deployed: rc.DeployedPolicy,
    onnx_path: Any,
    env_id: str,
    *,
    episodes: int = 2,
    max_steps: int = 60,
    rewards: bool = False,
) -> int:
    """Whole episodes stepped with the ONNX actions, compared with the deployed policy's
    (discrete: equal; continuous: within 1e-5); returns the steps played."""
    env, model, steps = gym.make(env_id), OnnxEpisodes(onnx_path), 0
    for ep in range(episodes):
        obs, _ = env.reset(seed=200 + ep)
        model.start()
        reward = None
        for _ in range(max_steps):
            expected = deployed.compute_action(obs, session=ep, reward=reward)
            action = model.act(obs, reward if rewards else None)
            assert action.dtype == np.asarray(expected).dtype
            if action.dtype.kind == "f":
                np.testing.assert_allclose(action, expected, rtol=0, atol=1e-5)
            else:
                np.testing.assert_array_equal(action, expected)
            obs, r, terminated, truncated, _ = env.step(action)
            reward = float(r) if rewards else None
            steps += 1
            if terminated or truncated:
                break
        deployed.end_session(ep)
    return steps
