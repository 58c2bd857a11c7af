"""A gymnasium VectorEnv, in every autoreset mode, samples what N plain envs sample."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from env_cases import (
    ENV_FNS,
    check_continuity,
    check_truth,
    first_obs_by_env,
    make_short,
    row_tuples,
    runner_for,
    trajectories,
)

import rlconnect as rc

Mode = gym.vector.AutoresetMode
MODES = [Mode.NEXT_STEP, Mode.SAME_STEP, Mode.DISABLED]


def sync_venv(kind: str, n: int, mode: Mode) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda: ENV_FNS[kind](None)] * n, autoreset_mode=mode)


def draw(env, kind, k=3, **kw) -> list[rc.SampleBatch]:
    runner = runner_for(env, ENV_FNS[kind], **kw)
    try:
        return [runner.sample() for _ in range(k)]
    finally:
        runner.stop()


def reference(kind, k=3, **kw) -> list[rc.SampleBatch]:
    """The same runner on a plain env creator (sub-env i seeded seed + i)."""
    env = "CartPole-v1" if kind == "cartpole" else ENV_FNS[kind]
    return draw(env, kind, k, **kw)


@pytest.mark.parametrize("kind", ["cartpole", "short_cartpole", "short"])
def test_next_step_mode_samples_exactly_what_plain_envs_sample(kind):
    ref = reference(kind)
    got = draw(sync_venv(kind, 4, Mode.NEXT_STEP), kind)
    for b_ref, b in zip(ref, got, strict=True):
        assert len(b) == 100  # truncate_episodes: rollout_fragment_length * num_envs
        assert row_tuples(b) == row_tuples(b_ref)
    ends = sum(int((b["terminateds"] | b["truncateds"]).sum()) for b in got)
    assert ends >= 4  # episodes did end, so autoresets happened in between
    # negative control: another seed samples other transitions
    other = draw(sync_venv(kind, 4, Mode.NEXT_STEP), kind, k=1, seed=6)
    assert row_tuples(other[0]) != row_tuples(got[0])


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_with_one_sub_env_is_identical(mode):
    ref = reference("short_cartpole", n=1, frag=40)
    got = draw(sync_venv("short_cartpole", 1, mode), "short_cartpole", n=1, frag=40)
    for b_ref, b in zip(ref, got, strict=True):
        assert row_tuples(b) == row_tuples(b_ref)


@pytest.mark.parametrize("kind", ["cartpole", "short_cartpole", "short"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_records_only_true_transitions(mode, kind):
    """SAME_STEP and DISABLED take an extra round per reset (the vector steps all sub-envs
    at once), so the shared policy RNG is drawn in another order than with plain envs and
    the actions differ; what must hold in every mode is checked here."""
    got = draw(sync_venv(kind, 4, mode), kind, k=4)
    for b in got:
        assert len(b) == 100
        check_truth(kind, b)  # a recorded reset-only step would not follow the dynamics
        check_continuity(b)
        assert b["t"].max() < 500
    whole = rc.concat_samples(got)
    for e in range(4):
        mine = whole.take(np.flatnonzero(whole["env_id"] == e))
        check_continuity(mine.take(np.argsort(mine["eps_id"], kind="stable")))
        assert (mine["terminateds"] | mine["truncateds"]).sum() >= 1
    # each sub-env is seeded seed + i: its episodes start where a plain env's start
    ref, mine = first_obs_by_env(reference(kind, k=4)), first_obs_by_env(got)
    for e in range(4):
        k = min(len(ref[e]), len(mine[e]))
        assert k >= 2 and mine[e][:k] == ref[e][:k]


@pytest.mark.parametrize("mode", MODES)
def test_horizon_resets_the_sub_env_in_every_mode(mode):
    """The runner ends episodes the vector env did not end: those sub-envs really reset."""
    venv = gym.vector.SyncVectorEnv([make_short] * 3, autoreset_mode=mode)
    runner = runner_for(venv, make_short, n=3, frag=20, horizon=3)
    batch = runner.sample()
    assert len(batch) == 60
    check_truth("short", batch)
    for traj in trajectories(batch)[3:]:  # all but the first three started here
        assert traj["t"].tolist() == [0, 1, 2][: len(traj)]
        assert traj["obs"][0][1] == 0  # the env's own step counter: it was reset
    assert set(batch["t"].tolist()) == {0, 1, 2}
    assert np.all(batch["truncateds"] == (batch["t"] == 2))
    assert not batch["terminateds"].any()
    # the env's step counter never reaches its 5-step limit: only horizon resets happen
    assert batch["new_obs"][:, 1].max() == 3


@pytest.mark.parametrize("mode", MODES)
def test_complete_episodes_mode(mode):
    venv = gym.vector.SyncVectorEnv([make_short] * 2, autoreset_mode=mode)
    runner = runner_for(venv, make_short, n=2, frag=6, batch_mode="complete_episodes")
    for _ in range(2):
        batch = runner.sample()
        assert len(batch) >= 12
        check_truth("short", batch)
        for traj in batch.split_by_episode():
            assert traj["t"].tolist() == [0, 1, 2, 3, 4]
            assert traj["truncateds"].tolist() == [False] * 4 + [True]


@pytest.mark.parametrize("mode", MODES)
def test_final_obs_and_infos_go_to_the_right_rows(mode):
    """A row's info is its step's; the final row gets the final step's (SAME_STEP:
    ``final_info``), never the info of the reset that came with it."""
    venv = gym.vector.SyncVectorEnv([make_short] * 2, autoreset_mode=mode)
    runner = runner_for(venv, make_short, n=2, frag=12)
    batch = runner.sample()
    check_truth("short", batch)
    assert batch["infos"].tolist() == [{"t": t + 1} for t in batch["t"].tolist()]
    last = batch["truncateds"]
    assert last.sum() >= 2 and np.all(batch["new_obs"][last, 1] == 5)
