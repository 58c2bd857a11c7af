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


@pytest.mark.parametrize("mode", [SAME, NEXT])
def test_stateful_connectors_give_the_numpy_path_rows(mode: Any) -> None:
    """A MeanStdFilter and a FrameStack on the tensor path (two pipeline calls a round,
    the second masked to the new episodes; NEXT_STEP: the reset steps masked out of the
    first) record what the numpy path records."""
    n, t = 6, 60
    config = {"observation_filter": "MeanStdFilter", "framestack": 3, "explore": False}
    tensor_env = BatchedCartPole(n, autoreset_mode=mode)
    space = gym.spaces.Box(-np.inf, np.inf, (3, 4), np.float32)
    tp = rc.MLPPolicy(space, tensor_env.single_action_space, seed=0)
    np_policy = rc.MLPPolicy(space, tensor_env.single_action_space, seed=0)
    np_policy.set_weights(tp.get_weights())
    tb = _runner(tensor_env, tp, rollout_fragment_length=t, **config).sample()
    nb = _runner(
        NumpyView(BatchedCartPole(n, autoreset_mode=mode)),
        np_policy,
        rollout_fragment_length=2 * t,
        tensor=False,
        **config,
    ).sample()
    ended = 0
    for e in range(n):
        mine = {k: v[tb["env_id"] == e].numpy() for k, v in tb.items()}
        rows = len(mine["obs"])
        theirs = {k: v[nb["env_id"] == e][:rows] for k, v in nb.items() if k != "infos"}
        for col in ("obs", "new_obs", "actions", "rewards", "t"):
            np.testing.assert_allclose(mine[col], theirs[col], rtol=1e-5, atol=1e-5, err_msg=col)
        ended += int(mine["terminateds"].sum())
    assert ended >= n // 2  # the comparison crossed episode ends (new stacks, masked)


@pytest.mark.parametrize("mode", [SAME, NEXT])
def test_a_round_reads_nothing_and_a_sample_reads_once(mode: Any) -> None:
    """A NEXT_STEP env's sample reads twice where a sub-env reset (its extra rounds'
    read); its extra rounds read nothing either."""
    env = BatchedCartPole(64, autoreset_mode=mode)
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
    assert len(per_round) >= 16 and all(reads == {} for reads in per_round)
    assert whole.by_name["cpu"] == (1 if mode is SAME else 2)  # the one transfer (two)
    assert len(per_round) > 16 or mode is SAME  # (64 sub-envs: some reset in 16 rounds)
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


def test_next_step_rows_equal_the_numpy_path_with_exactly_the_fragment_per_sub_env() -> None:
    """NEXT_STEP: the step after a sub-env ended only resets it; on both paths that step
    is no row. The tensor path makes up for it with extra rounds, carrying the rows beyond
    the fragment into the next sample: every sub-env has exactly T rows in every sample,
    ``time_major()`` folds them, and each sub-env's rows over consecutive samples are the
    numpy path's rows of it, with the same episode cuts and no row lost or repeated."""
    n, t, samples = 6, 60, 3
    tensor_env = BatchedCartPole(n, autoreset_mode=NEXT)
    numpy_env = NumpyView(BatchedCartPole(n, autoreset_mode=NEXT))
    tp, np_policy = _policy(tensor_env), _policy(tensor_env)
    np_policy.set_weights(tp.get_weights())
    runner = _runner(tensor_env, tp, rollout_fragment_length=t, explore=False)
    tbs = []
    for _ in range(samples):
        with HostReadCounter() as reads:
            tbs.append(runner.sample())
        assert reads.by_name["cpu"] <= 2  # the sample's read, and its extra rounds'
    nb = _runner(
        numpy_env, np_policy, rollout_fragment_length=2 * samples * t, explore=False, tensor=False
    ).sample()
    for b in tbs:
        assert _rows_per_env(b, n) == [t] * n and b.meta["rows_per_env"] == t
        tm = b.time_major()
        assert tm["obs"].shape == (t, n, 4) and torch.equal(tm["env_id"][0], torch.arange(n))
    ends = 0
    columns = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "t")
    for e in range(n):
        mine = {
            k: np.concatenate([b[k][b["env_id"] == e].numpy() for b in tbs])
            for k in (*columns, "eps_id")
        }
        theirs = {k: v[nb["env_id"] == e] for k, v in nb.items() if k != "infos"}
        assert len(mine["obs"]) == samples * t <= len(theirs["obs"])
        for col in columns:
            np.testing.assert_allclose(
                mine[col], theirs[col][: samples * t], atol=1e-6, err_msg=col
            )
        cuts = np.flatnonzero(np.diff(mine["eps_id"]))
        np.testing.assert_array_equal(
            cuts, np.flatnonzero(np.diff(theirs["eps_id"][: samples * t]))
        )
        ends += int(mine["terminateds"].sum())
    assert ends >= 2 * n  # the comparison crossed reset steps
    records = runner.get_metrics()
    ended = torch.cat([b["eps_id"][b["terminateds"] | b["truncateds"]] for b in tbs])
    assert set(ended.tolist()) <= {r["episode_id"] for r in records}


