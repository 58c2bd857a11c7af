"""Batched tensor simulators as runner envs: the adapters of the tensor path.

A *tensor env* steps its N sub-envs as one batch of torch tensors on one device (Isaac
Lab, ManiSkill, MuJoCo Warp / mujoco-torch, VMAS, ``rlconnect.envs.BatchedCartPole``).
The tensor kernel (``rlconnect.runner.tensor_kernel``) drives it in rounds that never
read the host::

    obs = env.start(seed)              # {agent: (N, ...) tensor}: every episode's first
    step = env.step({agent: actions})  # TensorStep: where each sub-env's step ended
    obs = env.restart(ended)           # {agent: obs to act on}: first obs where ended
    obs = env.reset_where(mask, ids)   # fault restarts: new episodes where mask (host-known)

``step`` returns, for a sub-env whose episode ended, its *final* observation (what the
transition's ``new_obs`` is); ``restart`` then hands out the observations the next
actions are for, of every sub-env: the new episode's first one where ``ended`` (a bool
tensor over sub-envs, the runner's own decision, horizon included), the step's
observation elsewhere (as gymnasium's ``reset(options={"reset_mask": ...})`` returns).
A NEXT_STEP env (``next_step_resets``) starts the new episode one step later instead:
``restart`` hands out the step's observations, and the next ``step`` of an ended sub-env
only resets it (the kernel ignores its action and records no row for it).

Two kinds are adapted here: a gymnasium ``VectorEnv`` that takes and returns torch
tensors (``TorchVectorEnv``) and a VMAS environment (``VmasEnv``, multi-agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import torch

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.errors import EnvError, describe_exception

__all__ = [
    "TensorEnv",
    "TensorStep",
    "TorchVectorEnv",
    "VmasEnv",
]

Nest = Any  #: a tensor, or a dict / tuple of them (nested observation spaces)
#: steps whose tensors are checked (type, device, rows): an env that returns numpy or
#: another device does so from its first step; later steps are not looked at
CHECKED_STEPS = 3


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` (no call when it is already: a round counts its operations)."""
    return t if t.dtype == dtype else t.to(dtype)


@attrs.frozen
class TensorStep:
    """Where one step of every sub-env ended: per agent its observation (the final one of
    a sub-env whose episode ended) and reward (N,) float32; per sub-env the env's own
    ``terminateds`` and ``truncateds`` (N,) bool."""

    obs: dict[Any, Nest]
    rewards: dict[Any, torch.Tensor]
    terminateds: torch.Tensor
    truncateds: torch.Tensor
    #: per agent, what the env returned as infos (a dict; recorded with ``record_infos``)
    infos: dict[Any, Any] = attrs.field(factory=dict)


def map_nest(fn: Any, *nests: Nest) -> Nest:
    """``fn`` over the leaves of nests of one structure (dicts and tuples of tensors)."""
    first = nests[0]
    if isinstance(first, Mapping):
        return {k: map_nest(fn, *(n[k] for n in nests)) for k in first}
    if isinstance(first, tuple | list):
        return tuple(map_nest(fn, *parts) for parts in zip(*nests))
    return fn(*nests)


