"""A batched CartPole of torch tensors: gymnasium's CartPole-v1 dynamics for N sub-envs at once.

It is the tensor path's stand-in for a massively parallel simulator (Isaac Lab, VMAS,
MuJoCo Warp): every ``step`` is a handful of whole-tensor operations on one device, with
no Python work per sub-env and no device-to-host read, so tests and benchmarks can show
what a collector costs beside a simulator that costs almost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

__all__ = ["BatchedCartPole"]

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02  # seconds between state updates
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW, RESET_HIGH = -0.05, 0.05


class BatchedCartPole(gym.vector.VectorEnv):
    """``num_envs`` CartPole-v1 sub-envs stepped as torch tensors on ``device``.

    Same dynamics as gymnasium's ``CartPole-v1`` (euler integration, the ±2.4 and ±12°
    termination thresholds, reward 1.0 per step, a reset state uniform in (-0.05, 0.05),
    the 500-step time limit reported as truncation). The state is kept in ``dtype``
    (float64 by default, as gymnasium does) and observed as float32. ``step`` takes an
    int tensor of actions (N,) in {0, 1} and returns ``(obs (N, 4) float32, rewards (N,)
    float32, terminations (N,) bool, truncations (N,) bool, infos)``, all on ``device``.

    Autoreset modes (``metadata["autoreset_mode"]``), as gymnasium's vector envs:

    - NEXT_STEP: the step after a sub-env ended returns its reset observation with reward
      0 and both flags False, ignoring that sub-env's action.
    - SAME_STEP: an ended sub-env is reset in the step that ended it; its last observation
      is ``infos["final_obs"]`` (N, 4) (rows of sub-envs that did not end hold their
      current observation) with the mask ``infos["_final_obs"]``.
    - DISABLED: nothing resets by itself; ``reset(options={"reset_mask": mask})`` resets
      the sub-envs where the bool tensor ``mask`` is True (an all-False mask is a no-op
      that costs a few tensor ops, no host read).

    NEXT_STEP is the default, as in gymnasium, so that the env compares step for step
    with ``gymnasium.make_vec("CartPole-v1")``; rlconnect's tensor path takes every mode
    (NEXT_STEP's reset steps are no rows, so SAME_STEP or DISABLED give equal rows).

    Randomness comes from one ``torch.Generator`` on ``device``, seeded by
    ``reset(seed=...)``. ``state`` (N, 4) and ``elapsed_steps`` (N,) are plain tensors a
    test may set by hand.

    >>> env = BatchedCartPole(3, autoreset_mode="same_step")
    >>> obs, infos = env.reset(seed=0)
    >>> obs.shape, obs.dtype
    (torch.Size([3, 4]), torch.float32)
    >>> obs, rewards, terminations, truncations, infos = env.step(torch.tensor([0, 1, 1]))
    >>> rewards.tolist(), sorted(infos)
    ([1.0, 1.0, 1.0], ['_final_obs', 'final_obs'])
    """

    metadata: dict[str, Any] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int = 500,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"BatchedCartPole needs num_envs >= 1 (an int), got {num_envs!r}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps!r}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_episode_steps = max_episode_steps
        self.metadata = {**type(self).metadata, "autoreset_mode": _mode(autoreset_mode)}
        self.autoreset_mode: AutoresetMode = self.metadata["autoreset_mode"]
        high = np.array(
            [X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf],
            dtype=np.float32,
        )
        self.single_observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.generator = torch.Generator(device=self.device)
        self.generator.seed()
        self.state: torch.Tensor | None = None
        self.elapsed_steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.prev_done = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Resets every sub-env (seeding the generator first when ``seed`` is given), or
        with ``options={"reset_mask": mask}`` only the sub-envs where ``mask`` is True."""
        options = dict(options or {})
        unknown = sorted(set(options) - {"reset_mask"})
        if unknown:
            raise ValueError(
                f"BatchedCartPole.reset takes only the option 'reset_mask', got {unknown}"
            )
        if seed is not None:
            self.generator.manual_seed(seed)
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seed)
        mask = options.get("reset_mask")
        if mask is None or self.state is None:
            self.state = self._fresh()
            self.elapsed_steps.zero_()
            self.prev_done.zero_()
        else:
            mask = self._check_mask(mask)
            self.state = torch.where(mask[:, None], self._fresh(), self.state)
            self.elapsed_steps.masked_fill_(mask, 0)
            self.prev_done.masked_fill_(mask, False)
        return self.state.to(torch.float32), {}

    def step(
        self, actions: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Moves every sub-env one step with ``actions`` (N,) in {0, 1}; see the class
        docstring for what each autoreset mode does with sub-envs that ended."""
        if self.state is None:
            raise RuntimeError("BatchedCartPole.step was called before reset(): call reset()")
        actions = torch.as_tensor(actions, device=self.device)
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"BatchedCartPole.step takes actions shaped ({self.num_envs},), "
                f"got {tuple(actions.shape)}"
            )
        state = _dynamics(self.state, actions)
        terminated = (state[:, 0].abs() > X_THRESHOLD) | (state[:, 2].abs() > THETA_THRESHOLD)
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.max_episode_steps
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        infos: dict[str, Any] = {}
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            state, terminated, truncated = self._reset_previous(
                state, reward, terminated, truncated
            )
        elif self.autoreset_mode == AutoresetMode.SAME_STEP:
            done = terminated | truncated
            infos = {"final_obs": state.to(torch.float32), "_final_obs": done}
            state = torch.where(done[:, None], self._fresh(), state)
            self.elapsed_steps.masked_fill_(done, 0)
        self.state = state
        return state.to(torch.float32), reward, terminated, truncated, infos

    def _reset_previous(
        self,
        state: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """NEXT_STEP: sub-envs that ended at the previous step start their new episode
        now (reward 0 written into ``reward``, flags False, their action ignored)."""
        prev = self.prev_done
        state = torch.where(prev[:, None], self._fresh(), state)
        self.elapsed_steps.masked_fill_(prev, 0)
        reward.masked_fill_(prev, 0.0)
        terminated = terminated & ~prev
        truncated = truncated & ~prev
        self.prev_done = terminated | truncated
        return state, terminated, truncated

    def _fresh(self) -> torch.Tensor:
        """A reset state for every sub-env, uniform in (-0.05, 0.05)."""
        u = torch.rand(
            (self.num_envs, 4), generator=self.generator, dtype=self.dtype, device=self.device
        )
        return u * (RESET_HIGH - RESET_LOW) + RESET_LOW

    def _check_mask(self, mask: Any) -> torch.Tensor:
        """The ``reset_mask`` option as a bool tensor (N,) on the env's device."""
        mask = torch.as_tensor(mask, device=self.device)
        if mask.dtype != torch.bool or mask.shape != (self.num_envs,):
            raise ValueError(
                f"reset_mask must be a bool tensor shaped ({self.num_envs},), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        return mask

    def __repr__(self) -> str:
        return (
            f"BatchedCartPole(num_envs={self.num_envs}, device={str(self.device)!r}, "
            f"autoreset_mode={self.autoreset_mode.value!r})"
        )


def _dynamics(state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """One euler step of gymnasium's CartPole equations for every row of ``state``."""
    x, x_dot, theta, theta_dot = state.unbind(1)
    force = torch.where(actions == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
    costheta = torch.cos(theta)
    sintheta = torch.sin(theta)
    temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS)
    )
    xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    return torch.stack(
        (x + TAU * x_dot, x_dot + TAU * xacc, theta + TAU * theta_dot, theta_dot + TAU * thetaacc),
        dim=1,
    )


def _mode(mode: AutoresetMode | str) -> AutoresetMode:
    """An ``AutoresetMode`` from the enum, its value ("SameStep") or its name ("same_step")."""
    if isinstance(mode, str) and mode.upper() in AutoresetMode.__members__:
        return AutoresetMode[mode.upper()]
    try:
        return AutoresetMode(mode)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in AutoresetMode)
        raise ValueError(f"autoreset_mode must be one of {choices}, got {mode!r}") from None