class _Lengths(gym.vector.VectorEnv):
    """A NEXT_STEP torch vector env whose sub-env ``e`` ends every episode after
    ``e + 1`` steps (sub-env 0 after every step: reset, step, reset, ...); its
    observation is (env steps so far, episode step)."""

    metadata = {"autoreset_mode": NEXT}

    def __init__(self, num_envs: int) -> None:
        self.num_envs, self.device = num_envs, torch.device("cpu")
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.length = torch.arange(num_envs) + 1
        self.steps, self.poison_at = 0, 0
        self.t = torch.zeros(num_envs, dtype=torch.int64)
        self.ended = torch.zeros(num_envs, dtype=torch.bool)

    def _obs(self) -> torch.Tensor:
        return torch.stack([torch.full((self.num_envs,), self.steps), self.t], 1).float()

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        mask = (options or {}).get("reset_mask")
        if mask is None:
            self.steps = 0
            mask = torch.ones_like(self.ended)
        self.t, self.ended = self.t.masked_fill(mask, 0), self.ended & ~mask
        return self._obs(), {}

    def step(self, actions: Any) -> Any:
        self.steps += 1
        resetting = self.ended
        self.t = torch.where(resetting, 0, self.t + 1)
        term = ~resetting & (self.t >= self.length)
        self.ended = term
        reward = (~resetting).float()
        obs = self._obs()
        if self.steps == self.poison_at:  # sub-env 3's observation
            obs[3, 1] = float("nan")
        return obs, reward, term, torch.zeros_like(term), {}


def test_next_step_extra_rounds_cover_the_worst_deficit_in_one_more_read() -> None:
    """Sub-env 0 spends every other step on a reset, the others fewer: each sample still
    gives every sub-env exactly T rows with at most two reads, and each sub-env's rows
    are its env steps less its reset steps, in order, across samples."""
    n, t, samples = 4, 7, 5
    runner = _runner(_Lengths(n), rollout_fragment_length=t)
    batches = []
    for _ in range(samples):
        with HostReadCounter() as reads:
            batches.append(runner.sample())
        assert reads.by_name["cpu"] == 2
    for b in batches:
        assert _rows_per_env(b, n) == [t] * n and b.time_major()["obs"].shape == (t, n, 2)
    for e in range(n):
        steps = torch.cat([b["new_obs"][b["env_id"] == e][:, 0] for b in batches])
        every = torch.arange(1, 3 * samples * t, dtype=torch.float32)
        transitions = every[every % (e + 2) != 0]  # step k * (length + 1) only resets
        assert torch.equal(steps, transitions[: samples * t]), e
        rows = {k: torch.cat([b[k][b["env_id"] == e] for b in batches]) for k in ("t", "rewards")}
        assert torch.equal(rows["t"], torch.arange(samples * t) % (e + 1))
        assert bool((rows["rewards"] == 1).all())


