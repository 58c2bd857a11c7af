"""BatchedCartPole: gymnasium's CartPole-v1 step for step, each autoreset mode, no host read."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlconnect.envs import BatchedCartPole

HOST_READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "nonzero"}
    | {"__bool__", "__int__", "__float__", "__index__", "__array__"}
)


class HostReadCounter(torch.overrides.TorchFunctionMode):
    """Counts tensor methods that read a value back to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def _gym_cartpoles(states: np.ndarray) -> list[gym.Env]:
    """One gymnasium CartPole-v1 per row of ``states``, set to that state by hand."""
    envs = []
    for row in states:
        env = gym.make("CartPole-v1")
        env.reset(seed=0)
        env.unwrapped.state = row.copy()
        envs.append(env)
    return envs


def _actions(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2, size=n)


def test_steps_equal_gymnasium_cartpole_until_termination() -> None:
    n = 6
    env = BatchedCartPole(n, autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=1)
    assert env.state is not None
    # Some sub-envs start close to a threshold so that terminations happen within steps.
    start = env.state.numpy().copy()
    start[1, 0], start[2, 2], start[3, :2] = 2.35, -0.2, (-2.39, -1.0)
    env.state = torch.from_numpy(start)
    gyms = _gym_cartpoles(start)
    rng = np.random.default_rng(0)
    ended = np.zeros(n, dtype=bool)
    for _ in range(12):
        acts = _actions(rng, n)
        obs, rew, term, trunc, infos = env.step(torch.from_numpy(acts))
        assert obs.dtype == torch.float32 and rew.dtype == torch.float32
        assert term.dtype == torch.bool and trunc.dtype == torch.bool and infos == {}
        for i, g in enumerate(gyms):
            if ended[i]:
                continue
            g_obs, g_rew, g_term, g_trunc, _ = g.step(int(acts[i]))
            np.testing.assert_array_equal(obs[i].numpy(), g_obs)
            assert rew[i].item() == g_rew
            assert (term[i].item(), trunc[i].item()) == (g_term, g_trunc)
            ended[i] = g_term or g_trunc
    assert ended[[1, 2, 3]].all() and not ended.all()  # both outcomes exercised


def test_truncates_at_500_steps_like_the_time_limit() -> None:
    env = BatchedCartPole(2, autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=3)
    assert env.state is not None
    gyms = _gym_cartpoles(env.state.numpy())
    env.elapsed_steps[:] = torch.tensor([498, 10])
    for g, k in zip(gyms, (498, 10), strict=True):
        _set_elapsed(g, k)
    for expected in ([False, False], [True, False]):
        obs, _, term, trunc, _ = env.step(torch.tensor([0, 1]))
        results = [g.step(a) for g, a in zip(gyms, (0, 1), strict=True)]
        assert trunc.tolist() == [r[3] for r in results] == expected
        assert term.tolist() == [r[2] for r in results] == [False, False]
        np.testing.assert_array_equal(obs.numpy(), np.stack([r[0] for r in results]))


def _set_elapsed(env: gym.Env, k: int) -> None:
    """Sets the step counter of the TimeLimit wrapper inside ``env``."""
    inner: Any = env
    while not isinstance(inner, gym.wrappers.TimeLimit):
        inner = inner.env
    inner._elapsed_steps = k


def test_next_step_mode_matches_gymnasium_vector_cartpole() -> None:
    n = 16
    ours = BatchedCartPole(n)  # NEXT_STEP is the default, as in gymnasium
    theirs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    ours.reset(seed=0)
    theirs.reset(seed=0)
    assert ours.state is not None
    theirs.unwrapped.state = ours.state.numpy().T.copy()
    rng = np.random.default_rng(2)
    resets = 0
    for _ in range(120):
        acts = _actions(rng, n)
        o, r, te, tr, _ = ours.step(torch.from_numpy(acts))
        go, gr, gte, gtr, _ = theirs.step(acts)
        np.testing.assert_array_equal(r.numpy(), gr)
        np.testing.assert_array_equal(te.numpy(), gte)
        np.testing.assert_array_equal(tr.numpy(), gtr)
        fresh = gr == 0.0  # reset steps: their reset draws come from another RNG
        resets += int(fresh.sum())
        np.testing.assert_array_equal(o.numpy()[~fresh], go[~fresh])
        assert np.all(np.abs(o.numpy()[fresh]) <= 0.05)
        # Keep the two in the same state so later steps stay comparable.
        theirs.unwrapped.state = ours.state.numpy().T.copy()
    assert resets > 0


def test_next_step_returns_the_reset_obs_with_zero_reward_and_ignores_the_action() -> None:
    env = BatchedCartPole(3)
    env.reset(seed=0)
    assert env.state is not None
    env.state[1, 2] = 0.25  # beyond 12 degrees: sub-env 1 terminates at the next step
    _, rew, term, trunc, _ = env.step(torch.tensor([1, 1, 1]))
    assert term.tolist() == [False, True, False] and rew.tolist() == [1.0, 1.0, 1.0]
    obs, rew, term, trunc, _ = env.step(torch.tensor([1, 0, 1]))
    assert rew.tolist() == [1.0, 0.0, 1.0]
    assert term.tolist() == trunc.tolist() == [False, False, False]
    assert env.elapsed_steps.tolist() == [2, 0, 2]
    assert torch.all(obs[1].abs() <= 0.05)
    # Its next step starts from that reset obs: the ignored action left no trace.
    expected = BatchedCartPole(1, autoreset_mode=AutoresetMode.DISABLED)
    expected.reset()
    expected.state = env.state[1:2].clone()
    o1, *_ = expected.step(torch.tensor([0]))
    o3, *_ = env.step(torch.tensor([1, 0, 1]))
    assert torch.equal(o3[1:2], o1)


