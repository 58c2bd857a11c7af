"""The multi-agent workloads of the benchmarks, each with a recording hand loop.

Three workloads, each run by an ``EnvRunner`` (default pipelines, ``ConstantPolicy``: a
policy that costs nothing) and by a hand-written loop over the same sub-envs that keeps
the same per-agent rows (observation, action, reward, terminated, truncated, next
observation) and stacks them into arrays per batch:

- ``rps``: PettingZoo's ``rps_v2`` as a turn-based ``AECEnv`` (two players take turns, a
  policy each); the hand loop is PettingZoo's ``agent_selection`` / ``last()`` loop;
- ``rps_parallel``: the same game as PettingZoo's ``ParallelEnv`` (both players move at
  every step, a policy each); the hand loop steps its dicts;
- ``four``: ``FourAgents``, an ``rc.MultiAgentEnv`` whose four agents act at every step
  (one shared policy); the hand loop steps its dicts.

An env step is one move (``rps``) or one step of all agents (``rps_parallel``, ``four``); what the
hand loops return is the number of env steps they took, as ``MultiAgentBatch.env_steps``
counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from _common import ConstantPolicy

import rlconnect as rc

__all__ = ["WORKLOADS", "FourAgents", "Workload"]

FOUR_EPISODE = 100  #: steps of a ``FourAgents`` episode


class FourAgents(rc.MultiAgentEnv):
    """Four agents acting at every step: Box(4,) observations (precomputed, so the env
    costs a few dict builds), Discrete(2) actions, reward 1 each, episodes of
    ``FOUR_EPISODE`` steps that end truncated (``__all__``)."""

    def __init__(self, length: int = FOUR_EPISODE) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(4)]
        box = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        self.length = length
        rng = np.random.default_rng(0)
        self._table = rng.uniform(-1, 1, (length + 1, 4, 4)).astype(np.float32)
        self._rewards = dict.fromkeys(self.possible_agents, 1.0)
        self._go_on = {"__all__": False}
        self._end = {"__all__": True}
        self.t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return dict(zip(self.possible_agents, self._table[self.t]))

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.t = 0
        return self._obs(), {}

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        over = self.t >= self.length
        truncateds = self._end if over else self._go_on
        return self._obs(), dict(self._rewards), self._go_on, truncateds, {}


def _rps() -> Any:
    from pettingzoo.classic import rps_v2

    return rps_v2.env()


def _rps_parallel() -> Any:
    from pettingzoo.classic import rps_v2

    return rps_v2.parallel_env()


def _stack(rows: list[tuple]) -> dict[str, np.ndarray]:
    """Per-agent row tuples (agent, obs, action, reward, terminated, truncated, next obs)
    as columns, one array each, as a batch holds them."""
    names = ("agent", "obs", "actions", "rewards", "terminateds", "truncateds", "new_obs")
    out = {}
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        out[name] = np.asarray(column) if name != "agent" else np.asarray(column, dtype=object)
    return out


def rps_hand_loop(n: int) -> Callable[[int], int]:
    """PettingZoo's AEC loop over ``n`` rps envs, each moving once per round with action 0;
    ``run(rounds)`` keeps every agent's rows, stacks them, and returns the env steps."""
    envs = [_rps() for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    waiting: list[dict[str, Any]] = [{} for _ in envs]  # agent -> obs it acted on

    def run(rounds: int) -> int:
        rows: list[tuple] = []
        for _ in range(rounds):
            for env, pending in zip(envs, waiting):
                while True:  # removals of done agents are not moves
                    agent = env.agent_selection
                    obs, reward, te, tr, _ = env.last()
                    before = pending.pop(agent, None)
                    if before is not None:
                        rows.append((agent, before, 0, reward, te, tr, obs))
                    if not (te or tr):
                        pending[agent] = obs
                        env.step(0)
                        break
                    env.step(None)
                    if not env.agents:
                        env.reset()
        _stack(rows)
        return rounds * n

    return run


def rps_parallel_hand_loop(n: int) -> Callable[[int], int]:
    """``n`` rps ``ParallelEnv``s stepped with action 0 for every agent alive; ``run(rounds)``
    keeps every agent's rows, stacks them, and returns the env steps."""
    envs = [_rps_parallel() for _ in range(n)]
    last = [env.reset(seed=i)[0] for i, env in enumerate(envs)]

    def run(rounds: int) -> int:
        rows: list[tuple] = []
        for _ in range(rounds):
            for k, env in enumerate(envs):
                obs, rew, te, tr, _ = env.step(dict.fromkeys(env.agents, 0))
                before = last[k]
                for a, o in obs.items():
                    rows.append((a, before[a], 0, rew[a], te[a], tr[a], o))
                if not env.agents:
                    obs, _ = env.reset()
                last[k] = obs
        _stack(rows)
        return rounds * n

    return run


def four_hand_loop(n: int) -> Callable[[int], int]:
    """``n`` ``FourAgents`` stepped with action 0 for every agent; ``run(rounds)`` keeps
    every agent's rows, stacks them, and returns the env steps."""
    envs = [FourAgents() for _ in range(n)]
    last = [env.reset()[0] for env in envs]
    actions = dict.fromkeys(envs[0].possible_agents, 0)

    def run(rounds: int) -> int:
        rows: list[tuple] = []
        for _ in range(rounds):
            for k, env in enumerate(envs):
                obs, rew, te, tr, _ = env.step(dict(actions))
                before = last[k]
                for a, o in obs.items():
                    rows.append((a, before[a], 0, rew[a], te.get(a, False), tr.get(a, False), o))
                if te["__all__"] or tr["__all__"]:
                    obs, _ = env.reset()
                last[k] = obs
        _stack(rows)
        return rounds * n

    return run


def _runner(
    make: Callable[[], Any], mapping: Callable[[Any], str], n: int, fragment: int
) -> rc.EnvRunner:
    """An ``EnvRunner`` on ``n`` sub-envs of ``make()``, one ``ConstantPolicy`` per policy id
    ``mapping`` gives, for what the default agent pipeline outputs."""
    probe = rc.envs.make_base_env(lambda ctx: make(), num_envs=1, seed=0)
    agents = list(probe.possible_agents)
    policies: dict[str, rc.Policy] = {}
    for a in agents:
        obs_space, act_space = probe.observation_space(a), probe.action_space(a)
        ctx = rc.ConnectorContext(obs_space, act_space, rc.RunnerConfig().connector_config())
        out_space = rc.default_agent_pipeline(ctx).output_space
        policies.setdefault(mapping(a), ConstantPolicy(out_space, act_space))
    probe.close()
    cfg = rc.RunnerConfig(num_envs=n, rollout_fragment_length=fragment, seed=0, check_env=False)
    return rc.EnvRunner(
        lambda ctx: make(),
        policies,
        policy_mapping_fn=lambda agent_id, episode, **kw: mapping(agent_id),
        config=cfg,
    )


class Workload:
    """A multi-agent workload: ``runner(n, fragment)`` and ``hand_loop(n)``."""

    def __init__(
        self,
        title: str,
        make: Callable[[], Any],
        mapping: Callable[[Any], str],
        hand_loop: Callable[[int], Callable[[int], int]],
    ) -> None:
        self.title, self._make, self._mapping, self.hand_loop = title, make, mapping, hand_loop

    def runner(self, n: int, fragment: int) -> rc.EnvRunner:
        return _runner(self._make, self._mapping, n, fragment)


WORKLOADS = {
    "rps": Workload("PettingZoo rps_v2, turn-based (AEC)", _rps, str, rps_hand_loop),
    "rps_parallel": Workload(
        "PettingZoo rps_v2, both players at every step (ParallelEnv)",
        _rps_parallel,
        str,
        rps_parallel_hand_loop,
    ),
    "four": Workload(
        "4 agents acting at every step (rc.MultiAgentEnv)",
        FourAgents,
        lambda agent_id: "shared",
        four_hand_loop,
    ),
}