def where_rows(mask: torch.Tensor, a: Nest, b: Nest) -> Nest:
    """Rows of ``a`` where ``mask`` (N,) is True, else of ``b``, leaf by leaf."""

    def pick(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(mask.reshape(-1, *([1] * (x.dim() - 1))), x, y)

    return map_nest(pick, a, b)


def _leaves(nest: Nest) -> list[tuple[str, Any]]:
    if isinstance(nest, Mapping):
        return [(f"[{k!r}]{p}", v) for k, sub in nest.items() for p, v in _leaves(sub)]
    if isinstance(nest, tuple | list):
        return [(f"[{i}]{p}", v) for i, sub in enumerate(nest) for p, v in _leaves(sub)]
    return [("", nest)]


def check_tensors(what: str, nest: Nest, device: torch.device, rows: int) -> None:
    """TypeError / ValueError naming the key when ``nest`` holds something that is not a
    torch tensor of ``rows`` rows on ``device`` (shapes and devices are host facts: no read)."""
    for path, leaf in _leaves(nest):
        name = f"{what}{path}"
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(
                f"tensor env: {name} is a {type(leaf).__name__}, not a torch tensor; on the "
                "tensor path every observation, reward and flag is a tensor on one device "
                "(wrap a numpy env with gymnasium.wrappers.vector.NumpyToTorch, or pass "
                "RunnerConfig(tensor=False) to take the numpy path)"
            )
        if leaf.device != device:
            raise ValueError(
                f"tensor env: {name} is on {leaf.device} but the env's tensors are on "
                f"{device}: every tensor of one env must be on one device"
            )
        if leaf.dim() == 0 or leaf.shape[0] != rows:
            raise ValueError(
                f"tensor env: {name} has shape {tuple(leaf.shape)}; expected {rows} rows "
                "(one per sub-env) first"
            )


class TensorEnv(BaseEnv):
    """The base of tensor-path adapters: ``start`` / ``step`` / ``restart`` (module
    docstring) instead of ``poll`` / ``send_actions``, on ``device``.

    ``agents`` are the agent ids in the order their rows are stacked; ``host_reads`` counts
    the reads of device data an adapter itself needs (VMAS resets by Python index);
    ``next_step_resets``: the step after a sub-env ended only resets it (NEXT_STEP)."""

    device: torch.device
    agents: tuple[Any, ...] = (DEFAULT_AGENT_ID,)
    host_reads = 0
    on_tensors = True
    next_step_resets = False

    def deferred_check(self) -> tuple[torch.Tensor, str] | None:
        """A 0-d bool tensor that is True when this env returned something it must be
        refused for (found without a host read), and the refusal; read with the runner's
        one read per ``sample()``. None: nothing to check."""
        return None

    def start(self, seed: int | None) -> dict[Any, Nest]:
        """Reset every sub-env; each agent's first observations."""
        raise NotImplementedError

    def step(self, actions: Mapping[Any, torch.Tensor]) -> TensorStep:
        """Step every sub-env with each agent's actions (N, ...)."""
        raise NotImplementedError

    def restart(self, ended: torch.Tensor) -> dict[Any, Nest]:
        """Start new episodes where ``ended``; the observations the next actions are for."""
        raise NotImplementedError

    def reset_where(self, mask: torch.Tensor, env_ids: list[int]) -> dict[Any, Nest]:
        """Reset the sub-envs ``env_ids`` (``mask`` (N,) bool, the same ones) now, whatever
        their episodes did (a sub-env restarted after a non-finite value); the
        observations the next actions are for, of every sub-env."""
        raise NotImplementedError

    def poll(self) -> EnvRows:
        """Refused: the tensor kernel steps a tensor env with ``start`` / ``step``."""
        raise TypeError(f"{type(self).__name__} is a tensor env: the tensor kernel drives it")

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Refused: actions reach a tensor env as tensors through ``step``."""
        raise TypeError(f"{type(self).__name__} is a tensor env: the tensor kernel drives it")

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Refused: a tensor env's sub-envs restart by mask (``restart``, ``reset_where``)."""
        raise TypeError(f"{type(self).__name__} is a tensor env: episodes restart by mask")

    def observation_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """``agent_id``'s observation space (one sub-env's, gymnasium's kind)."""
        return self._spaces(agent_id)[0]

    def action_space(self, agent_id: Any = DEFAULT_AGENT_ID) -> gym.Space:
        """``agent_id``'s action space (one sub-env's, gymnasium's kind)."""
        return self._spaces(agent_id)[1]

    def _spaces(self, agent_id: Any) -> tuple[gym.Space, gym.Space]:
        raise NotImplementedError


def _device_of(venv: Any) -> torch.device | None:
    device = getattr(venv, "device", None)
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError:
            return None
    return None


class TorchVectorEnv(TensorEnv):
    """A gymnasium ``VectorEnv`` of torch tensors, in any autoreset mode.

    SAME_STEP: a sub-env that ended is reset by the env inside ``step``; its final
    observation is read from ``infos["final_obs"]`` (refused, naming the key, when a
    sub-env ends without it). DISABLED: ``restart`` calls
    ``reset(options={"reset_mask": ended})`` at every round (the mask is mostly all False;
    the env must accept that without work). NEXT_STEP: the step after a sub-env ended
    returns its reset observation and ignores its action; that step is no transition (the
    kernel polls extra steps to make up for it: ``rlconnect.collectors.tensor_carry``).
    ``reset_where``
    (restarts after a non-finite value) needs ``reset(options={"reset_mask": mask})``.
    """

    def __init__(self, venv: gym.vector.VectorEnv, *, horizon: int | None = None) -> None:
        self.venv = venv
        self.num_envs = int(venv.num_envs)
        device = _device_of(venv)
        self.device = device if device is not None else torch.device("cpu")
        mode = venv.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self.mode = gym.vector.AutoresetMode(mode)
        self.next_step_resets = self.mode is gym.vector.AutoresetMode.NEXT_STEP
        if horizon is not None and self.mode is not gym.vector.AutoresetMode.DISABLED:
            raise ValueError(
                f"RunnerConfig.horizon={horizon} needs sub-envs the runner can reset on its own "
                f"(a DISABLED autoreset env, reset by mask); a {self.mode.name} env ends its "
                "episodes itself: give it its own time limit instead"
            )
        self._space_pair = (venv.single_observation_space, venv.single_action_space)
        self._next: Nest = None  # SAME_/NEXT_STEP: the observations the env returned last
        #: SAME_STEP: whether a sub-env ended at a step without ``infos["final_obs"]``
        self._lost_final = torch.zeros((), dtype=torch.bool, device=self.device)
        self._checks_left = CHECKED_STEPS

    def _spaces(self, agent_id: Any) -> tuple[gym.Space, gym.Space]:
        return self._space_pair

    def start(self, seed: int | None) -> dict[Any, Nest]:
        """Reset the vector env (seeded with ``seed``) and check its first observations."""
        obs, _ = self.venv.reset(seed=seed)
        check_tensors("obs", obs, self.device, self.num_envs)
        return {DEFAULT_AGENT_ID: obs}

    def step(self, actions: Mapping[Any, torch.Tensor]) -> TensorStep:
        """Step the vector env; on its first steps, check what it returns (types, devices,
        rows), and note a SAME_STEP end without ``final_obs`` for the deferred check."""
        obs, rewards, terminated, truncated, infos = self.venv.step(actions[DEFAULT_AGENT_ID])
        final = infos.get("final_obs") if isinstance(infos, Mapping) else None
        if self._checks_left:  # what the env returns, checked on its first steps
            self._checks_left -= 1
            self._check_step(obs, rewards, terminated, truncated, final)
        terminated, truncated = _as(terminated, torch.bool), _as(truncated, torch.bool)
        self._next = obs  # (what restart hands out unless the env resets by mask)
        if self.mode is gym.vector.AutoresetMode.SAME_STEP:
            ended = terminated | truncated
            if final is None:  # right until a sub-env ends: refused at the sample's read
                self._lost_final |= ended.any()
            else:
                obs = where_rows(ended, final, obs)
        rewards = _as(rewards, torch.float32).reshape(self.num_envs)
        return TensorStep(
            {DEFAULT_AGENT_ID: obs},
            {DEFAULT_AGENT_ID: rewards},
            terminated,
            truncated,
            {DEFAULT_AGENT_ID: infos} if isinstance(infos, Mapping) else {},
        )

    def _check_step(self, obs: Nest, rewards: Any, term: Any, trunc: Any, final: Any) -> None:
        n, device = self.num_envs, self.device
        check_tensors("obs", obs, device, n)
        check_tensors("rewards", rewards, device, n)
        check_tensors("terminations", term, device, n)
        check_tensors("truncations", trunc, device, n)
        if final is not None and self.mode is gym.vector.AutoresetMode.SAME_STEP:
            check_tensors('infos["final_obs"]', final, device, n)

    def deferred_check(self) -> tuple[torch.Tensor, str] | None:
        """In SAME_STEP mode: whether a sub-env ended without ``infos["final_obs"]``."""
        if self.mode is not gym.vector.AutoresetMode.SAME_STEP:
            return None
        return self._lost_final, (
            f"{type(self.venv).__name__} resets in SAME_STEP mode but a sub-env ended without "
            'infos["final_obs"]: its final observation is lost, and bootstrapping from the '
            "reset observation would be silently wrong; return the final observations in "
            'infos["final_obs"] (a tensor shaped like the observations), or use DISABLED '
            "autoreset"
        )

    def restart(self, ended: torch.Tensor) -> dict[Any, Nest]:
        """DISABLED mode resets the ended sub-envs by mask; the other modes already did."""
        if self.mode is not gym.vector.AutoresetMode.DISABLED:
            return {DEFAULT_AGENT_ID: self._next}
        obs, _ = self.venv.reset(options={"reset_mask": ended})
        check_tensors("obs", obs, self.device, self.num_envs)
        return {DEFAULT_AGENT_ID: obs}

    def reset_where(self, mask: torch.Tensor, env_ids: list[int]) -> dict[Any, Nest]:
        """Reset ``mask``'s sub-envs with ``reset(options={"reset_mask": mask})``;
        ``EnvError`` naming them when the env cannot take a mask."""
        try:
            obs, _ = self.venv.reset(options={"reset_mask": mask})
        except Exception as exc:
            raise EnvError(
                f"restarting sub-env(s) {env_ids} of {type(self.venv).__name__} "
                "(restart_failed_sub_environments) calls reset(options={'reset_mask': mask}), "
                f"which raised {describe_exception(exc)}; make the env take a reset mask, or "
                "turn restarts off"
            ) from exc
        check_tensors("obs", obs, self.device, self.num_envs)
        if self.mode is not gym.vector.AutoresetMode.DISABLED:
            self._next = obs
        return {DEFAULT_AGENT_ID: obs}

    def close(self) -> None:
        """Close the vector env."""
        self.venv.close()


def _gymnasium_space(space: Any) -> gym.Space:
    """VMAS's old-gym Box / Discrete / MultiDiscrete as a gymnasium space."""
    kind = type(space).__name__
    if kind == "Box":
        return gym.spaces.Box(
            np.asarray(space.low, np.float32), np.asarray(space.high, np.float32), dtype=np.float32
        )
    if kind == "Discrete":
        return gym.spaces.Discrete(int(space.n))
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec))
    raise TypeError(f"VMAS space {space!r} has no gymnasium counterpart here")


