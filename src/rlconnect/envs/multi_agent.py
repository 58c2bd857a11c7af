"""Multi-agent envs: the ``MultiAgentEnv`` base class users subclass, and its adapter."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlconnect.envs.base import BaseEnv, EnvRows
from rlconnect.envs.obs_stack import ObsStacker, fits_dtype
from rlconnect.envs.rows import EnvRowsBuilder, LayoutMemo
from rlconnect.envs.sub_envs import ContextRule, EnvContext, SubEnvs, sub_env_contexts
from rlconnect.errors import EnvCheckError
from rlconnect.spaces import unstack_batch

__all__ = ["MultiAgentEnv", "MultiAgentEnvs"]


class MultiAgentEnv:
    """Base class of multi-agent envs, dict in and dict out.

    Subclasses set ``possible_agents`` and the dicts ``observation_spaces`` /
    ``action_spaces`` keyed by agent id, and implement ``reset(*, seed=None, options=None)
    -> (obs, infos)`` and ``step(actions) -> (obs, rewards, terminateds, truncateds, infos)``.
    ``obs`` holds the agents that act next (any subset, agents may join or leave);
    ``rewards`` may name agents without an observation (they are added to the agent's next
    transition); ``terminateds`` / ``truncateds`` carry ``"__all__"`` to end the episode.
    """

    possible_agents: list[Any] = []
    observation_spaces: dict[Any, gym.Space] = {}
    action_spaces: dict[Any, gym.Space] = {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode; returns observations and infos of the agents that act first."""
        raise NotImplementedError

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Apply one action per acting agent."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources."""


_ROWS = (np.ndarray, list)  #: actions given row by row (a tuple: cheaper than ``|`` per call)


Boxes = dict[Any, tuple[tuple[int, ...], np.dtype]]


def _malformed(boxes: Boxes, env_id: int, obs: dict) -> EnvCheckError | None:
    """An error naming the agents whose Box observation has a wrong shape or dtype kind
    (``boxes``: each Box agent's shape and dtype; these could not be stacked, or would be
    cast silently), else None."""
    problems = []
    for a, ob in obs.items():
        want = boxes.get(a)
        if want is None:
            continue
        shape, dtype = want
        if type(ob) is np.ndarray and ob.shape == shape and ob.dtype == dtype:
            continue  # (the common case, without a call)
        arr = ob if isinstance(ob, np.ndarray) else np.asarray(ob)
        if arr.shape != shape:
            problems.append(f"env {env_id} / agent {a!r}: wrong shape {arr.shape}")
        elif not fits_dtype(arr, dtype):
            problems.append(f"env {env_id} / agent {a!r}: wrong dtype {arr.dtype}")
    if not problems:
        return None
    return EnvCheckError("env returned a bad observation: " + "; ".join(problems))


class _SharedStack:
    """The ``StackFn`` of sub-envs whose agents all observe in one space: a poll's
    observations checked and stacked at once. If some do not fit, each sub-env's dicts
    (``last``: what it observed at this poll) are checked alone as ``_malformed`` names
    them, agent by agent, and the other rows stacked without them (error path only)."""

    def __init__(self, space: gym.Space, boxes: Boxes, last: dict[int, tuple[Any, Any]]):
        self.stack = ObsStacker(space, agent=None)
        self.boxes = boxes
        self.last = last

    def __call__(self, obs: list[Any], ids: list[int]) -> tuple[Any, Mapping[int, BaseException]]:
        batch, unfit = self.stack(obs, ids)
        if not unfit or not self.boxes:
            return batch, unfit
        named = {}
        for i in dict.fromkeys(ids):
            bad = _malformed(self.boxes, i, self.last[i][0])
            if bad is not None:
                named[i] = bad
        if not named:
            return batch, unfit
        keep = [k for k, i in enumerate(ids) if i not in named]
        part, unfit = self.stack([obs[k] for k in keep], [ids[k] for k in keep])
        batch = np.zeros((len(ids), *part.shape[1:]), dtype=part.dtype)
        batch[keep] = part
        return batch, {**unfit, **named}


def _shared_space(spaces: dict[Any, gym.Space]) -> gym.Space | None:
    """The space every agent observes in, if there is one."""
    shared = next(iter(spaces.values()), None)
    if shared is None or any(s != shared for s in spaces.values()):
        return None
    return shared


