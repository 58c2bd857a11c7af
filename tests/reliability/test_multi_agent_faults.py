"""Multi-agent oddities and faults at seeded steps: rewards add up, nothing is made up.

``TeamEnv`` has agents ``a`` (policy ``p0``), ``b`` and ``c`` (policy ``p1``); its
schedule makes, at a seeded step of an episode, one of ``b``/``c``:

- ``drop_obs``: get neither an observation nor a reward for one step;
- ``reward_without_obs``: get a reward but no observation for one step;
- ``agent_done``: terminate (with a final observation) while the others go on;
- ``all_done_missing``: the episode ends (``__all__``) with only ``a`` given a final obs;
- ``step_raise`` / ``bad_shape``: a failure of the sub-env (restart: episode dropped).

Checked for every row of every policy batch, against what the env emitted and received:
``obs`` is the agent's observation at ``t``, ``actions`` what it was sent then, ``new_obs``
its next observation (or, when the episode ended without one, its last real one again,
never a made-up one), ``rewards`` the sum of its rewards in between; each agent has
exactly one row per action it took; ``agent_steps()`` and ``env_steps()`` add up.
"""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from faults import FaultSchedule, InjectedFault, KeyedPolicy, Ledger
from invariants import Figures, Run, check_drops

import rlconnect as rc

pytestmark = pytest.mark.reliability

FIGURES = Figures()
AGENTS = ("a", "b", "c")
ODD_KINDS = ("drop_obs", "reward_without_obs", "agent_done", "all_done_missing")
BOX = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)


@pytest.fixture(scope="module", autouse=True)
def _publish():
    yield
    FIGURES.publish("test_multi_agent_faults")


