"""The tensor path: batched tensor simulators through ``rc.EnvRunner``.

What is attacked: the rows equal the numpy path's on the same episodes, a round reads
nothing from the device and a ``sample()`` reads once, every sub-env gives exactly
``rollout_fragment_length`` rows in time order, and bad envs are refused by name.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlconnect as rc
from rlconnect.envs import BatchedCartPole
from rlconnect.testing import HostReadCounter

SAME, DISABLED, NEXT = (
    gym.vector.AutoresetMode.SAME_STEP,
    gym.vector.AutoresetMode.DISABLED,
    gym.vector.AutoresetMode.NEXT_STEP,
)


def _policy(env: gym.vector.VectorEnv, seed: int = 0) -> rc.MLPPolicy:
    return rc.MLPPolicy(env.single_observation_space, env.single_action_space, seed=seed)


def _runner(env: Any, policy: rc.Policy | None = None, **config: Any) -> rc.EnvRunner:
    config.setdefault("num_envs", env.num_envs)
    config.setdefault("seed", 0)
    return rc.EnvRunner(env, policy or _policy(env), config=rc.RunnerConfig(**config))


class NumpyView(gym.vector.VectorWrapper):
    """A tensor vector env seen through numpy (the numpy path's twin of the same env)."""

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        return obs.numpy(), info

    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(torch.as_tensor(actions))
        info = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in info.items()}
        return obs.numpy(), rew.numpy(), term.numpy(), trunc.numpy(), info


@pytest.mark.parametrize("mode", [SAME, DISABLED])
def test_rows_equal_the_numpy_path_on_the_same_episodes(mode: Any) -> None:
    """Same env, same weights, the distribution's mode: each sub-env's rows on the tensor
    path are the numpy path's rows of that sub-env, column by column, in time order.
    (DISABLED: up to each sub-env's first end; the tensor path resets by mask at every
    round, an all-False mask included, so the env's generator is drawn at other times
    than when the numpy path resets one sub-env in a round of its own.)"""
    n, t = 6, 60
    tensor_env = BatchedCartPole(n, autoreset_mode=mode)
    numpy_env = NumpyView(BatchedCartPole(n, autoreset_mode=mode))
    tp, np_policy = _policy(tensor_env), _policy(tensor_env)
    np_policy.set_weights(tp.get_weights())
    tb = _runner(tensor_env, tp, rollout_fragment_length=t, explore=False).sample()
    nb = _runner(
        numpy_env, np_policy, rollout_fragment_length=2 * t, explore=False, tensor=False
    ).sample()
    assert isinstance(tb["obs"], torch.Tensor) and tb.meta["rows_per_env"] == t
    ended = 0
    for e in range(n):
        mine = {k: v[tb["env_id"] == e].numpy() for k, v in tb.items()}
        theirs = {k: v[nb["env_id"] == e] for k, v in nb.items() if k != "infos"}
        assert len(mine["obs"]) == t <= len(theirs["obs"])
        upto = t if mode is SAME else int(np.flatnonzero(mine["terminateds"])[0]) + 1
        mine = {k: v[:upto] for k, v in mine.items()}
        theirs = {k: v[:upto] for k, v in theirs.items()}
        for col in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t"):
            np.testing.assert_allclose(mine[col], theirs[col], rtol=0, atol=1e-6, err_msg=col)
        ended += int(mine["terminateds"].sum())
        # episode ids are numbered differently (the numpy path opens them later) but
        # split the rows at the same places
        cuts = np.flatnonzero(np.diff(mine["eps_id"]))
        np.testing.assert_array_equal(cuts, np.flatnonzero(np.diff(theirs["eps_id"])))
    assert ended >= n  # the comparison crossed episode ends