def test_next_step_mode_starts_over_after_a_truncation() -> None:
    env = BatchedCartPole(2, max_episode_steps=500)
    env.reset(seed=4)
    env.elapsed_steps[0] = 499
    _, rew, term, trunc, _ = env.step(torch.tensor([0, 1]))
    assert trunc.tolist() == [True, False] and term.tolist() == [False, False]
    assert rew.tolist() == [1.0, 1.0]
    obs, rew, term, trunc, _ = env.step(torch.tensor([0, 1]))
    assert rew.tolist() == [0.0, 1.0] and trunc.tolist() == [False, False]
    assert env.elapsed_steps.tolist() == [0, 2] and torch.all(obs[0].abs() <= 0.05)


def test_same_step_mode_resets_at_once_and_reports_the_final_obs() -> None:
    env = BatchedCartPole(4, autoreset_mode="same_step")
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    env.reset(seed=5)
    assert env.state is not None
    env.state[2, 0] = 2.45  # beyond 2.4: sub-env 2 terminates at the next step
    env.elapsed_steps[3] = 499  # sub-env 3 is truncated at the next step
    before = env.state.clone()
    obs, rew, term, trunc, infos = env.step(torch.tensor([0, 0, 0, 0]))
    assert term.tolist() == [False, False, True, False]
    assert trunc.tolist() == [False, False, False, True]
    assert rew.tolist() == [1.0] * 4
    done = torch.tensor([False, False, True, True])
    assert infos["_final_obs"].tolist() == done.tolist()
    final = infos["final_obs"]
    assert final.shape == (4, 4) and final.dtype == torch.float32
    stepped = BatchedCartPole(4, autoreset_mode="disabled")
    stepped.reset()
    stepped.state = before
    want, *_ = stepped.step(torch.tensor([0, 0, 0, 0]))
    assert torch.equal(final[done], want[done])
    assert torch.equal(obs[~done], want[~done])
    assert torch.all(obs[done].abs() <= 0.05) and abs(final[2, 0].item()) > 2.4
    assert env.elapsed_steps.tolist() == [1, 1, 0, 0]


def test_disabled_mode_resets_only_the_masked_sub_envs() -> None:
    env = BatchedCartPole(4, autoreset_mode=AutoresetMode.DISABLED)
    env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(torch.ones(4, dtype=torch.int64))
    mask = torch.tensor([True, False, False, True])
    new, infos = env.reset(options={"reset_mask": mask})
    assert infos == {} and env.elapsed_steps.tolist() == [0, 3, 3, 0]
    assert torch.equal(new[~mask], obs[~mask])
    assert torch.all(new[mask].abs() <= 0.05) and not torch.equal(new[mask], obs[mask])
    same, _ = env.reset(options={"reset_mask": torch.zeros(4, dtype=torch.bool)})
    assert torch.equal(same, new)
    with pytest.raises(ValueError, match="reset_mask must be a bool tensor shaped"):
        env.reset(options={"reset_mask": torch.ones(3, dtype=torch.bool)})


def test_seeded_resets_repeat_and_differ_across_seeds() -> None:
    a, b = BatchedCartPole(8, autoreset_mode="same_step"), BatchedCartPole(8, "cpu", "same_step")
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    assert torch.equal(oa, ob)
    oc, _ = b.reset(seed=8)
    assert not torch.equal(oa, oc)
    assert torch.all(oa.abs() <= 0.05)


def test_spaces_follow_gymnasium_vector_conventions() -> None:
    env = BatchedCartPole(5)
    reference = gym.make_vec("CartPole-v1", num_envs=5, vectorization_mode="vector_entry_point")
    assert env.single_observation_space == reference.single_observation_space
    assert env.single_action_space == gym.spaces.Discrete(2)
    assert env.observation_space == reference.observation_space
    assert env.action_space == reference.action_space
    assert env.num_envs == 5 and isinstance(env, gym.vector.VectorEnv)


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_step_and_masked_reset_make_no_host_read(mode: AutoresetMode) -> None:
    env = BatchedCartPole(64, autoreset_mode=mode)
    env.reset(seed=0)
    actions = torch.ones(64, dtype=torch.int64)
    counter = HostReadCounter()
    with counter:
        for _ in range(30):  # long enough for pushed-right poles to fall and reset
            env.step(actions)
        env.reset(options={"reset_mask": torch.zeros(64, dtype=torch.bool)})
        env.reset(options={"reset_mask": actions.bool()})
    assert counter.reads == []
    # The counter does see a host read, so the zero above can fail.
    with counter:
        bool(env.elapsed_steps.any())
    assert counter.reads == ["__bool__"]


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        BatchedCartPole(2, autoreset_mode="same-step")
    with pytest.raises(ValueError, match="num_envs >= 1"):
        BatchedCartPole(0)
    env = BatchedCartPole(2)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(torch.tensor([0, 1]))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"actions shaped \(2,\)"):
        env.step(torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="only the option 'reset_mask'"):
        env.reset(options={"low": -0.1})
