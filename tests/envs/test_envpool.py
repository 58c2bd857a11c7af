"""EnvPool as an env: "envpool:<task id>" and user-built pools, sync and async."""

from __future__ import annotations

import numpy as np
import pytest
from env_cases import check_cartpole_truth, episode_ends, spaces
from test_workers_async import check_episodes

import rlconnect as rc
from rlconnect.envs.envpool_env import EnvPoolEnv, default_threads

envpool = pytest.importorskip("envpool")  # the optional extra (installed with "dev")


def runner(env="envpool:CartPole-v1", *, n=4, frag=20, **cfg) -> rc.EnvRunner:
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=7, **cfg)
    return rc.EnvRunner(env, rc.RandomPolicy(*spaces()), config=config)


def sample(r: rc.EnvRunner, k: int = 3) -> tuple[list[rc.SampleBatch], list[dict]]:
    try:
        return [r.sample() for _ in range(k)], r.get_metrics()
    finally:
        r.stop()


def check_metrics_match_rows(batches: list[rc.SampleBatch], metrics: list[dict]) -> None:
    """Every finished episode wholly inside the batches has the length and return of its rows."""
    rows: dict[int, list[float]] = {}
    starts: set[int] = set()
    ends: set[int] = set()
    for b in batches:
        done = (b["terminateds"] | b["truncateds"]).tolist()
        for eps, t, r, d in zip(b["eps_id"].tolist(), b["t"].tolist(), b["rewards"].tolist(), done):
            rows.setdefault(eps, []).append(r)
            if t == 0:
                starts.add(eps)
            if d:
                ends.add(eps)
    whole = [m for m in metrics if m["episode_id"] in starts & ends]
    assert whole
    for m in whole:
        assert m["episode_length"] == len(rows[m["episode_id"]])
        assert m["episode_reward"] == pytest.approx(sum(rows[m["episode_id"]]))


@pytest.mark.parametrize("poll", [None, 2])
def test_envpool_rows_are_exact_transitions_without_reset_steps(poll):
    r = runner(env_poll_size=poll)
    assert isinstance(r.env, EnvPoolEnv) and r.env.poll_size == (poll or 4)
    batches, metrics = sample(r)
    for b in batches:
        assert len(b) == 80  # truncate_episodes: rollout_fragment_length * num_envs
        check_cartpole_truth(b)  # true final obs, and no reset step recorded as a step
        check_episodes(b)
        ends = b["terminateds"] | b["truncateds"]
        assert ends.any()
    check_metrics_match_rows(batches, metrics)


def test_envpool_first_observations_are_the_pools_own_reset():
    own = envpool.make_gymnasium("CartPole-v1", num_envs=4, seed=7)
    expected, _ = own.reset()
    batch = sample(runner(), 1)[0][0]
    for e in range(4):
        mine = np.flatnonzero(batch["env_id"] == e)
        first = mine[np.argmin(batch["eps_id"][mine])]
        assert batch["t"][first] == 0
        np.testing.assert_array_equal(batch["obs"][first], expected[e])


def test_envpool_sync_run_equals_envpool_stepped_by_hand():
    """The runner's sync rows are the pool's own steps for the recorded actions."""
    batch = sample(runner(n=3, frag=30), 1)[0][0]
    own = envpool.make_gymnasium("CartPole-v1", num_envs=3, seed=7)
    obs, _ = own.reset()
    by_env = {}
    for e in range(3):
        mine = np.flatnonzero(batch["env_id"] == e)
        by_env[e] = mine[np.lexsort((batch["t"][mine], batch["eps_id"][mine]))]
    cursor = dict.fromkeys(range(3), 0)
    resetting = np.zeros(3, dtype=bool)
    for _ in range(30):
        actions = np.zeros(3, dtype=np.int64)
        for e in range(3):
            if not resetting[e]:
                k = by_env[e][cursor[e]]
                np.testing.assert_array_equal(obs[e], batch["obs"][k])
                actions[e] = batch["actions"][k]
        obs, rew, term, trunc, _ = own.step(actions)
        for e in range(3):
            if resetting[e]:
                resetting[e] = False
                continue
            k = by_env[e][cursor[e]]
            np.testing.assert_array_equal(obs[e], batch["new_obs"][k])
            assert rew[e] == batch["rewards"][k] and term[e] == batch["terminateds"][k]
            cursor[e] += 1
            resetting[e] = term[e] or trunc[e]
            if cursor[e] == len(by_env[e]):
                return