def test_stateful_connectors_give_the_numpy_path_rows() -> None:
    """A MeanStdFilter and a FrameStack on the tensor path (two pipeline calls a round,
    the second masked to the new episodes) record what the numpy path records."""
    n, t = 6, 60
    config = {"observation_filter": "MeanStdFilter", "framestack": 3, "explore": False}
    tensor_env = BatchedCartPole(n, autoreset_mode=SAME)
    space = gym.spaces.Box(-np.inf, np.inf, (3, 4), np.float32)
    tp = rc.MLPPolicy(space, tensor_env.single_action_space, seed=0)
    np_policy = rc.MLPPolicy(space, tensor_env.single_action_space, seed=0)
    np_policy.set_weights(tp.get_weights())
    tb = _runner(tensor_env, tp, rollout_fragment_length=t, **config).sample()
    nb = _runner(
        NumpyView(BatchedCartPole(n, autoreset_mode=SAME)),
        np_policy,
        rollout_fragment_length=2 * t,
        tensor=False,
        **config,
    ).sample()
    ended = 0
    for e in range(n):
        mine = {k: v[tb["env_id"] == e].numpy() for k, v in tb.items()}
        theirs = {k: v[nb["env_id"] == e][:t] for k, v in nb.items() if k != "infos"}
        for col in ("obs", "new_obs", "actions", "rewards", "t"):
            np.testing.assert_allclose(mine[col], theirs[col], rtol=1e-5, atol=1e-5, err_msg=col)
        ended += int(mine["terminateds"].sum())
    assert ended >= n // 2  # the comparison crossed episode ends (new stacks, masked)


def test_a_round_reads_nothing_and_a_sample_reads_once() -> None:
    env = BatchedCartPole(64, autoreset_mode=SAME)
    runner = _runner(env, rollout_fragment_length=16)
    runner.sample()  # the first sample resets and builds what it needs
    kernel = runner._kernel
    per_round: list[dict[str, int]] = []
    step = kernel.step

    def counted(*args: Any) -> None:
        with HostReadCounter() as reads:
            step(*args)
        per_round.append(dict(reads.by_name))

    kernel.step = counted  # type: ignore[method-assign]
    with HostReadCounter() as whole:
        batch = runner.sample()
    assert len(per_round) == 16 and all(reads == {} for reads in per_round)
    assert whole.by_name["cpu"] == 1  # the one transfer
    assert set(whole.by_name) <= {"cpu", "numpy", "__array__"}  # ... and its host copy
    assert len(batch) == 64 * 16


@pytest.mark.parametrize("mode", [SAME, DISABLED])
def test_every_sub_env_gives_exactly_the_fragment_in_time_order(mode: Any) -> None:
    n, t = 32, 50
    runner = _runner(BatchedCartPole(n, autoreset_mode=mode), rollout_fragment_length=t)
    for _ in range(2):
        batch = runner.sample()
        env_id = batch["env_id"].reshape(n, t)
        assert torch.equal(env_id, torch.arange(n).unsqueeze(1).expand(n, t))
        obs, new_obs = batch["obs"].reshape(n, t, 4), batch["new_obs"].reshape(n, t, 4)
        eps, done = batch["eps_id"].reshape(n, t), batch["terminateds"].reshape(n, t)
        same_episode = eps[:, 1:] == eps[:, :-1]
        assert torch.equal(same_episode, ~done[:, :-1])  # a new id exactly after each end
        assert torch.equal(obs[:, 1:][same_episode], new_obs[:, :-1][same_episode])
        steps = batch["t"].reshape(n, t)
        assert torch.equal(steps[:, 1:][same_episode], steps[:, :-1][same_episode] + 1)


@pytest.mark.parametrize("t", [1, 5])
def test_a_kept_batch_is_not_written_over_by_later_samples(t: int) -> None:
    """The runner's storage is reused by every sample(): batches own their rows."""
    runner = _runner(BatchedCartPole(8, autoreset_mode=SAME), rollout_fragment_length=t)
    first = runner.sample()
    kept = {name: first[name].clone() for name in first}
    runner.sample()
    runner.sample()
    for name, value in kept.items():
        assert torch.equal(first[name], value), name


