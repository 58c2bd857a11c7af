"""PettingZoo envs (``ParallelEnv`` and turn-based ``AECEnv``) as ``rc.MultiAgentEnv``.

PettingZoo is an optional extra (``pip install rlconnect[pettingzoo]``): this module imports
without it and only needs it when :func:`from_pettingzoo` is called.

Semantics shared by both adapters
---------------------------------
* ``observation_spaces`` / ``action_spaces`` are built once from ``env.observation_space(a)``
  / ``env.action_space(a)`` for every agent of ``env.possible_agents``.
* An agent is *done* once PettingZoo reports ``terminations[a]`` or ``truncations[a]``.
  Both flags are passed through unchanged (PettingZoo's ``TerminateIllegalWrapper`` sets
  both). A done agent is reported done exactly once per episode, in the step that ends it,
  together with its final observation; it never gets an observation again.
* ``"__all__"`` is always present in ``terminateds`` and ``truncateds``. The episode ends
  when no agent is left: ``env.agents`` is empty, or every agent still listed in it is
  done. The agents that finish in that last step decide how it ended:
  ``truncateds["__all__"]`` is True when any of them was truncated without being
  terminated (the episode was cut short, e.g. by ``max_cycles``), otherwise
  ``terminateds["__all__"]`` is True (also when no agent finished in the last step).
  Exactly one of the two is True at the end of an episode, both are False before.

``ParallelEnv``
---------------
``reset`` and ``step`` pass PettingZoo's dicts through (observations for every agent that
was alive in the step, including those that finish in it: their final observation).
Observations of agents already reported done are dropped; their later rewards, if any, are
still reported (without observation).

``AECEnv`` (turn based)
-----------------------
One call to ``step({agent: action})`` is one move of the selected agent, i.e. one env step.
``reset`` returns the observation of ``env.agent_selection`` only; ``step`` returns the
observation of the agent selected next (the only key of ``obs`` that is not done).
After the move the adapter performs, inside the same call, PettingZoo's ``env.step(None)``
calls that remove every done agent PettingZoo selects; they are not env steps and produce
no observation of their own. Each removed agent is reported with its final observation
(``env.observe(agent)`` just before removal), its ``infos`` entry and its flags.

Rewards follow PettingZoo's own definition of an AEC agent's reward, what ``env.last()``
returns: ``env._cumulative_rewards[agent]``, the reward accumulated since the agent last
acted. The adapter reports it *incrementally*: after the move and after every removal it
reports, for every agent, how much its cumulative reward grew since last reported. The
agent with an observation gets it as the reward of its row; any other agent gets it in
``rewards`` without observation (the runner adds it to that agent's next transition, and to
the episode's metrics at once). Before the selected agent moves, its
``_cumulative_rewards`` entry (fully reported by then) is set to 0, as PettingZoo's AEC
convention requires (``last()`` has handed it out): envs that reset it themselves at the
start of ``step`` (e.g. ``rps``) and envs that do not (e.g. ``tictactoe``) are thus counted
alike, and each agent's rewards over an episode sum to what the PettingZoo ``agent_iter`` /
``last()`` loop gives it. ``env.rewards`` (the last step's rewards) is used only for envs
without ``_cumulative_rewards``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlconnect.envs.multi_agent import MultiAgentEnv

__all__ = ["PettingZooAECEnv", "PettingZooParallelEnv", "from_pettingzoo"]

_INSTALL = "PettingZoo support needs the pettingzoo extra: pip install rlconnect[pettingzoo]"


def _pettingzoo() -> Any:
    try:
        import pettingzoo
    except ImportError as exc:
        raise ImportError(_INSTALL) from exc
    return pettingzoo


def from_pettingzoo(env: Any) -> MultiAgentEnv:
    """Adapt a PettingZoo ``ParallelEnv`` or ``AECEnv`` instance to ``rc.MultiAgentEnv``."""
    if isinstance(env, PettingZooParallelEnv | PettingZooAECEnv):
        return env
    pz = _pettingzoo()
    if isinstance(env, pz.ParallelEnv):
        return PettingZooParallelEnv(env)
    if isinstance(env, pz.AECEnv):
        return PettingZooAECEnv(env)
    raise TypeError(
        f"expected a PettingZoo ParallelEnv or AECEnv instance, got {type(env).__name__}"
    )


def _spaces(env: Any) -> tuple[list[Any], dict[Any, gym.Space], dict[Any, gym.Space]]:
    agents = list(getattr(env, "possible_agents", None) or getattr(env, "agents", []))
    obs = {a: env.observation_space(a) for a in agents}
    act = {a: env.action_space(a) for a in agents}
    return agents, obs, act


def _end_flags(finished: dict[Any, tuple[bool, bool]]) -> tuple[bool, bool]:
    """``(terminated, truncated)`` of an episode whose last step finished these agents."""
    truncated = any(tr and not te for te, tr in finished.values())
    return not truncated, truncated


class _PettingZooBase(MultiAgentEnv):
    def __init__(self, env: Any) -> None:
        _pettingzoo()
        self.env = env
        self.possible_agents, self.observation_spaces, self.action_spaces = _spaces(env)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self._done: set[Any] = set()

    @property
    def agents(self) -> list[Any]:
        """The agents PettingZoo currently lists as alive."""
        return list(self.env.agents)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{self.env}>"


class PettingZooParallelEnv(_PettingZooBase):
    """A PettingZoo ``ParallelEnv`` as ``rc.MultiAgentEnv`` (see the module docs)."""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the PettingZoo env; every agent observes."""
        out = self.env.reset(seed=seed, options=options)
        obs, infos = out if isinstance(out, tuple) else (out, {})
        self._done = set()
        return dict(obs), dict(infos or {})

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Step every acting agent at once; agents done earlier no longer report
        observations, flags or infos."""
        obs, rew, te, tr, infos = self.env.step(actions)  # (a dict the runner made for it)
        done = self._done
        if done:  # agents reported done earlier: no observation, flags or info any more
            obs = {a: o for a, o in obs.items() if a not in done}
            rewards = {a: r for a, r in rew.items() if a not in done or r}
        else:
            obs, rewards = dict(obs), dict(rew)
        if not done and te.keys() == tr.keys() >= obs.keys():  # (the usual dicts)
            terminateds = {a: bool(t) for a, t in te.items()}
            truncateds = {a: bool(t) for a, t in tr.items()}
        else:
            terminateds, truncateds = {}, {}
            for a in set(te) | set(tr) | set(obs):
                if a not in done:
                    terminateds[a] = bool(te.get(a, False))
                    truncateds[a] = bool(tr.get(a, False))
        finished = {a: (t, truncateds[a]) for a, t in terminateds.items() if t or truncateds[a]}
        if finished:
            done.update(finished)
        alive = any(a not in done for a in self.env.agents)
        all_te, all_tr = (False, False) if alive else _end_flags(finished)
        terminateds["__all__"], truncateds["__all__"] = all_te, all_tr
        if infos and infos.keys() == obs.keys():
            infos = dict(infos)
        else:
            infos = {a: i for a, i in (infos or {}).items() if a in obs}
        return obs, rewards, terminateds, truncateds, infos


#: PettingZoo's own AEC wrappers that keep no env state of their own (they forward
#: ``agents``, ``agent_selection``, ``terminations``, ``rewards``, ... to the env inside)
_FORWARDING = (
    "AssertOutOfBoundsWrapper",
    "BaseWrapper",
    "CaptureStdoutWrapper",
    "ClipOutOfBoundsWrapper",
    "OrderEnforcingWrapper",
    "TerminateIllegalWrapper",
)


def _state_holder(env: Any) -> Any:
    """The object whose attributes are ``env``'s AEC state: ``env.unwrapped`` when every
    layer above it is one of PettingZoo's forwarding wrappers (a wrapper's ``__getattr__``
    costs a call per layer and read), else ``env`` itself (another wrapper may keep state
    of its own, e.g. rewards it reshapes)."""
    wrappers = _pettingzoo().utils.wrappers
    forwarding = tuple(getattr(wrappers, name) for name in _FORWARDING)
    layer = env
    while type(layer) in forwarding:
        layer = layer.env
    return layer if layer is env.unwrapped else env


class PettingZooAECEnv(_PettingZooBase):
    """A turn-based PettingZoo ``AECEnv`` as ``rc.MultiAgentEnv`` (see the module docs).

    Moves go through ``env`` (its wrappers check and shape them); the state the adapter
    reads after each move (``agent_selection``, ``terminations``, ...) is read from
    ``env.unwrapped`` where the wrappers only forward it."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self._reported: dict[Any, float] = {}
        self._state = _state_holder(env)

    # -- rewards --------------------------------------------------------------------------
    def _cumulative(self) -> dict[Any, float] | None:
        return getattr(self._state, "_cumulative_rewards", None)

    def _collect_rewards(self, out: dict[Any, float]) -> None:
        """Add every agent's reward since it was last reported to ``out``."""
        cum = self._cumulative()
        if cum is None:  # no AEC bookkeeping: take the last step's rewards as they are
            for a, r in (getattr(self._state, "rewards", None) or {}).items():
                if r:
                    out[a] = out.get(a, 0.0) + float(r)
            return
        reported = self._reported
        for a, c in cum.items():
            c = float(c)
            delta = c - reported.get(a, 0.0)
            if delta:
                reported[a] = c
                out[a] = out.get(a, 0.0) + delta

    # -- API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the PettingZoo env; only the selected agent observes (its turn comes first)."""
        self.env.reset(seed=seed, options=options)
        self._done = set()
        cum = self._cumulative()
        self._reported = {a: float(c) for a, c in (cum or {}).items()}
        state = self._state
        if not state.agents:
            return {}, {}
        agent = state.agent_selection
        return {agent: self.env.observe(agent)}, {agent: dict(state.infos.get(agent, {}))}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        """Play the selected agent's action; returns the next selected agent's observation
        and the rewards given since they were last reported. ValueError unless exactly
        the selected agent acts."""
        state = self._state
        if not state.agents:
            raise RuntimeError("step() called on a finished episode: call reset() first")
        agent = state.agent_selection
        if len(actions) != 1 or agent not in actions:
            raise ValueError(
                f"turn-based PettingZoo env: exactly the selected agent {agent!r} acts now, "
                f"got actions for {sorted(map(str, actions))}"
            )
        cum = self._cumulative()
        if cum is not None and agent in cum:
            # last() handed this out (and we reported it): PettingZoo restarts it at 0
            cum[agent] = 0
            self._reported[agent] = 0.0
        self.env.step(actions[agent])
        rewards: dict[Any, float] = {}
        self._collect_rewards(rewards)
        obs: dict[Any, Any] = {}
        terminateds: dict[Any, bool] = {}
        truncateds: dict[Any, bool] = {}
        infos: dict[Any, dict] = {}
        finished: dict[Any, tuple[bool, bool]] = {}
        sel = state.agent_selection
        if state.agents and (state.terminations.get(sel) or state.truncations.get(sel)):
            self._remove_done(rewards, (obs, terminateds, truncateds, infos, finished))
        done = self._done  # (an agent still listed may be done: PettingZoo removes it later)
        goes_on = any(a not in done for a in state.agents) if done else bool(state.agents)
        if goes_on:
            nxt = state.agent_selection
            obs[nxt] = self.env.observe(nxt)
            info = state.infos.get(nxt)
            infos[nxt] = dict(info) if info else {}
            terminateds[nxt] = truncateds[nxt] = False
            terminateds["__all__"] = truncateds["__all__"] = False
        else:
            terminateds["__all__"], truncateds["__all__"] = _end_flags(finished)
        for a in obs:
            rewards.setdefault(a, 0.0)
        return obs, rewards, terminateds, truncateds, infos

    def _remove_done(self, rewards: dict[Any, float], out: tuple[dict, ...]) -> None:
        """Remove the done agents PettingZoo selects (``env.step(None)``: not env steps, no
        rows of their own), reporting each one's final observation, flags and info into
        ``out`` (obs, terminateds, truncateds, infos, and the ``(terminated, truncated)`` of
        every agent that finished); their rewards go into ``rewards``."""
        env, state = self.env, self._state
        obs, terminateds, truncateds, infos, finished = out
        guard = 2 * len(state.agents) + 2
        while state.agents:
            sel = state.agent_selection
            te, tr = bool(state.terminations.get(sel)), bool(state.truncations.get(sel))
            if not (te or tr):
                break
            if guard <= 0:
                raise RuntimeError(f"{env}: env.step(None) does not remove done agent {sel!r}")
            guard -= 1
            if sel not in self._done:
                obs[sel] = env.observe(sel)
                infos[sel] = dict(state.infos.get(sel, {}))
                terminateds[sel], truncateds[sel] = te, tr
                finished[sel] = (te, tr)
                self._done.add(sel)
            env.step(None)
            self._reported.pop(sel, None)
            self._collect_rewards(rewards)
