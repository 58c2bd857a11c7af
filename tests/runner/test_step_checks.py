"""Checks at every step: non-finite values named or dropped, and a
stateful policy mapping function that only ever sees real episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from cases import CounterEnv, TurnTakingEnv

import rlconnect as rc


class _PoisonAt(CounterEnv):
    """A CounterEnv whose ``field`` turns NaN (or inf) at global step ``at``."""

    def __init__(self, at: int, field: str, value: float = np.nan, **kw) -> None:
        super().__init__(**kw)
        self.at, self.field, self.value = at, field, value

    def step(self, action):
        obs, rew, term, trunc, info = super().step(action)
        if self.steps == self.at:
            if self.field == "obs":
                obs[1] = self.value
            else:
                rew = self.value
        return obs, rew, term, trunc, info


def _runner(env_fn, **cfg) -> rc.EnvRunner:
    env = CounterEnv()
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=20, seed=0, **cfg)
    return rc.EnvRunner(
        env_fn, rc.RandomPolicy(env.observation_space, env.action_space), config=config
    )


@pytest.mark.parametrize(("field", "value"), [("obs", np.nan), ("reward", np.inf)])
def test_a_late_non_finite_value_is_named(field, value):
    """After the checked first polls, a NaN / inf still raises, naming sub-env, agent,
    field and step (before: stored silently and the metric return became NaN)."""

    def make(ctx):
        return _PoisonAt(12, field, value) if ctx.vector_index == 1 else CounterEnv()

    runner = _runner(make)
    with pytest.raises(rc.EnvCheckError) as info:
        runner.sample()
    msg = str(info.value)
    assert "sub-env 1" in msg and "'agent0'" in msg and f"field {field!r}" in msg
    assert "step 2 of its episode" in msg  # global step 12 = episode 2's second step
    assert ("NaN" if field == "obs" else "inf") in msg


def test_check_finite_false_keeps_the_values():
    runner = _runner(lambda ctx: _PoisonAt(12, "obs"), check_finite=False)
    batch = runner.sample()
    assert np.isnan(batch["new_obs"]).any()


def test_with_restarts_the_episode_is_dropped_before_anything_sees_the_value():
    def make(ctx):
        return _PoisonAt(12, "reward") if ctx.vector_index == 1 else CounterEnv()

    runner = _runner(make, restart_failed_sub_environments=True)
    batches = [runner.sample() for _ in range(3)]
    for b in batches:
        assert np.isfinite(b["rewards"]).all() and np.isfinite(b["obs"]).all()
    metrics = runner.get_metrics()
    faulty = [m for m in metrics if m["episode_faulty"]]
    assert faulty and all(np.isfinite(m["episode_reward"]) for m in metrics)


def test_a_stateful_mapper_sees_only_real_episodes():
    """Spaces are found without calling the mapper with made-up episodes, so an
    alternating mapper (RLlib's classic) starts its cycle at the first real episode."""
    seen: list[int] = []
    count = [0]

    def alternating(agent_id, episode, **kwargs):
        seen.append(episode.episode_id)
        count[0] += 1
        return "p0" if count[0] % 2 else "p1"

    env = TurnTakingEnv()
    box = env.observation_spaces["a"]
    policies = {p: rc.RandomPolicy(box, env.action_spaces["a"]) for p in ("p0", "p1")}
    runner = rc.EnvRunner(
        lambda ctx: TurnTakingEnv(),
        policies,
        policy_mapping_fn=alternating,
        config=rc.RunnerConfig(rollout_fragment_length=12, seed=0),
    )
    assert seen == []  # nothing at construction
    runner.sample()
    assert seen and min(seen) >= 0
    first = [e for e in seen if e == seen[0]]
    assert len(first) == len({"a", "b", "c"})  # once per agent of the first episode


def test_the_finite_check_costs_nothing_on_integer_observations():
    """Integer observations cannot be NaN: only rewards are checked (no error here)."""
    env = gym.make("FrozenLake-v1")
    runner = rc.EnvRunner(
        "FrozenLake-v1",
        rc.RandomPolicy(gym.spaces.Box(0, 1, (16,), np.float32), env.action_space),
        config=rc.RunnerConfig(rollout_fragment_length=10, seed=0),
    )
    assert len(runner.sample()) == 10


class _Endless(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_complete_episodes_names_an_episode_that_never_ends(monkeypatch):
    from rlconnect.runner import kernel

    monkeypatch.setattr(kernel, "ENDLESS_EPISODE_STEPS", 500)
    monkeypatch.setattr(kernel, "ENDLESS_CHECK_EVERY", 64)
    runner = rc.EnvRunner(
        lambda ctx: _Endless(),
        rc.RandomPolicy(_Endless.observation_space, _Endless.action_space),
        config=rc.RunnerConfig(rollout_fragment_length=4, batch_mode="complete_episodes"),
    )
    with pytest.raises(rc.EnvError, match=r"sub-env 0 has run .* set RunnerConfig.horizon"):
        runner.sample()


class _Huge(gym.Env):
    """Finite observations whose sum overflows float32 (the check's fast sum)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.full(8, 3e38, np.float32), {}

    def step(self, action):
        return np.full(8, 3e38, np.float32), 1.0, False, False, {}


@pytest.mark.parametrize("num_envs", [1, 8])  # a Python sum, then a numpy one
def test_huge_but_finite_values_are_not_taken_for_inf(num_envs):
    runner = rc.EnvRunner(
        lambda ctx: _Huge(),
        rc.RandomPolicy(_Huge.observation_space, _Huge.action_space),
        config=rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=5, seed=0),
    )
    with np.errstate(over="ignore"):
        assert len(runner.sample()) == 5 * num_envs


class _DiscreteEnv(CounterEnv):
    """A CounterEnv whose actions are ``Discrete(5, start=start)``."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.action_space = gym.spaces.Discrete(5, start=start)


@pytest.mark.parametrize("start", [-2, 0])  # the general check; one unsigned reduction
@pytest.mark.parametrize("n", [3, 100], ids=["few-rows", "many-rows"])  # two code paths
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.uint64])
def test_discrete_actions_are_checked_exactly_at_the_bounds(dtype, n, start):
    from rlconnect.errors import PolicyError
    from rlconnect.runner.faults import ActionCheck

    env = rc.envs.make_base_env(lambda ctx: _DiscreteEnv(start), num_envs=n)
    check = ActionCheck(env, None, "p")
    ids = np.arange(n)
    info = np.iinfo(dtype)
    low, high = start, start + 5  # [low, high)
    inside = [v for v in (low, start + 2, high - 1) if info.min <= v <= info.max]
    fill = inside[-1]
    check(np.array(inside + [fill] * (n - len(inside)), dtype=dtype), ids, ("a",) * n)
    candidates = (low - 1, high, -1, int(info.min), int(info.max))
    outside = [v for v in candidates if info.min <= v <= info.max and not low <= v < high]
    for bad in outside:
        actions = np.array([fill, bad] + [fill] * (n - 2), dtype=dtype)
        with pytest.raises(PolicyError, match=f"{bad!r} for env 1"):
            check(actions, ids, ("a",) * n)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("rows", [4, 64])  # a Python sum; a dot product (float16: a sum)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, "reward"])
def test_check_finite_finds_a_bad_value_of_any_float_observation(dtype, rows, bad):
    from rlconnect.envs.rows import EnvRowsBuilder
    from rlconnect.runner.faults import check_finite

    ids = np.arange(rows)
    obs = np.full((rows, 4), 1e4 if dtype == np.float16 else 1e30, dtype=dtype)
    rew = np.ones(rows)
    no = np.zeros(rows, dtype=bool)

    def check():
        r = EnvRowsBuilder.columns(ids, obs, rew, no, no, [{}] * rows, None)
        check_finite(r, 0, np.zeros(rows, dtype=np.int64))

    with np.errstate(over="ignore"):
        check()  # huge but finite: squares overflow, the exact check passes them
        if bad == "reward":
            rew[rows - 2] = np.nan
        else:
            obs[rows - 2, 3] = bad
        with pytest.raises(rc.EnvCheckError, match=f"sub-env {rows - 2} "):
            check()