def test_eps_ids_are_unique_and_metrics_match_the_rows() -> None:
    n, t = 16, 40
    runner = _runner(BatchedCartPole(n, autoreset_mode=SAME), rollout_fragment_length=t)
    batches = [runner.sample() for _ in range(3)]
    records = runner.get_metrics()
    assert records and runner.get_metrics() == []
    rows = torch.cat([b["eps_id"][b["terminateds"]] for b in batches]).tolist()
    assert sorted(r["episode_id"] for r in records) == sorted(rows)  # one record per end
    by_id = {r["episode_id"]: r for r in records}
    for b in batches:
        last = b["terminateds"]
        for eps, t_last in zip(b["eps_id"][last].tolist(), b["t"][last].tolist()):
            assert by_id[eps]["episode_length"] == t_last + 1
            assert by_id[eps]["episode_reward"] == pytest.approx(t_last + 1)
    firsts = {r["episode_id"]: r["env_id"] for r in records}
    assert len(firsts) == len(records)


def test_the_horizon_truncates_a_disabled_env_and_resets_it_by_mask() -> None:
    runner = _runner(
        BatchedCartPole(8, autoreset_mode=DISABLED), rollout_fragment_length=30, horizon=5
    )
    batch = runner.sample()
    assert int(batch["t"].max()) == 4
    trunc = batch["truncateds"]
    assert torch.equal(trunc, batch["t"] == 4)
    assert all(r["episode_length"] <= 5 for r in runner.get_metrics())


def test_a_same_step_env_cannot_take_a_horizon() -> None:
    with pytest.raises(ValueError, match="horizon=5 needs sub-envs the runner can reset"):
        _runner(BatchedCartPole(2, autoreset_mode=SAME), horizon=5)


def test_next_step_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"NEXT_STEP.*SAME_STEP"):
        _runner(BatchedCartPole(2, autoreset_mode=NEXT))


class _NoFinalObs(gym.vector.VectorWrapper):
    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, _ = self.env.step(actions)
        return obs, rew, term, trunc, {}


def test_a_same_step_env_without_final_obs_is_refused_when_a_sub_env_ends() -> None:
    env = _NoFinalObs(BatchedCartPole(4, autoreset_mode=SAME))
    env.device = env.env.device  # type: ignore[attr-defined]
    runner = _runner(env, rollout_fragment_length=2)
    runner.sample()  # nothing has ended yet: the rows are right so far
    samples = 0
    with pytest.raises(rc.EnvCheckError, match=r'infos\["final_obs"\]'):  # noqa: PT012
        while samples < 200:  # CartPole's episodes end within 500 steps
            samples += 1
            runner.sample()
    assert samples < 200


class _PoisonAt(gym.vector.VectorWrapper):
    """Sub-env ``env`` returns a NaN observation (or reward) at its ``step``-th step."""

    def __init__(self, env: Any, sub_env: int, step: int, field: str = "obs") -> None:
        super().__init__(env)
        self.device, self.sub_env, self.at, self.steps = env.device, sub_env, step, 0
        self.field = field

    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(actions)
        self.steps += 1
        if self.steps == self.at and self.field == "obs":
            obs = obs.clone()
            obs[self.sub_env, 2] = float("nan")
        elif self.steps == self.at:
            rew = rew.clone()
            rew[self.sub_env] = float("inf")
        return obs, rew, term, trunc, info


@pytest.mark.parametrize("field", ["obs", "reward"])
@pytest.mark.parametrize("pipeline", [False, True])
def test_a_nan_is_named_with_its_sub_env_and_step_at_the_end_of_sample(
    field: str, pipeline: bool
) -> None:
    """Checked on the recorded rows when the agent pipeline is empty, per round on the
    env's own values otherwise: the same error either way."""
    env = _PoisonAt(BatchedCartPole(8, autoreset_mode=DISABLED), sub_env=5, step=3, field=field)
    agent_pipelines = (
        {
            "default_policy": lambda ctx: rc.AgentConnectorPipeline(
                ctx, [rc.ClipReward(ctx, limit=1e9)]
            )
        }
        if pipeline
        else None
    )
    runner = rc.EnvRunner(
        env,
        _policy(env),
        config=rc.RunnerConfig(num_envs=8, rollout_fragment_length=6, seed=0),
        agent_pipelines=agent_pipelines,
    )
    with pytest.raises(
        rc.EnvCheckError, match=rf"sub-env 5 returned a non-finite {field} .* step 3 "
    ):
        runner.sample()
    unchecked = _runner(
        _PoisonAt(BatchedCartPole(8, autoreset_mode=DISABLED), sub_env=5, step=3),
        rollout_fragment_length=6,
        check_finite=False,
    )
    assert torch.isnan(unchecked.sample()["new_obs"]).any()