class MultiAgentEnvs(BaseEnv):
    """N copies of an ``rc.MultiAgentEnv`` (or anything with its dict API) as one BaseEnv.

    Building, seeding, resets and restarts are its ``SubEnvs``' (``rlconnect.envs.sub_envs``);
    this class turns the sub-envs' dicts into rows.
    """

    is_multi_agent = True

    def __init__(
        self,
        creator: Callable[[EnvContext], Any],
        num_envs: int,
        *,
        seed: int | None = None,
        worker_index: int = 0,
        env_config: dict[str, Any] | None = None,
        envs: list[Any] | None = None,
        contexts: ContextRule | None = None,
    ) -> None:
        self.num_envs = num_envs
        rule = contexts or sub_env_contexts(num_envs, worker_index, seed, env_config)
        self._subs = SubEnvs(creator, num_envs, rule, envs=envs)
        first = self._subs.envs[0]
        self.possible_agents = tuple(getattr(first, "possible_agents", ()))
        self._obs_spaces = dict(first.observation_spaces)
        self._act_spaces = dict(first.action_spaces)
        #: Box spaces' (shape, dtype) by agent, what ``_malformed`` compares
        self._boxes = {
            a: (s.shape, s.dtype) for a, s in self._obs_spaces.items() if type(s) is gym.spaces.Box
        }
        shared = _shared_space(self._obs_spaces)
        #: what ``build`` stacks a poll's observations with (None: they stay a list)
        self._stack = None if shared is None else _SharedStack(shared, self._boxes, self._subs.last)
        #: stepped, no agent to act, not done: stepped with {} (a reset or soft reset asked
        #: for meanwhile comes first, and a successful one empties this)
        self._idle: set[int] = set()
        #: the columns that recur while the same agents act (``env_ids``, ``stepped``)
        self._memo = LayoutMemo()

    @property
    def envs(self) -> list[Any]:
        """The sub-envs, in order (a restart replaces one in place)."""
        return self._subs.envs

    def observation_space(self, agent_id: Any) -> gym.Space:
        """The observation space of ``agent_id``; KeyError listing the known agents."""
        try:
            return self._obs_spaces[agent_id]
        except KeyError:
            raise KeyError(
                f"agent {agent_id!r} has no observation space; known: {list(self._obs_spaces)}"
            ) from None

    def action_space(self, agent_id: Any) -> gym.Space:
        """The action space of ``agent_id``; KeyError listing the known agents."""
        try:
            return self._act_spaces[agent_id]
        except KeyError:
            raise KeyError(
                f"agent {agent_id!r} has no action space; known: {list(self._act_spaces)}"
            ) from None

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Queue each row's action under its sub-env and agent (a batch of one sub-env's
        rows is stored as one dict at once)."""
        rows = actions if isinstance(actions, _ROWS) else unstack_batch(actions)
        pending = self._subs.actions
        ids = env_ids.tolist()
        one = ids and ids[0] == ids[-1] and ids.count(ids[0]) == len(ids)  # (ends first)
        if one and ids[0] not in pending:
            pending[ids[0]] = dict(zip(agent_ids, rows))  # one sub-env's rows (e.g. N=1)
            return
        for i, a, act in zip(ids, agent_ids, rows):
            held = pending.get(i)
            if held is None:
                pending[i] = {a: act}
            else:
                held[a] = act

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Reset sub-env ``env_id`` at the next poll."""
        self._subs.try_reset(env_id)

    def soft_reset(self, env_id: int) -> None:
        """Start a new episode in ``env_id`` at the next poll without resetting it."""
        self._subs.soft_reset(env_id)

    def try_restart(self, env_id: int) -> None:
        """Rebuild sub-env ``env_id`` (it raised); it resets at the next poll."""
        self._subs.try_restart(env_id)

    def poll(self) -> EnvRows:
        """Step each sub-env given actions (an idle one with none), reset those asked to,
        and return a row per agent that observed; a sub-env that raises, or returns an
        observation outside its space, comes back as an error row."""
        rows = EnvRowsBuilder(memo=self._memo)
        subs = self._subs
        resets, soft, actions, idle = subs.needs_reset, subs.soft, subs.actions, self._idle
        envs = subs.envs
        # a shared space's stacker checks every observation of the poll at once
        boxes = self._boxes if self._stack is None else None
        for i in range(self.num_envs):
            resetting = i in resets or i in soft
            if not resetting and i not in actions and i not in idle:
                continue
            try:
                if resetting:
                    o, r, te, tr, inf = self._reset(i)
                else:
                    o, r, te, tr, inf = envs[i].step(actions.pop(i, {}))
            except Exception as exc:  # reported per sub-env, never lost
                rows.add_error(i, exc)
                actions.pop(i, None)
                continue
            if resetting:
                resets.discard(i)
                soft.discard(i)
            idle.discard(i)
            bad = _malformed(boxes, i, o) if boxes else None
            if bad is not None:  # reported like a raise: restarted, or named in the error
                rows.add_error(i, bad)
                continue
            if o:
                subs.last[i] = (o, inf)
            infos = inf if isinstance(inf, dict) else {}
            going = rows.add_agent_rows(i, o, r, te, tr, infos, first=resetting)
            all_te, all_tr = te.get("__all__"), tr.get("__all__")
            if all_te or all_tr:
                rows.end_episode(i, bool(all_te), bool(all_tr))
            elif not going:
                idle.add(i)  # no agent acts next (none, or only ones that ended): step with {}
        out = rows.build(stack=self._stack)
        if out.errors:
            subs.failures.update(out.errors)
        return out

    def _reset(self, i: int) -> tuple[dict, dict, dict, dict, dict]:
        """Sub-env ``i``'s soft reset or reset: ``(obs, rewards, terminateds, truncateds,
        infos)`` dicts (empty rewards and flags)."""
        subs = self._subs
        if i in subs.soft and i not in subs.needs_reset:
            o, inf = subs.last[i]
        else:
            o, inf = subs.reset(i)
        return o, {}, {}, {}, inf

    def close(self) -> None:
        """Close every sub-env (an error closing one does not stop the others)."""
        self._subs.close()