def test_a_next_step_fault_before_extra_rounds_drops_the_rest_of_its_sample() -> None:
    """Sub-env 3 returns a NaN at its third step, found by the first read; the extra
    rounds (sub-env 0 resets every other step) step it on, but none of its rows from the
    bad one on is handed out or carried, its later episode ends are left out, and it is
    restarted once, after the sample's second read: its next sample starts afresh."""
    n, t = 4, 7
    env = _Lengths(n)
    env.poison_at = 3
    callbacks = _EpisodeEnds()
    runner = rc.EnvRunner(
        env,
        _policy(env),
        callbacks=callbacks,
        config=rc.RunnerConfig(
            num_envs=n, rollout_fragment_length=t, seed=0, restart_failed_sub_environments=True
        ),
    )
    first = runner.sample()
    assert runner._kernel.reads == 2 and _rows_per_env(first, n) == [t, t, t, 2]
    assert torch.isfinite(first["new_obs"]).all()
    faulty = [e for e in callbacks.ends if e[4]]
    assert [(e[0], e[2], e[3]) for e in faulty] == [(3, 2, 2.0)]
    assert not [e for e in callbacks.ends if e[0] == 3 and not e[4]]  # (ends after it)
    second = runner.sample()
    assert _rows_per_env(second, n) == [t] * n and second.meta["rows_per_env"] == t
    rows3 = second["env_id"] == 3
    assert second["t"][rows3].tolist() == [0, 1, 2, 3, 0, 1, 2]  # a new episode, length 4
    assert runner.failure is None


def test_next_step_episode_records_and_callbacks_match_the_rows() -> None:
    """The episodes that end in the extra rounds are reported by the sample that polled
    them: one record and one on_episode_end per end, their lengths and returns those of
    the rows, ids unique; carried rows keep the weights_seq they were recorded with."""
    ends: list[tuple[int, int, float]] = []

    class Ends(rc.Callbacks):
        def on_episode_end(self, *, episode: rc.Episode, env_index: int, **kwargs: Any) -> None:
            ends.append((episode.episode_id, episode.length, episode.total_reward))

    n, t = 16, 24
    env = BatchedCartPole(n, autoreset_mode=NEXT)
    runner = rc.EnvRunner(
        env,
        _policy(env),
        callbacks=Ends(),
        config=rc.RunnerConfig(num_envs=n, rollout_fragment_length=t, seed=0),
    )
    batches = []
    for i in range(6):
        batches.append(runner.sample())
        runner.set_weights({"default_policy": runner.get_weights()["default_policy"]})
        assert int(batches[-1]["weights_seq"].max()) == i  # (a carried row: an older one)
    records = runner.get_metrics()
    assert sorted((r["episode_id"], r["episode_length"]) for r in records) == sorted(
        (eps, length) for eps, length, _ in ends
    )
    assert len({r["episode_id"] for r in records}) == len(records)
    rows = {k: torch.cat([b[k] for b in batches]) for k in ("eps_id", "terminateds", "t")}
    by_id = {r["episode_id"]: r for r in records}
    last = rows["terminateds"]
    for eps, t_last in zip(rows["eps_id"][last].tolist(), rows["t"][last].tolist()):
        assert by_id[eps]["episode_length"] == t_last + 1
        assert by_id[eps]["episode_reward"] == pytest.approx(t_last + 1)
    assert set(rows["eps_id"][last].tolist()) <= set(by_id)  # (perhaps a sample early)
    assert any(int(b["weights_seq"].min()) < int(b["weights_seq"].max()) for b in batches)


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