class _NumpyRewards(gym.vector.VectorWrapper):
    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.device = env.device

    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(actions)
        return obs, rew.numpy(), term, trunc, info


def test_an_env_returning_numpy_for_a_key_is_named() -> None:
    runner = _runner(_NumpyRewards(BatchedCartPole(2, autoreset_mode=SAME)))
    with pytest.raises(TypeError, match="rewards is a ndarray, not a torch tensor"):
        runner.sample()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"batch_mode": "complete_episodes"}, "complete_episodes"),
        ({"restart_failed_sub_environments": True}, "restart_failed_sub_environments"),
        ({"sample_async": True}, "sample_async"),
    ],
)
def test_what_the_tensor_path_does_not_take_is_refused_when_built(config: Any, needle: str) -> None:
    with pytest.raises(ValueError, match=f"tensor path does not take.*{needle}"):
        _runner(BatchedCartPole(2, autoreset_mode=SAME), **config)


def test_per_round_callbacks_are_refused_and_episode_ends_come_once_per_sample() -> None:
    class EveryStep(rc.Callbacks):
        def on_episode_step(self, **kwargs: Any) -> None:
            pass

    with pytest.raises(ValueError, match="on_episode_step"):
        rc.EnvRunner(
            BatchedCartPole(2, autoreset_mode=SAME),
            _policy(BatchedCartPole(1)),
            callbacks=EveryStep(),
            config=rc.RunnerConfig(num_envs=2),
        )

    ends: list[tuple[int, int]] = []

    class Ends(rc.Callbacks):
        def on_episode_end(self, *, episode: rc.Episode, env_index: int, **kwargs: Any) -> None:
            ends.append((episode.episode_id, episode.length))

    env = BatchedCartPole(4, autoreset_mode=SAME)
    runner = rc.EnvRunner(
        env,
        _policy(env),
        callbacks=Ends(),
        config=rc.RunnerConfig(num_envs=4, rollout_fragment_length=60, seed=0),
    )
    runner.sample()
    records = runner.get_metrics()
    assert ends and sorted(ends) == sorted((r["episode_id"], r["episode_length"]) for r in records)


def test_a_user_connector_without_tensor_support_is_named_when_built() -> None:
    class Halve(rc.AgentConnector):
        def __call__(self, data: rc.AgentData) -> rc.AgentData:
            data["obs"] = data["obs"] / 2
            return data

    env = BatchedCartPole(2, autoreset_mode=SAME)
    with pytest.raises(ValueError, match="do not take torch tensors"):
        rc.EnvRunner(
            env,
            _policy(env),
            config=rc.RunnerConfig(num_envs=2),
            agent_pipelines={
                "default_policy": lambda ctx: rc.AgentConnectorPipeline(ctx, [Halve(ctx)])
            },
        )


def test_a_checkpoint_of_a_tensor_runner_restores_on_the_numpy_path(tmp_path: Any) -> None:
    env = BatchedCartPole(4, autoreset_mode=SAME)
    runner = _runner(env, rollout_fragment_length=8)
    runner.sample()
    runner.save_checkpoint(tmp_path / "ckpt")
    restored = rc.EnvRunner.from_checkpoint(tmp_path / "ckpt", env="CartPole-v1")
    weights = restored.get_weights()["default_policy"]
    for name, value in runner.get_weights()["default_policy"].items():
        np.testing.assert_array_equal(weights[name], value)
    assert isinstance(restored.sample()["obs"], np.ndarray)


