"""Sampling semantics on single-agent envs: sizes, continuity, truth, determinism, faults."""

from __future__ import annotations

import gc
import hashlib
import json
import weakref

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, trajectories
from tests.envs.env_cases import check_cartpole_truth

import rlconnect as rc
from rlconnect.runner.postprocess import state_digest


def counter_runner(n=2, frag=4, **cfg):
    env_kwargs = cfg.pop("env_kwargs", {})
    env = CounterEnv(**env_kwargs)
    policy = rc.RandomPolicy(env.observation_space, env.action_space)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=0, **cfg)
    return rc.EnvRunner(lambda ctx: CounterEnv(**env_kwargs), policy, config=config)


def check_counter_truth(batch: rc.SampleBatch) -> None:
    """Every transition is what CounterEnv returns for (obs, action)."""
    ep, t, a = batch["obs"][:, 0], batch["obs"][:, 1], batch["actions"]
    np.testing.assert_array_equal(batch["new_obs"][:, 0], ep)
    np.testing.assert_array_equal(batch["new_obs"][:, 1], t + 1)
    np.testing.assert_array_equal(batch["new_obs"][:, 2], a)
    np.testing.assert_array_equal(batch["rewards"], 1.0 + a)
    np.testing.assert_array_equal(batch["t"], t)


@pytest.mark.parametrize(("n", "frag"), [(1, 1), (1, 7), (3, 4), (4, 13)])
def test_truncate_episodes_gives_exact_sizes_and_continues_episodes(n, frag):
    runner = counter_runner(n, frag, env_kwargs={"length": 5})
    last_row: dict[int, np.ndarray] = {}
    for _ in range(6):
        batch = runner.sample()
        assert len(batch) == n * frag
        check_counter_truth(batch)
        for traj in trajectories(batch):
            env = int(traj["env_id"][0])
            np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
            assert np.all(np.diff(traj["t"]) == 1)
            # a cut trajectory continues exactly where it stopped
            if env in last_row and last_row[env]["eps_id"] == traj["eps_id"][0]:
                np.testing.assert_array_equal(last_row[env]["new_obs"], traj["obs"][0])
                assert traj["t"][0] == last_row[env]["t"] + 1
            last_row[env] = {k: traj[k][-1] for k in ("eps_id", "new_obs", "t")}


def test_complete_episodes_gives_whole_episodes_only():
    runner = counter_runner(3, 4, batch_mode="complete_episodes", env_kwargs={"length": 5})
    for _ in range(3):
        batch = runner.sample()
        assert len(batch) >= 12
        check_counter_truth(batch)
        for traj in batch.split_by_episode():
            assert traj["t"][0] == 0
            assert traj["terminateds"][-1] and not traj["terminateds"][:-1].any()
            assert len(traj) == 5


def test_terminated_and_truncated_kept_apart():
    runner = counter_runner(2, 10, env_kwargs={"length": 3, "truncate": True})
    batch = runner.sample()
    assert not batch["terminateds"].any()
    assert batch["truncateds"].sum() == np.sum(batch["t"] == 2)
    cart = rc.EnvRunner(
        lambda ctx: gym.make("CartPole-v1", max_episode_steps=8),
        rc.RandomPolicy(*_spaces("CartPole-v1")),
        config=rc.RunnerConfig(num_envs=2, rollout_fragment_length=50, seed=1),
    )
    b = cart.sample()
    ends = b["terminateds"] | b["truncateds"]
    assert not (b["terminateds"] & b["truncateds"]).any()
    assert np.all(b["t"][b["truncateds"]] == 7)
    assert ends.sum() >= 1


def _spaces(env_id):
    env = gym.make(env_id)
    return env.observation_space, env.action_space


def test_cartpole_transitions_are_what_the_simulator_returns():
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(*_spaces("CartPole-v1"), seed=3),
        config=rc.RunnerConfig(num_envs=4, rollout_fragment_length=50, seed=7),
    )
    batch = runner.sample()
    check_cartpole_truth(batch)
    # negative control: a shifted action column would not match
    sim = gym.make("CartPole-v1").unwrapped
    sim.reset(seed=0)
    sim.state = batch["obs"][0].astype(np.float64)
    obs, *_ = sim.step(1 - int(batch["actions"][0]))
    assert not np.allclose(obs, batch["new_obs"][0], atol=1e-5)