def test_next_prev_inputs_are_what_the_policy_is_fed_at_the_next_step() -> None:
    """PrevActionsRewards before ClipReward on tensors: ``new_prev_*`` of a row, the
    bootstrap's inputs, are the ``prev_*`` of the next row of its trajectory (the first
    row of the next sample after a cut), not the clipped ``rewards``."""
    env = BatchedCartPole(3, autoreset_mode=SAME)

    def agent_pipeline(ctx: rc.ConnectorContext) -> rc.AgentConnectorPipeline:
        return rc.AgentConnectorPipeline(
            ctx, [rc.PrevActionsRewards(ctx), rc.ClipReward(ctx, limit=0.5)]
        )

    runner = rc.EnvRunner(
        env,
        _policy(env),
        config=rc.RunnerConfig(num_envs=3, rollout_fragment_length=30, seed=0),
        agent_pipelines={"default_policy": agent_pipeline},
    )
    first, second = runner.sample().numpy(), runner.sample().numpy()
    for col in ("prev_actions", "prev_rewards"):
        mine, nxt = first[f"new_{col}"], first[col]
        same = first["eps_id"][:-1] == first["eps_id"][1:]
        np.testing.assert_array_equal(mine[:-1][same], nxt[1:][same], err_msg=col)
        cut = np.flatnonzero(np.diff(first["env_id"], append=-1))  # each block's last row
        following = np.flatnonzero(np.diff(second["env_id"], prepend=-1))  # and next first
        ongoing = first["eps_id"][cut] == second["eps_id"][following]
        assert ongoing.any()
        np.testing.assert_array_equal(
            mine[cut][ongoing], second[col][following][ongoing], err_msg=col
        )
    assert np.abs(first["rewards"]).max() <= 0.5 < np.abs(first["new_prev_rewards"]).max()


def _rows_per_env(batch: rc.SampleBatch, n: int) -> list[int]:
    return torch.bincount(batch["env_id"], minlength=n).tolist()