def test_vmas_agents_are_stacked_per_policy_and_reset_when_their_episodes_end() -> None:
    import vmas  # (the dev extra installs it; a VMAS env is a real batched torch simulator)

    n, t = 4, 12
    env = vmas.make_env(
        "balance",
        num_envs=n,
        device="cpu",
        continuous_actions=True,
        seed=0,
        max_steps=5,
        n_agents=3,
    )
    names = [a.name for a in env.agents]
    space = rc.envs.make_base_env(env).observation_space(names[0])
    act = rc.envs.make_base_env(env).action_space(names[0])
    policy = rc.MLPPolicy(space, act, seed=0)
    runner = rc.EnvRunner(
        env,
        {"shared": policy},
        policy_mapping_fn=lambda a, ep, **k: "shared",
        config=rc.RunnerConfig(num_envs=n, rollout_fragment_length=t),
    )
    batch = runner.sample()
    assert isinstance(batch, rc.MultiAgentBatch) and batch.env_steps() == n * t
    rows = batch.policy_batches["shared"]
    assert len(rows) == 3 * n * t and batch.agent_steps() == 3 * n * t
    assert torch.equal(
        rows["agent_index"].reshape(3 * n, t)[:, 0], torch.arange(3).repeat_interleave(n)
    )
    trunc = rows["truncateds"].reshape(3 * n, t)
    assert torch.equal(trunc, (rows["t"].reshape(3 * n, t) == 4))  # max_steps=5 ends them
    obs, new_obs = rows["obs"].reshape(3 * n, t, -1), rows["new_obs"].reshape(3 * n, t, -1)
    going_on = ~(trunc | rows["terminateds"].reshape(3 * n, t))[:, :-1]
    assert torch.equal(obs[:, 1:][going_on], new_obs[:, :-1][going_on])
    records = runner.get_metrics()
    assert records and all(r["episode_length"] == 5 for r in records)
    assert set(records[0]["agent_rewards"]) == {(a, "shared") for a in names}


def test_learner_connectors_run_on_the_device_and_equal_numpy() -> None:
    env = BatchedCartPole(8, autoreset_mode=SAME)
    policy = rc.MLPPolicy(
        env.single_observation_space, env.single_action_space, vf_head=True, seed=0
    )
    runner = rc.EnvRunner(
        env,
        policy,
        config=rc.RunnerConfig(num_envs=8, rollout_fragment_length=40, seed=0),
        learner_pipelines={"default_policy": lambda ctx: [rc.GAE(ctx, gamma=0.9, lambda_=0.8)]},
    )
    batch = runner.sample()
    assert isinstance(batch["advantages"], torch.Tensor) and batch.device == torch.device("cpu")
    on_numpy = batch.numpy()
    inputs = rc.SampleBatch(
        {k: v for k, v in on_numpy.items() if k not in ("advantages", "value_targets")}
    )
    ctx = runner.learner_pipeline().ctx
    expected = rc.GAE(ctx, gamma=0.9, lambda_=0.8)(inputs, policy)
    np.testing.assert_allclose(on_numpy["advantages"], expected["advantages"], atol=1e-5)
    assert on_numpy["terminateds"].any()  # GAE crossed episode ends
    tm = batch.time_major()
    assert tm["advantages"].shape == (40, 8)
    assert torch.equal(tm["env_id"][0], torch.arange(8))


def test_a_learner_connector_without_tensor_support_is_named_when_built() -> None:
    class Mine(rc.LearnerConnector):
        def __call__(self, batch: Any, policy: Any) -> Any:
            return batch

    env = BatchedCartPole(2, autoreset_mode=SAME)
    with pytest.raises(ValueError, match=r"learner pipeline of policy 'default_policy'"):
        rc.EnvRunner(
            env,
            _policy(env),
            config=rc.RunnerConfig(num_envs=2),
            learner_pipelines={"default_policy": lambda ctx: [Mine(ctx)]},
        )