def _cartpole_runner(policy_kind, frag, seed):
    obs, act = _spaces("CartPole-v1")
    policy = rc.RandomPolicy(obs, act) if policy_kind == "random" else rc.MLPPolicy(obs, act)
    cfg = rc.RunnerConfig(num_envs=3, rollout_fragment_length=frag, seed=seed)
    return rc.EnvRunner("CartPole-v1", policy, config=cfg)


def _rows(batches):
    """Rows as a sorted list of tuples (batch boundaries change the row order)."""
    b = rc.concat_samples(batches)
    cols = [b["eps_id"], b["t"], b["actions"], b["rewards"], *b["obs"].T]
    return sorted(zip(*(c.tolist() for c in cols)))


@pytest.mark.parametrize("policy_kind", ["random", "mlp"])
def test_same_seed_same_batches_however_split(policy_kind):
    def draw(frag, k, seed=11):
        runner = _cartpole_runner(policy_kind, frag, seed)
        return _rows([runner.sample() for _ in range(k)])

    reference = draw(40, 1)
    assert draw(10, 4) == reference
    assert draw(20, 2) == reference
    assert draw(40, 1, seed=12) != reference  # negative control: the seed matters


def test_horizon_truncates_and_soft_horizon_keeps_the_env_running():
    hard = counter_runner(1, 12, horizon=3, env_kwargs={"length": 100})
    b = hard.sample()
    assert set(b["t"].tolist()) == {0, 1, 2}
    assert b["truncateds"].sum() == 4 and not b["terminateds"].any()
    assert len(set(b["obs"][:, 0].tolist())) == 4  # env reset each time: new episode number
    soft = counter_runner(1, 12, horizon=3, soft_horizon=True, env_kwargs={"length": 100})
    b = soft.sample()
    assert b["truncateds"].sum() == 4
    assert len(set(b["eps_id"].tolist())) == 4
    assert set(b["obs"][:, 0].tolist()) == {0.0}  # never reset
    np.testing.assert_array_equal(b["new_obs"][:-1], b["obs"][1:])  # the env kept running