class VmasEnv(TensorEnv):
    """A VMAS environment: multi-agent, each agent name an agent id.

    VMAS resets one sub-env at a time by its Python index (``reset_at``), so knowing which
    ended takes one read of a bool tensor per round where an episode may end: counted in
    ``host_reads``. Its ``dones`` become ``terminateds``; where its ``max_steps`` ends an
    episode, ``truncateds``. It keeps the seed it was made with unless the runner is given
    one."""

    is_multi_agent = True

    def __init__(self, env: Any) -> None:
        self.env = env
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.agents = tuple(a.name for a in env.agents)
        self.possible_agents = self.agents
        obs_spaces, act_spaces = env.observation_space, env.action_space
        if isinstance(getattr(obs_spaces, "spaces", obs_spaces), Mapping):
            obs_list = [obs_spaces[a] for a in self.agents]
            act_list = [act_spaces[a] for a in self.agents]
        else:
            obs_list, act_list = list(obs_spaces), list(act_spaces)
        self._space_map = {
            a: (_gymnasium_space(o), _gymnasium_space(s))
            for a, o, s in zip(self.agents, obs_list, act_list)
        }
        self._obs: dict[Any, Nest] = {}  # the last step's observations, by agent

    def _spaces(self, agent_id: Any) -> tuple[gym.Space, gym.Space]:
        return self._space_map[agent_id]

    def _by_agent(self, values: Any) -> dict[Any, Any]:
        if isinstance(values, Mapping):
            return {a: values[a] for a in self.agents}
        return dict(zip(self.agents, values))

    def start(self, seed: int | None) -> dict[Any, Nest]:
        """Reset the VMAS env (reseeded only when ``seed`` is given): each agent's first
        observations."""
        if seed is not None:
            self.env.seed(seed)
        obs = self._by_agent(self.env.reset())
        for a, o in obs.items():
            check_tensors(f"obs[{a!r}]", o, self.device, self.num_envs)
        return obs

    def step(self, actions: Mapping[Any, torch.Tensor]) -> TensorStep:
        """Step VMAS with each agent's actions; its ``dones`` split into terminations and
        truncations at ``max_steps`` when it has one."""
        out = self.env.step([actions[a] for a in self.agents])
        if len(out) == 5:
            obs, rewards, terminated, truncated, infos = out
        else:
            obs, rewards, dones, infos = out
            max_steps = getattr(self.env, "max_steps", None)
            if max_steps is None:
                truncated = torch.zeros_like(dones, dtype=torch.bool)
            else:
                truncated = self.env.steps >= max_steps
            terminated = dones.to(torch.bool) & ~truncated
        n = self.num_envs
        rewards = {a: r.to(torch.float32).reshape(n) for a, r in self._by_agent(rewards).items()}
        self._obs = self._by_agent(obs)
        return TensorStep(
            self._obs,
            rewards,
            terminated.to(torch.bool),
            truncated.to(torch.bool),
            self._by_agent(infos),
        )

    def restart(self, ended: torch.Tensor) -> dict[Any, Nest]:
        """Reset the ended sub-envs by index (one host read: which ended)."""
        self.host_reads += 1  # VMAS resets by Python index: which ended is read here
        indices = ended.nonzero().flatten().tolist()
        if not indices:  # the step's observations are the next ones (not computed again)
            return self._obs
        return self.reset_where(ended, indices)

    def reset_where(self, mask: torch.Tensor, env_ids: list[int]) -> dict[Any, Nest]:
        """Reset ``env_ids`` one by one with VMAS's ``reset_at``; every agent's observations."""
        for index in env_ids:
            self.env.reset_at(index, return_observations=False)
        return self._by_agent(
            self.env.get_from_scenario(
                get_observations=True, get_rewards=False, get_infos=False, get_dones=False
            )[0]
        )

    def close(self) -> None:
        """VMAS holds no resources to release."""