def test_a_user_built_pool_is_accepted():
    pool = envpool.make_gymnasium("CartPole-v1", num_envs=3, seed=1)
    batches, _ = sample(runner(pool, n=3, frag=10), 2)
    for b in batches:
        assert len(b) == 30
        check_cartpole_truth(b)
    with pytest.raises(ValueError, match="num_envs=4"):
        runner(envpool.make_gymnasium("CartPole-v1", num_envs=3), n=4)
    with pytest.raises(ValueError, match="max_episode_steps=10"):
        runner(envpool.make_gymnasium("CartPole-v1", num_envs=3), n=3, horizon=9)
    # a limit at the horizon itself works, and says what it loses at that step
    pool = envpool.make_gymnasium("CartPole-v1", num_envs=3, seed=1, max_episode_steps=4)
    with pytest.warns(UserWarning, match="marked truncated only"):
        limited = runner(pool, n=3, frag=10, horizon=4)
    for b in sample(limited, 2)[0]:
        assert len(b) == 30 and b["t"].max() <= 3
        check_episodes(b)
    # one step past the horizon: the runner cuts there, keeping EnvPool's terminated flag
    pool = envpool.make_gymnasium("CartPole-v1", num_envs=3, seed=1, max_episode_steps=5)
    for b in sample(runner(pool, n=3, frag=10, horizon=4), 2)[0]:
        assert len(b) == 30 and b["t"].max() <= 3
        check_cartpole_truth(b)
        check_episodes(b)


def test_the_horizon_is_the_pools_episode_limit_and_a_soft_one_is_refused():
    batches, metrics = sample(runner(horizon=6, frag=12), 2)
    for b in batches:
        assert b["t"].max() <= 5
        check_cartpole_truth(b)
    assert max(m["episode_length"] for m in metrics) == 6
    with pytest.raises(ValueError, match="soft_horizon"):
        runner(horizon=6, soft_horizon=True)
    with pytest.raises(ValueError, match="num_env_workers"):
        runner(num_env_workers=2)
    with pytest.raises(ValueError, match="remote_envs=True: an EnvPool env"):
        runner(remote_envs=True)


def test_light_tasks_get_one_thread_unless_env_config_names_a_number():
    """Classic control and toy text: one EnvPool thread (the runner keeps a CPU); other
    tasks and user-built pools: EnvPool's own default; ``num_threads`` given: as given."""
    assert default_threads("CartPole-v1") == 1
    assert default_threads("Taxi-v3") == 1
    assert default_threads("Pong-v5") is None
    assert default_threads("NoSuchTask-v0") is None

    def threads(env="envpool:CartPole-v1", **env_config) -> int:
        r = runner(env, n=2, env_config=env_config)
        try:
            return int(r.env.pool.config["num_threads"])
        finally:
            r.stop()

    assert threads() == 1
    assert threads(num_threads=0) == 0  # EnvPool picks: a thread per CPU
    assert threads(num_threads=2) == 2
    assert threads(envpool.make_gymnasium("CartPole-v1", num_envs=2)) == 0


def test_an_unknown_envpool_task_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"EnvPool cannot make task 'NoSuchTask-v0'.*list_all_envs"
    ):
        runner("envpool:NoSuchTask-v0")


class _FailOnce:
    """A pool proxy whose ``method`` (``send``: in ``all_actions_sent``, during the
    runner's step; ``recv``: in the poll) raises once, at call ``at``."""

    def __init__(self, pool, at: int, method: str = "recv") -> None:
        self._pool, self._left, self._method = pool, at, method

    def __getattr__(self, name):
        real = getattr(self._pool, name)
        if name != self._method:
            return real

        def call(*args):
            self._left -= 1
            if self._left == 0:
                raise RuntimeError("pool crashed")
            return real(*args)

        return call


@pytest.mark.parametrize("method", ["send", "recv"])
def test_a_failing_pool_is_rebuilt_whole_with_restarts(method):
    r = runner(n=3, frag=10, restart_failed_sub_environments=True)
    try:
        r.sample()
        r.get_metrics()
        old = r.env.pool
        r.env.pool = _FailOnce(old, 3, method)
        batches = [r.sample() for _ in range(2)]
        metrics = r.get_metrics()
        assert r.env.pool is not old and not isinstance(r.env.pool, _FailOnce)
    finally:
        r.stop()
    for b in batches:
        assert len(b) == 30
        check_cartpole_truth(b)
    assert sorted(m["env_id"] for m in metrics if m["episode_faulty"]) == [0, 1, 2]