def test_faulty_sub_env_is_restarted_and_its_episode_dropped():
    # sub-env 0 crashes at its 7th step (episode 2, t=1); the other never does
    def make(ctx):
        return CounterEnv(length=5, fail_at=7 if ctx.vector_index == 0 else None)

    env = CounterEnv()
    cfg = rc.RunnerConfig(
        num_envs=2, rollout_fragment_length=10, seed=0, restart_failed_sub_environments=True
    )
    runner = rc.EnvRunner(
        make, rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    batch = runner.sample()
    assert len(batch) == 20
    check_counter_truth(batch)
    metrics = runner.get_metrics()
    faulty = [m for m in metrics if m["episode_faulty"]]
    assert len(faulty) == 1 and faulty[0]["env_id"] == 0
    assert faulty[0]["episode_id"] not in set(batch["eps_id"].tolist())
    # the restarted env starts again at its episode 0 and records normally
    env0 = batch.take(np.flatnonzero(batch["env_id"] == 0))
    assert (env0["obs"][:, 0] == 1).sum() == 0  # episode 1 of the crashed env was dropped


def test_fault_without_restart_names_the_env():
    def make(ctx):
        return CounterEnv(length=5, fail_at=3 if ctx.vector_index == 1 else None)

    env = CounterEnv()
    cfg = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=0)
    runner = rc.EnvRunner(
        make, rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    with pytest.raises(rc.EnvError, match="sub-env 1 raised RuntimeError"):
        runner.sample()


def test_metrics_agree_with_the_batch():
    runner = counter_runner(3, 10, batch_mode="complete_episodes", env_kwargs={"length": 4})
    batch = runner.sample()
    metrics = {m["episode_id"]: m for m in runner.get_metrics()}
    for ep in batch.split_by_episode():
        m = metrics[int(ep["eps_id"][0])]
        assert m["episode_length"] == len(ep)
        assert m["episode_reward"] == pytest.approx(ep["rewards"].sum())
    assert runner.get_metrics() == []  # cleared


def test_extra_columns_env_actions_and_raw_obs():
    obs_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    class BoxActEnv(gym.Env):
        observation_space = obs_space
        action_space = gym.spaces.Box(0.0, 10.0, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.clip(action / 10, -1, 1).astype(np.float32), 1.0, False, False, {}

    cfg = rc.RunnerConfig(
        rollout_fragment_length=20,
        seed=0,
        record_env_actions=True,
        keep_raw_obs=True,
        observation_filter="MeanStdFilter",
    )
    policy = rc.MLPPolicy(obs_space, BoxActEnv.action_space)
    runner = rc.EnvRunner(lambda ctx: BoxActEnv(), policy, config=cfg)
    b = runner.sample()
    # actions are the policy's own output; env_actions what the env got (unsquashed)
    expected = rc.spaces.unsquash(BoxActEnv.action_space, b["actions"])
    np.testing.assert_allclose(b["env_actions"], expected, rtol=1e-6)
    assert (b["env_actions"] >= 0).all() and (b["env_actions"] <= 10).all()
    np.testing.assert_allclose(b["raw_obs"][1:], b["env_actions"][:-1] / 10, rtol=1e-6)
    assert not np.allclose(b["raw_obs"], b["obs"])  # obs are the filter's output
    assert b.meta["connector_state"]


class _Relabel(rc.AgentConnector):
    """Replaces two columns the runner made: ``t`` counted from 100, every row truncated."""

    def __call__(self, data):
        data["t"] = data["t"] + 100
        data["truncateds"] = np.ones(len(data), dtype=bool)
        return data


@pytest.mark.parametrize("num_envs", [1, 3])
def test_columns_an_agent_connector_replaces_are_recorded_as_it_made_them(num_envs):
    """The runner records a poll's flags and lengths as one number when every row shares
    it; a column an agent connector replaced is recorded as the connector made it."""
    env = gym.make("CartPole-v1")
    batches = []
    for relabel in (False, True):
        policy = rc.RandomPolicy(env.observation_space, env.action_space, seed=1)
        cfg = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=30, seed=4)
        runner = rc.EnvRunner("CartPole-v1", policy, config=cfg)
        if relabel:
            runner.agent_pipeline().append(_Relabel(runner.agent_pipeline().ctx))
        batches.append(runner.sample())
        runner.stop()
    plain, relabelled = batches
    np.testing.assert_array_equal(relabelled["t"], plain["t"] + 100)
    assert relabelled["truncateds"].all() and not plain["truncateds"].all()
    np.testing.assert_array_equal(relabelled["eps_id"], plain["eps_id"])  # same episodes


def test_eval_mode_freezes_filter_statistics():
    obs, act = _spaces("CartPole-v1")
    cfg = rc.RunnerConfig(
        rollout_fragment_length=20, seed=0, observation_filter="MeanStdFilter", explore=False
    )
    runner = rc.EnvRunner("CartPole-v1", rc.MLPPolicy(obs, act), config=cfg)
    before = runner.get_connector_states()
    runner.sample()
    after = runner.get_connector_states()
    a = before["default_policy"]["agent"]["MeanStdFilter"]
    b = after["default_policy"]["agent"]["MeanStdFilter"]
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    cfg_train = rc.RunnerConfig(
        rollout_fragment_length=20, seed=0, observation_filter="MeanStdFilter"
    )
    trainer = rc.EnvRunner("CartPole-v1", rc.MLPPolicy(obs, act), config=cfg_train)
    trainer.sample()
    assert trainer.get_connector_states()["default_policy"]["agent"]["MeanStdFilter"]["count"] > 0


def test_check_env_names_env_agent_and_field():
    class NaNEnv(CounterEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            obs[1] = np.nan
            return (obs, *rest)

    env = NaNEnv()
    cfg = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0)
    runner = rc.EnvRunner(
        lambda ctx: NaNEnv(), rc.RandomPolicy(env.observation_space, env.action_space), config=cfg
    )
    with pytest.raises(rc.EnvCheckError) as info:
        runner.sample()
    msg = str(info.value)
    assert "obs" in msg and "env 0" in msg and "agent0" in msg and "NaN" in msg


def test_policy_space_mismatch_is_reported_at_construction():
    _, act = _spaces("CartPole-v1")
    wrong = rc.RandomPolicy(gym.spaces.Box(-1, 1, (5,), np.float32), act)
    with pytest.raises(ValueError, match=r"expects observations .*\(5,\).* outputs .*\(4,\)"):
        rc.EnvRunner("CartPole-v1", wrong)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_envs=0"):
        rc.RunnerConfig(num_envs=0)
    with pytest.raises(ValueError, match=r"batch_mode.*'truncate_episodes'"):
        rc.RunnerConfig(batch_mode="whole")
    with pytest.raises(ValueError, match="observation_filter"):
        rc.RunnerConfig(observation_filter="Mean")
    with pytest.raises(ValueError, match="clip_rewards"):
        rc.RunnerConfig(clip_rewards=-1.0)
    with pytest.raises(ValueError, match=r"sub_env_timeout_s=0.5 needs remote_envs=True"):
        rc.RunnerConfig(sub_env_timeout_s=0.5)
    with pytest.raises(ValueError, match=r"sub_env_timeout_s=0: must be None or a number"):
        rc.RunnerConfig(remote_envs=True, sub_env_timeout_s=0)
    with pytest.raises(ValueError, match=r"env_build_timeout_s=60 needs remote_envs=True"):
        rc.RunnerConfig(env_build_timeout_s=60)
    with pytest.raises(ValueError, match=r"env_build_timeout_s=-1: must be None or a number"):
        rc.RunnerConfig(num_env_workers=1, env_build_timeout_s=-1)
    with pytest.raises(ValueError, match=r"sub_env_restart_limit=-1"):
        rc.RunnerConfig(sub_env_restart_limit=-1)
    # sub-envs in worker processes restart one at a time now
    rc.RunnerConfig(remote_envs=True, restart_failed_sub_environments=True)


def test_sample_async_returns_the_same_batches():
    sync = counter_runner(2, 5)
    asyn = counter_runner(2, 5, sample_async=True)
    try:
        for _ in range(3):
            a, b = sync.sample(), asyn.sample()
            assert rc.batches.batches_equal(a, b)
    finally:
        asyn.stop()


def test_perf_stats_name_every_connector():
    obs, act = _spaces("CartPole-v1")
    cfg = rc.RunnerConfig(
        rollout_fragment_length=10, observation_filter="MeanStdFilter", clip_rewards=True
    )
    runner = rc.EnvRunner("CartPole-v1", rc.RandomPolicy(obs, act), config=cfg)
    runner.sample()
    stats = runner.perf_stats()
    assert {"MeanStdFilter", "ClipReward", "ConvertToNumpy"} <= set(stats["connectors"])
    for key in (
        "mean_env_wait_ms",
        "mean_raw_obs_processing_ms",
        "mean_inference_ms",
        "mean_action_processing_ms",
    ):
        assert stats[key] > 0


def test_perf_stats_time_the_learner_pipeline():
    obs, act = _spaces("CartPole-v1")
    cfg = rc.RunnerConfig(rollout_fragment_length=32)
    plain = rc.EnvRunner("CartPole-v1", rc.MLPPolicy(obs, act, vf_head=True, seed=0), config=cfg)
    plain.sample()
    assert plain.perf_stats()["mean_learner_processing_ms"] == 0.0
    runner = rc.EnvRunner(
        "CartPole-v1",
        rc.MLPPolicy(obs, act, vf_head=True, seed=0),
        config=cfg,
        learner_pipelines={
            "default_policy": lambda ctx: [rc.GAE(ctx), rc.NormalizeAdvantages(ctx)]
        },
    )
    runner.sample()
    stats = runner.perf_stats()
    assert {"GAE", "NormalizeAdvantages"} <= set(stats["connectors"])
    members = stats["connectors"]["GAE"] + stats["connectors"]["NormalizeAdvantages"]
    assert stats["mean_learner_processing_ms"] == pytest.approx(members)
    assert stats["mean_learner_processing_ms"] > 0


def test_bookkeeping_does_not_grow_and_postprocessing_knows_every_agent():
    seen_agents, started = [], []

    class Recorder(rc.Callbacks):
        def on_postprocess_trajectory(self, *, agent_id, episode, **kw):
            seen_agents.append((agent_id, episode is not None))

        def on_episode_start(self, *, episode, **kw):
            started.append(weakref.ref(episode))

    env = CounterEnv()
    cfg = rc.RunnerConfig(num_envs=3, rollout_fragment_length=7, seed=0)
    runner = rc.EnvRunner(
        lambda ctx: CounterEnv(length=5),
        rc.RandomPolicy(env.observation_space, env.action_space),
        config=cfg,
        callbacks=Recorder(),
    )
    for _ in range(30):
        runner.sample()
    gc.collect()
    alive = [r for r in started if r() is not None]
    assert len(started) > 30 and len(alive) <= 2 * 3  # episodes handed out are let go
    assert seen_agents and all(a == rc.DEFAULT_AGENT_ID and has_ep for a, has_ep in seen_agents)


def test_empty_infos_share_one_read_only_mapping():
    batch = counter_runner(2, 5).sample()
    infos = batch["infos"]
    assert infos[0]["t"] == 1  # real infos are kept
    obs, act = _spaces("CartPole-v1")
    cfg = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=0)
    cart = rc.EnvRunner("CartPole-v1", rc.RandomPolicy(obs, act), config=cfg).sample()["infos"]
    assert len({id(i) for i in cart}) == 1 and dict(cart[0]) == {}
    with pytest.raises(TypeError):
        cart[0]["x"] = 1  # batch data is not mutated through a shared mapping