class _EpisodeEnds(rc.Callbacks):
    """Records every on_episode_end: (env_index, id, length, total reward, faulty)."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[tuple[int, int, int, float, bool]] = []

    def on_episode_end(self, *, episode: rc.Episode, env_index: int, **kwargs: Any) -> None:
        ep = episode
        self.ends.append((env_index, ep.episode_id, ep.length, ep.total_reward, ep.faulty))


@pytest.mark.parametrize("mode", [DISABLED, SAME, NEXT])
@pytest.mark.parametrize("pipeline", [False, True])
def test_restarts_drop_a_faulty_sub_envs_rows_from_the_bad_step_and_reset_it(
    mode: Any, pipeline: bool
) -> None:
    """restart_failed_sub_environments: the sub-env that returned a NaN at its third step
    (round 2) keeps its rows before it, is reset, and gives whole fragments again; its
    episode is reported faulty, with on_episode_end, its length and return those of the
    two steps before the bad one (as on the numpy path); the value reaches no row. Found
    on the recorded rows (empty agent pipeline) or at each round (a pipeline, and every
    NEXT_STEP env): the same outcome."""
    n, t = 8, 6
    env = _PoisonAt(BatchedCartPole(n, autoreset_mode=mode), sub_env=5, step=3)
    agent_pipelines = (
        {
            "default_policy": lambda ctx: rc.AgentConnectorPipeline(
                ctx, [rc.ClipReward(ctx, limit=1e9)]
            )
        }
        if pipeline
        else None
    )
    callbacks = _EpisodeEnds()
    runner = rc.EnvRunner(
        env,
        _policy(env),
        callbacks=callbacks,
        config=rc.RunnerConfig(
            num_envs=n, rollout_fragment_length=t, seed=0, restart_failed_sub_environments=True
        ),
        agent_pipelines=agent_pipelines,
    )
    first = runner.sample()
    # located by a second read when found on the recorded rows, in that sample only
    assert runner._kernel.reads == (1 if pipeline or mode is NEXT else 2)
    assert _rows_per_env(first, n) == [t] * 5 + [2] + [t] * 2
    assert torch.isfinite(first["obs"]).all() and torch.isfinite(first["new_obs"]).all()
    with pytest.raises(ValueError, match="faulty sub-envs"):
        first.time_major()
    faulty = [r for r in runner.get_metrics() if r["episode_faulty"]]
    assert [(r["env_id"], r["episode_length"], r["episode_reward"]) for r in faulty] == [
        (5, 2, 2.0)
    ]
    assert faulty[0]["agent_rewards"] == {("agent0", "default_policy"): 2.0}
    assert callbacks.ends == [(5, faulty[0]["episode_id"], 2, 2.0, True)]
    second = runner.sample()
    assert _rows_per_env(second, n) == [t] * n and second.meta["rows_per_env"] == t
    rows5 = second["env_id"] == 5
    assert second["t"][rows5][0] == 0  # reset: a new episode, with a new id
    assert second["eps_id"][rows5][0] not in first["eps_id"].tolist()
    assert second.time_major()["obs"].shape == (t, n, 4)
    assert runner.failure is None


class _BadRestart(_PoisonAt):
    """As ``_PoisonAt``, and a reset by mask (a restart) gives its sub-env a NaN
    observation."""

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        obs, info = self.env.reset(seed=seed, options=options)
        if options:
            obs = obs.clone()
            obs[self.sub_env, 1] = float("nan")
        return obs, info


@pytest.mark.parametrize("mode", [DISABLED, NEXT])
@pytest.mark.parametrize("pipeline", [False, True])
def test_a_restart_that_resets_to_a_nan_fails_again_and_reaches_no_row(
    mode: Any, pipeline: bool
) -> None:
    """The reset observations of a restarted sub-env are finite-checked with the next
    sample's read (no read of their own): a NaN there is a failure of that sub-env again
    (its rows dropped, its episode faulty, the MeanStdFilter never fed it), until the
    restart limit names it, as on the numpy path."""
    n, t = 6, 5
    env = _BadRestart(BatchedCartPole(n, autoreset_mode=mode), sub_env=2, step=2)
    runner = _runner(
        env,
        rollout_fragment_length=t,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=2,
        observation_filter="MeanStdFilter" if pipeline else "NoFilter",
    )
    assert _rows_per_env(runner.sample(), n) == [t, t, 1, t, t, t]
    with HostReadCounter() as reads:
        second = runner.sample()  # the reset's NaN: found by this sample's read
    # a second read: NEXT_STEP's extra rounds, or the rows search on the recorded rows
    # (the MeanStdFilter's sync point makes one of its own in every sample)
    if mode is NEXT:
        assert reads.by_name["cpu"] <= 2 + pipeline
    else:
        assert reads.by_name["cpu"] == (1 if pipeline else 2) + pipeline
    assert _rows_per_env(second, n) == [t, t, 0, t, t, t]
    assert torch.isfinite(second["obs"]).all() and torch.isfinite(second["new_obs"]).all()
    faulty = [
        (r["env_id"], r["episode_length"]) for r in runner.get_metrics() if r["episode_faulty"]
    ]
    assert faulty == [(2, 1), (2, 0)]
    if pipeline:
        stats = runner.get_connector_states()["default_policy"]["agent"]["MeanStdFilter"]
        assert np.isfinite(stats["mean"]).all() and np.isfinite(stats["m2"]).all()
    with pytest.raises(rc.EnvError, match=r"sub-env 2 failed 3 times in a row"):
        runner.sample()


class _PoisonAlways(gym.vector.VectorWrapper):
    """Sub-env 1 returns a NaN observation at every step."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.device = env.device

    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(actions)
        obs = obs.clone()
        obs[1, 0] = float("nan")
        return obs, rew, term, trunc, info