@pytest.mark.parametrize("method", ["send", "recv"])
def test_a_failing_pool_without_restarts_is_an_env_error(method):
    r = runner(n=2, frag=10)
    try:
        r.sample()
        r.env.pool = _FailOnce(r.env.pool, 1, method)
        with pytest.raises(rc.EnvError, match="pool crashed"):
            r.sample()
    finally:
        r.stop()


def test_the_atari_preset_on_an_envpool_task_stacks_once_and_starts_with_the_pools_stacks():
    pytest.importorskip("ale_py")  # the preset's connectors are those of the Atari extra
    import gymnasium as gym

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=4, seed=3, preset="atari")
    r = rc.EnvRunner(
        "envpool:Pong-v5", rc.RandomPolicy(space, gym.spaces.Discrete(6)), config=config
    )
    try:
        assert r.agent_pipeline("default_policy").output_space == space
        assert r.env.observation_space().shape == (84, 84)  # EnvPool's frames, unstacked
        batch = r.sample()
    finally:
        r.stop()
    own, _ = envpool.make_gymnasium("Pong-v5", num_envs=2, seed=3).reset()  # stack_num=4
    for e in range(2):
        k = np.flatnonzero((batch["env_id"] == e) & (batch["t"] == 0))[0]
        np.testing.assert_array_equal(batch["obs"][k], own[e])
    # one stack per step: the newest three frames of obs are the oldest three of new_obs
    np.testing.assert_array_equal(batch["new_obs"][:, :3], batch["obs"][:, 1:])
    with pytest.raises(ValueError, match="stack_num=1"):
        rc.EnvRunner(
            envpool.make_gymnasium("Pong-v5", num_envs=2),
            rc.RandomPolicy(space, gym.spaces.Discrete(6)),
            config=config,
        )


def test_env_workers_forked_while_a_dropped_pool_awaits_collection_start():
    """A pool that is garbage in a reference cycle when env workers fork is never destroyed
    in a worker (where its C++ threads do not exist: the worker crashed)."""
    import gc

    import gymnasium as gym

    class Cycle:
        pass

    def drop_a_pool() -> None:
        c = Cycle()
        c.me, c.pool = c, envpool.make_gymnasium("CartPole-v1", num_envs=2)
        c.pool.reset()

    def creator(ctx):
        gc.collect()  # in the worker: a collection there would destroy the inherited pool
        return gym.make("CartPole-v1")

    gc.collect()
    gc.disable()  # no automatic collection gets to the pool first: only the runner's own
    try:
        drop_a_pool()
        config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, num_env_workers=1)
        batches, _ = sample(rc.EnvRunner(creator, rc.RandomPolicy(*spaces()), config=config), 1)
    finally:
        gc.enable()
    assert len(batches[0]) == 10


class _PublicOnly:
    """A pool proxy that lets through only EnvPool's public names, logging every send and
    receive into ``log``."""

    def __init__(self, pool, log: list) -> None:
        self._pool, self._log = pool, log

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(f"{name}: not EnvPool's public API")
        real = getattr(self._pool, name)
        if name not in ("send", "recv"):
            return real

        def call(*args, **kwargs):
            self._log.append(name)
            return real(*args, **kwargs)

        return call


@pytest.mark.parametrize("poll", [None, 2])
def test_a_pool_is_driven_through_envpools_public_api_only(poll):
    """A runner on a pool that hides every private name gives the same exact rows as one
    on the pool itself."""
    runs = []
    for public in (True, False):
        r = runner(n=4, frag=25, env_poll_size=poll)
        if public:
            r.env.pool = _PublicOnly(r.env.pool, [])
        batches, metrics = sample(r, 2)
        for b in batches:
            check_cartpole_truth(b)
        runs.append((batches, metrics))
    if poll is None:  # synchronous: the same steps whatever the threads' timing
        for a, b in zip(runs[0][0], runs[1][0]):
            np.testing.assert_array_equal(a["obs"], b["obs"])
            np.testing.assert_array_equal(a["actions"], b["actions"])