class TeamLedger(Ledger):
    """A Ledger plus what each agent was shown, sent and paid, by (env, episode, agent, t)."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: dict[tuple, np.ndarray] = {}
        self.sent: dict[tuple, int] = {}
        self.paid: dict[tuple, float] = {}
        self.length: dict[tuple[int, int], int] = {}


class TeamEnv(rc.MultiAgentEnv):
    """Three agents acting every step; the schedule bends one of ``b``/``c`` (see above)."""

    possible_agents = list(AGENTS)

    def __init__(self, index: int, schedule: FaultSchedule, ledger: TeamLedger) -> None:
        self.observation_spaces = dict.fromkeys(AGENTS, BOX)
        self.action_spaces = dict.fromkeys(AGENTS, gym.spaces.Discrete(3))
        self.index, self.schedule, self.ledger = index, schedule, ledger
        self.rng = np.random.default_rng(index)
        ledger.built(index)

    def _emit(self, obs: dict) -> dict:
        for a, o in obs.items():
            self.ledger.shown[(self.index, self.episode, a, self.t)] = o
        return {a: {"key": (self.index, self.episode, a, self.t)} for a in obs}

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.episode, self.t = self.ledger.next_episode(self.index), 0
        self.length = int(self.rng.integers(5, 12))
        self.alive, self.fault = set(AGENTS), self.schedule.at(self.index, self.episode)
        self.odd = "bc"[(self.episode + self.index) % 2]
        obs = {a: self._obs(a) for a in AGENTS}
        self.expect = set(obs)
        return obs, self._emit(obs)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.rng.uniform(-1, 1), self.t / 10, AGENTS.index(agent)], np.float32)

    def step(self, actions: dict):
        if set(actions) != self.expect:  # only agents that were shown an obs may act
            raise AssertionError(f"actions for {sorted(actions)}, expected {sorted(self.expect)}")
        for a, act in actions.items():
            self.ledger.sent[(self.index, self.episode, a, self.t)] = int(act)
        self.t += 1
        kind = self.fault.kind if self.fault and self.fault.t == self.t else None
        if kind == "step_raise":
            self.ledger.add_fault(self.fault)
            raise InjectedFault(f"injected step failure in sub-env {self.index}")
        rewards = {a: float(np.round(self.rng.normal(), 3)) for a in sorted(self.alive)}
        obs = {a: self._obs(a) for a in sorted(self.alive)}
        terms = {"__all__": self.t >= self.length}
        x = self.odd
        if kind is not None:
            self.ledger.add_fault(self.fault)
        if kind == "drop_obs":
            del obs[x], rewards[x]
        elif kind == "reward_without_obs":
            del obs[x]
        elif kind == "agent_done":
            terms[x] = True
            self.alive.discard(x)
        elif kind == "all_done_missing":
            obs, terms["__all__"] = {"a": obs["a"]}, True
        elif kind == "bad_shape":
            obs[x] = np.zeros(5, np.float32)
        for a, r in rewards.items():
            self.ledger.paid[(self.index, self.episode, a, self.t)] = r
        self.expect = set() if terms["__all__"] else set(obs) - {x for x in terms if terms[x]}
        if terms["__all__"]:
            self.ledger.length[(self.index, self.episode)] = self.t
        return obs, rewards, terms, {"__all__": False}, self._emit(obs)


def team_runner(schedule: FaultSchedule, ledger: TeamLedger, **cfg) -> rc.EnvRunner:
    policies = {p: KeyedPolicy(BOX, gym.spaces.Discrete(3)) for p in ("p0", "p1")}
    config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=20, seed=5, **cfg)
    return rc.EnvRunner(
        lambda ctx: TeamEnv(ctx.vector_index, schedule, ledger),
        policies,
        policy_mapping_fn=lambda agent, episode, **kw: "p0" if agent == "a" else "p1",
        config=config,
    )


def check_team_rows(run: Run, ledger: TeamLedger) -> int:
    """Every row against the ledger (see the module docstring); returns rows checked."""
    rows_per = Counter()
    checked = 0
    for batch, _ in run.batches:
        eps_of: dict[int, tuple[int, int]] = {}
        for pb in batch.policy_batches.values():
            for info, eps in zip(pb["infos"], pb["eps_id"]):
                if "key" in info:
                    eps_of[int(eps)] = info["key"][:2]
        episodes = set()
        for pb in batch.policy_batches.values():
            for r in range(len(pb)):
                env, ep = eps_of[int(pb["eps_id"][r])]
                agent, t0 = AGENTS[int(pb["agent_index"][r])], int(pb["t"][r])
                episodes.add((env, ep))
                assert ledger.fault_of(env, ep) is None  # nothing of a failed episode
                assert np.array_equal(pb["obs"][r], ledger.shown[(env, ep, agent, t0)])
                assert int(pb["actions"][r]) == ledger.sent[(env, ep, agent, t0)]
                key = pb["infos"][r].get("key")
                t1 = key[3] if key is not None else ledger.length[(env, ep)]
                shown = [t for t in range(t0 + 1, t1) if (env, ep, agent, t) in ledger.shown]
                assert not shown, "a transition skipped an observation"
                want_next = ledger.shown[key] if key is not None else pb["obs"][r]  # no made-up obs
                assert np.array_equal(pb["new_obs"][r], want_next)
                paid = sum(ledger.paid.get((env, ep, agent, t), 0.0) for t in range(t0 + 1, t1 + 1))
                assert pb["rewards"][r] == pytest.approx(paid)
                rows_per[(env, ep, agent)] += 1
                checked += 1
        assert batch.agent_steps() == sum(len(pb) for pb in batch.policy_batches.values())
        assert batch.env_steps() == sum(ledger.length[e] for e in episodes)
    actions = Counter(k[:3] for k in ledger.sent)
    for key, n in rows_per.items():
        assert n == actions[key], (key, n, actions[key])  # one row per action taken
    return checked


@pytest.mark.parametrize("restart", [False, True])
def test_odd_agent_patterns_add_up_and_make_nothing_up(restart):
    injected = Counter()
    for seed in range(4):
        ledger = TeamLedger()
        schedule = FaultSchedule(seed, ODD_KINDS, envs=(0, 1, 2), p=0.7, last_step=4)
        runner = team_runner(
            schedule,
            ledger,
            batch_mode="complete_episodes",
            restart_failed_sub_environments=restart,
        )
        run = Run(runner, ledger).sample(3)
        FIGURES.counts["rows_checked"] += check_team_rows(run, ledger)
        assert not any(m["episode_faulty"] for m in run.metrics)  # none of these is a failure
        injected.update(ledger.injected())
    assert set(injected) == set(ODD_KINDS) and sum(injected.values()) >= 40
    FIGURES.faults_injected.update(injected)


def test_failures_of_a_multi_agent_sub_env_drop_only_its_episode():
    injected = Counter()
    for seed in range(4):
        ledger = TeamLedger()
        schedule = FaultSchedule(seed, ("step_raise", "bad_shape", *ODD_KINDS), envs=(1,), p=0.8)
        runner = team_runner(
            schedule,
            ledger,
            batch_mode="complete_episodes",
            restart_failed_sub_environments=True,
            sub_env_restart_limit=100,
        )
        run = Run(runner, ledger).sample(3)
        FIGURES.counts["rows_checked"] += check_team_rows(run, ledger)
        check_drops(run, FIGURES)
        injected.update(ledger.injected())
    assert injected["step_raise"] >= 3 and injected["bad_shape"] >= 3
    FIGURES.faults_injected.update(injected)


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        ("step_raise", rc.EnvError, r"sub-env 2 raised InjectedFault: injected step failure"),
        ("bad_shape", rc.EnvCheckError, r"env 2 / agent '[bc]': wrong shape \(5,\)"),
    ],
)
def test_without_restart_multi_agent_failures_name_env_and_agent(kind, error, message):
    ledger = TeamLedger()
    runner = team_runner(FaultSchedule(1, (kind,), envs=(2,), p=1.0), ledger)
    with pytest.raises(error, match=message):
        runner.sample()
    FIGURES.faults_injected.update(ledger.injected())


def test_agent_steps_per_policy_match_the_agents_mapped_to_it():
    ledger = TeamLedger()
    schedule = FaultSchedule(9, ODD_KINDS, envs=(0, 1, 2), p=0.7, last_step=4)
    runner = team_runner(schedule, ledger, batch_mode="complete_episodes")
    run = Run(runner, ledger).sample(2)
    check_team_rows(run, ledger)
    per_policy: Counter[str] = Counter()
    emitted = set()
    for batch, _ in run.batches:
        for pid, pb in batch.policy_batches.items():
            agents = {AGENTS[i] for i in pb["agent_index"].tolist()}
            assert agents <= ({"a"} if pid == "p0" else {"b", "c"})
            per_policy[pid] += len(pb)
            emitted |= {i["key"][:2] for i in pb["infos"] if "key" in i}
    # complete episodes: one row per action of every agent of every emitted episode
    sent = Counter("p0" if k[2] == "a" else "p1" for k in ledger.sent if k[:2] in emitted)
    assert per_policy == sent and sum(per_policy.values()) > 100
    FIGURES.faults_injected.update(ledger.injected())