def test_a_sub_env_that_fails_every_episode_raises_after_the_restart_limit() -> None:
    runner = _runner(
        _PoisonAlways(BatchedCartPole(4, autoreset_mode=DISABLED)),
        rollout_fragment_length=4,
        restart_failed_sub_environments=True,
        sub_env_restart_limit=2,
    )
    for _ in range(2):
        assert _rows_per_env(runner.sample(), 4)[1] == 0
    with pytest.raises(rc.EnvError, match=r"sub-env 1 failed 3 times in a row"):
        runner.sample()


def test_record_infos_keeps_tensor_infos_as_tensors_per_row() -> None:
    """Off by default; with record_infos=True the env's per-sub-env tensors are the nested
    column ``infos`` on the device, in the rows' order, still one host read a sample."""
    n, t = 4, 60
    assert "infos" not in _runner(BatchedCartPole(n, autoreset_mode=SAME)).sample()
    runner = _runner(
        BatchedCartPole(n, autoreset_mode=SAME), rollout_fragment_length=t, record_infos=True
    )
    runner.sample()
    with HostReadCounter() as reads:
        batch = runner.sample()
    assert reads.by_name["cpu"] == 1
    infos = batch["infos"]
    assert set(infos) == {"final_obs", "_final_obs"} and infos["final_obs"].shape == (n * t, 4)
    done = batch["terminateds"] | batch["truncateds"]
    assert done.any() and torch.equal(infos["_final_obs"], done)
    assert torch.equal(infos["final_obs"][done], batch["new_obs"][done])
    assert batch.numpy()["infos"]["final_obs"].shape == (n * t, 4)


class _SometimesInfo(gym.vector.VectorWrapper):
    """A key only at every other step (gymnasium leaves keys out where no sub-env has
    one), and a value that is not per sub-env."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.device, self.steps = env.device, 0

    def step(self, actions: Any) -> Any:
        obs, rew, term, trunc, info = self.env.step(actions)
        self.steps += 1
        info = {"log": {"mean": 1.0}}
        if self.steps % 2:
            info["odd"] = torch.full((self.num_envs,), self.steps)
        return obs, rew, term, trunc, info


def test_record_infos_fills_a_missing_key_with_zeros_and_leaves_out_non_rows() -> None:
    runner = _runner(
        _SometimesInfo(BatchedCartPole(2, autoreset_mode=SAME)),
        rollout_fragment_length=4,
        record_infos=True,
    )
    batch = runner.sample()
    assert set(batch["infos"]) == {"odd"}
    assert batch["infos"]["odd"].tolist() == [1, 0, 3, 0, 1, 0, 3, 0]


def test_next_step_carried_rows_keep_their_nested_infos_and_time_order() -> None:
    """A nested column (``infos``) goes through the carry like the others: per sub-env,
    the env step each row was recorded at (``infos["odd"]``, at odd steps) runs on over
    consecutive samples, skipping exactly the reset steps, none lost or repeated."""
    n, t = 8, 10
    runner = _runner(
        _SometimesInfo(BatchedCartPole(n, autoreset_mode=NEXT)),
        rollout_fragment_length=t,
        record_infos=True,
    )
    batches = [runner.sample() for _ in range(8)]
    assert all(_rows_per_env(b, n) == [t] * n for b in batches)
    for e in range(n):
        odd = torch.cat([b["infos"]["odd"][b["env_id"] == e] for b in batches])
        done = torch.cat([(b["terminateds"] | b["truncateds"])[b["env_id"] == e] for b in batches])
        # row i is env step i + 1 + (ends before it): each end costs one reset step
        ends_before = torch.cumsum(done.to(torch.int64), 0) - done.to(torch.int64)
        step = torch.arange(len(odd)) + 1 + ends_before
        assert torch.equal(odd, torch.where(step % 2 == 1, step, 0))
        assert int(done.sum()) >= 1  # (CartPole ends within 80 steps of a random policy)


def test_a_learner_pipeline_adds_no_host_read_and_its_errors_lose_one_batch() -> None:
    """GAE's checks travel with the sample's one read; a check that fails raises from
    sample() and the runner samples on."""
    env = _PoisonAt(BatchedCartPole(8, autoreset_mode=SAME), sub_env=2, step=70, field="reward")
    policy = rc.MLPPolicy(env.single_observation_space, env.single_action_space, vf_head=True)
    runner = rc.EnvRunner(
        env,
        policy,
        config=rc.RunnerConfig(num_envs=8, rollout_fragment_length=40, seed=0, check_finite=False),
        learner_pipelines={"default_policy": lambda ctx: [rc.GAE(ctx, gamma=0.9, lambda_=0.8)]},
    )
    with HostReadCounter() as reads:
        batch = runner.sample()
    assert reads.by_name["cpu"] == 1 and set(reads.by_name) <= {"cpu", "numpy", "__array__"}
    assert isinstance(batch["advantages"], torch.Tensor)
    assert batch.meta["policy_id"] == "default_policy"
    with pytest.raises(ValueError, match="GAE"):
        runner.sample()  # the inf reward of round 70
    assert runner.failure is None
    assert "advantages" in runner.sample()


class _Allocations(torch.overrides.TorchFunctionMode):
    """Counts the calls of torch's zero-filled factories inside a ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += getattr(func, "__name__", "") in ("zeros", "zeros_like", "full")
        return func(*args, **(kwargs or {}))