def test_the_pool_steps_while_the_runner_ends_episodes():
    """The actions go out once the runner sent every row's (``all_actions_sent``), before
    the poll's episodes end (their resets are queued with them), and the next poll only
    receives."""
    log: list = []

    class Ends(rc.Callbacks):
        def on_episode_end(self, **kwargs) -> None:
            log.append("end")

    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=40, seed=7)
    r = rc.EnvRunner(
        "envpool:CartPole-v1", rc.RandomPolicy(*spaces()), config=config, callbacks=Ends()
    )
    r.sample()
    r.env.pool = _PublicOnly(r.env.pool, log)
    log.clear()
    try:
        batches = [r.sample() for _ in range(2)]
    finally:
        r.stop()
    for b in batches:
        check_cartpole_truth(b)
    assert "end" in log
    # every episode end comes after the send of its poll and before the next receive
    for i, event in enumerate(log):
        if event == "end":
            before = [e for e in log[:i] if e != "end"]
            assert before[-1] == "send", log[max(0, i - 4) : i + 1]
    # the first receive is the step the first sample started, stop() receives the last
    assert log[0] == "recv" and log[-1] == "recv"
    assert log.count("recv") == log.count("send") + 1


@pytest.mark.parametrize("poll", [None, 2])
def test_each_step_is_sent_once_the_runner_sent_every_action(monkeypatch, poll):
    """The next step is sent from the runner's step (``all_actions_sent``), not left for
    the next poll."""
    calls = {"poll": 0, "early": 0}
    real_poll, real_hook = EnvPoolEnv.poll, EnvPoolEnv.all_actions_sent

    def counted_poll(self):
        calls["poll"] += 1
        return real_poll(self)

    def counted_hook(self):
        sent_before = self._todo.copy()
        real_hook(self)
        calls["early"] += bool(sent_before.any() and not self._todo.any())

    monkeypatch.setattr(EnvPoolEnv, "poll", counted_poll)
    monkeypatch.setattr(EnvPoolEnv, "all_actions_sent", counted_hook)
    batches, _ = sample(runner(n=4, frag=25, env_poll_size=poll), k=2)
    assert len(batches) == 2
    assert calls["early"] >= 0.9 * calls["poll"] > 0


@pytest.mark.parametrize("poll", [None, 1])
def test_a_terminal_step_at_the_horizon_stays_terminated(poll):
    """The horizon cuts episodes as gymnasium's TimeLimit does: at step H an episode that
    ended by the env's rules there is terminated (and truncated, the runner's cut), a longer
    one only truncated; nothing else changes (EnvPool's own ``terminated`` is kept)."""
    natural = episode_ends("envpool:CartPole-v1", None, env_poll_size=poll)
    lengths = sorted({length for length, _, _ in natural.values()})
    h = lengths[len(lengths) // 2]  # some episodes fall at exactly H, some later
    cut = episode_ends("envpool:CartPole-v1", h, env_poll_size=poll)
    common = sorted(set(natural) & set(cut))
    assert len(common) >= 10
    falls_at_h = [key for key in common if natural[key][0] == h]
    assert falls_at_h and any(natural[key][0] > h for key in common)
    for key in common:
        length = natural[key][0]
        assert cut[key] == (min(length, h), length <= h, length >= h), (key, natural[key])


@pytest.mark.slow
@pytest.mark.parametrize(("action", "agree_from"), [(0, None), (2, 5)])
def test_envpool_pong_starts_with_other_frames_than_gymnasium(action, agree_from):
    """What docs/atari.md says about the first frames of the two Atari routes: no no-ops,
    no sticky actions, the same actions; EnvPool's reset frame is another screen, with
    NOOP its frames 1-3 are gymnasium's frame 0, moving up they agree from step 5."""
    from rlconnect.envs.atari import make_atari_env

    gym_env = make_atari_env("ALE/Pong-v5", noop_max=0, repeat_action_probability=0.0)
    pool = envpool.make_gymnasium(
        "Pong-v5", num_envs=1, seed=0, noop_max=1, stack_num=1, repeat_action_probability=0.0
    )
    try:
        theirs = [gym_env.reset(seed=0)[0]]
        ours = [pool.reset()[0][0, 0]]
        for _ in range(8):
            theirs.append(gym_env.step(action)[0])
            ours.append(pool.step(np.full(1, action, np.int64))[0][0, 0])
    finally:
        gym_env.close()
        pool.close()
    assert np.abs(ours[0].astype(int) - theirs[0].astype(int)).max() > 100
    if agree_from is None:
        for t in (1, 2, 3):
            np.testing.assert_array_equal(ours[t], theirs[0])
    else:
        assert not np.array_equal(ours[agree_from - 1], theirs[agree_from - 1])
        for t in range(agree_from, 9):
            np.testing.assert_array_equal(ours[t], theirs[t])