@pytest.mark.parametrize("n", [2, 4])
def test_policies_mapped_per_sub_env_of_a_vector_env(n):
    """Single-agent sub-envs mapped to different policies: every full poll is split by
    policy, and each policy's rows are exact trajectories of its own sub-envs."""
    env = CounterEnv(length=5)
    policies = {
        pid: rc.RandomPolicy(env.observation_space, env.action_space, seed=k)
        for k, pid in enumerate(("even", "odd"))
    }
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=6, seed=0)
    runner = rc.EnvRunner(
        lambda ctx: CounterEnv(length=5),
        policies,
        config=config,
        policy_mapping_fn=lambda agent_id, episode, **kw: ("odd", "even")[episode.env_id % 2 == 0],
    )
    for _ in range(3):
        batch = runner.sample()
        assert set(batch.policy_batches) == {"even", "odd"}
        assert batch.env_steps() == n * 6
        for pid, part in batch.policy_batches.items():
            assert set((part["env_id"] % 2).tolist()) == {0 if pid == "even" else 1}
            check_counter_truth(part)
            assert len(part) == (n // 2) * 6


def test_state_digest_follows_structure_and_statistics():
    """A batch's ``connector_state`` digest: the same for the same pipeline structure and
    statistics, different when either differs (a pipeline without statistics is hashed
    once per structure; the digest is the one the statistics path gives)."""
    obs, act = _spaces("CartPole-v1")

    def runner(**cfg):
        config = rc.RunnerConfig(rollout_fragment_length=5, seed=0, **cfg)
        return rc.EnvRunner("CartPole-v1", rc.MLPPolicy(obs, act), config=config)

    plain, again, filtered = runner(), runner(), runner(observation_filter="MeanStdFilter")
    clipping = runner(clip_rewards=True)  # another structure without statistics
    assert not plain.agent_pipeline().get_statistics()
    digest = state_digest(plain.agent_pipeline())
    assert digest == state_digest(again.agent_pipeline()) == plain.sample().meta["connector_state"]
    names = json.dumps(list(plain.agent_pipeline().names)).encode()
    assert digest == hashlib.sha256(names).hexdigest()[:16]
    assert not clipping.agent_pipeline().get_statistics()
    assert state_digest(clipping.agent_pipeline()) not in (digest, None)
    assert state_digest(plain.agent_pipeline()) == digest
    before = state_digest(filtered.agent_pipeline())
    assert before != digest  # another structure
    filtered.sample()  # the filter's statistics move
    assert state_digest(filtered.agent_pipeline()) != before