def test_a_round_with_an_agent_pipeline_allocates_no_first_row_columns() -> None:
    """The first rows of new episodes (through the pipeline at every round, masked) take
    their zero rewards, flags and steps from columns made once, not per round."""
    env = BatchedCartPole(8, autoreset_mode=SAME)
    runner = _runner(env, rollout_fragment_length=4, observation_filter="MeanStdFilter")
    runner.sample()
    kernel, step, per_round = runner._kernel, runner._kernel.step, []

    def counted(*args: Any) -> None:
        with _Allocations() as allocations:
            step(*args)
        per_round.append(allocations.count)

    kernel.step = counted  # type: ignore[method-assign]
    runner.sample()
    assert per_round == [0, 0, 0, 0]


def test_the_learner_pipeline_runs_on_the_kept_rows_of_a_sample_with_a_fault() -> None:
    """With restarts the learner pipeline runs after the read, on the rows kept (the
    faulty sub-env's NaN reaches none of its inputs), reading its checks once itself."""
    env = _PoisonAt(BatchedCartPole(8, autoreset_mode=DISABLED), sub_env=5, step=3)
    policy = rc.MLPPolicy(env.single_observation_space, env.single_action_space, vf_head=True)
    runner = rc.EnvRunner(
        env,
        policy,
        config=rc.RunnerConfig(
            num_envs=8, rollout_fragment_length=6, seed=0, restart_failed_sub_environments=True
        ),
        learner_pipelines={"default_policy": lambda ctx: [rc.GAE(ctx, gamma=0.9, lambda_=0.8)]},
    )
    batch = runner.sample()
    assert len(batch["advantages"]) == len(batch) == 7 * 6 + 2
    assert torch.isfinite(batch["advantages"]).all()
    with HostReadCounter() as reads:
        assert len(runner.sample()["advantages"]) == 48
    assert reads.by_name["cpu"] == 1 and reads.by_name["tolist"] == 1


class _NoResetMask(_PoisonAt):
    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        if options:
            raise TypeError("reset() takes no options")
        return self.env.reset(seed=seed)


def test_restarting_an_env_that_takes_no_reset_mask_is_a_named_error() -> None:
    env = _NoResetMask(BatchedCartPole(4, autoreset_mode=SAME), sub_env=1, step=2)
    runner = _runner(env, rollout_fragment_length=4, restart_failed_sub_environments=True)
    with pytest.raises(rc.EnvError, match=r"restarting sub-env\(s\) \[1\].*reset_mask"):
        runner.sample()
