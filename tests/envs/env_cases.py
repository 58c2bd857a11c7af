"""Envs and helpers shared by the env adapter tests (module level, so they pickle)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np

import rlconnect as rc


class StepCountEnv(gym.Env):
    """obs = [episode_no, t, last_action, start]; never ends by itself (wrap in a TimeLimit).

    ``start`` is drawn from the env's RNG at each reset, so seeding shows in the obs; every
    transition is checkable in closed form: ``new_obs == [ep, t + 1, action, start]``.
    """

    observation_space = gym.spaces.Box(-1e7, 1e7, (4,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.episode = -1
        self.t = 0
        self.start = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.start = float(self.np_random.integers(0, 1000)) + self.offset
        return self._obs(-1), {"reset": True}

    def _obs(self, action):
        return np.array([self.episode, self.t, action, self.start], np.float32)

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        return self._obs(int(action)), 1.0 + float(action), False, False, {"t": self.t}


def make_short(ctx: rc.EnvContext | None = None) -> gym.Env:
    """A short TimeLimit env: StepCountEnv truncated after 5 steps."""
    return gym.wrappers.TimeLimit(StepCountEnv(), max_episode_steps=5)


def make_cartpole(ctx: rc.EnvContext | None = None) -> gym.Env:
    return gym.make("CartPole-v1")


def make_short_cartpole(ctx: rc.EnvContext | None = None) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=6)


def make_indexed(ctx: rc.EnvContext) -> gym.Env:
    """StepCountEnv whose obs shows the context it was built with (index and seed)."""
    offset = 10_000 * ctx.vector_index + (0 if ctx.seed is None else 100_000 * ctx.seed)
    return gym.wrappers.TimeLimit(StepCountEnv(offset=offset), max_episode_steps=7)


def _helper_loop(conn, env_end, linger_s: float, release: str | None) -> None:
    """A process an env starts (a simulator server): answers ``x`` with ``x + 1``; ends
    ``linger_s`` after the env's process is gone (``env_end``, inherited when forked, is
    closed first so that the helper sees it go), or sooner once the file ``release``
    exists (so a test can hold it for as long as it needs, then let it go)."""
    env_end.close()
    try:
        while (x := conn.recv()) is not None:
            conn.send(x + 1.0)
    except EOFError:
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and not (release and os.path.exists(release)):
            time.sleep(0.02)


class HelperProcessEnv(StepCountEnv):
    """StepCountEnv whose rewards come from a child process it starts (a
    ``multiprocessing.Process``, which daemonic processes may not start); its step infos
    carry the helper's pid, and ``close()`` ends the helper."""

    def __init__(
        self, offset: float = 0.0, linger_s: float = 0.0, release: str | None = None
    ) -> None:
        super().__init__(offset)
        self._conn, child = multiprocessing.Pipe()
        args = (child, self._conn, linger_s, release)
        self.helper = multiprocessing.Process(target=_helper_loop, args=args)
        self.helper.start()
        child.close()

    def step(self, action):
        obs, _, term, trunc, info = super().step(action)
        self._conn.send(float(action))
        return obs, self._conn.recv(), term, trunc, {**info, "helper_pid": self.helper.pid}

    def close(self) -> None:
        if self.helper.exitcode is None:
            self._conn.send(None)
            self.helper.join(5)
        super().close()


def make_with_helper(ctx: rc.EnvContext) -> gym.Env:
    """A StepCountEnv per sub-env (its index in the obs) with a helper process, which
    outlives the env's process by ``env_config["helper_linger_s"]`` (or until the file
    ``env_config["helper_release"]`` exists)."""
    cfg = ctx.config
    linger_s, release = cfg.get("helper_linger_s", 0.0), cfg.get("helper_release")
    env = HelperProcessEnv(10_000 * ctx.vector_index, linger_s, release)
    return gym.wrappers.TimeLimit(env, max_episode_steps=7)


ENV_FNS = {"cartpole": make_cartpole, "short_cartpole": make_short_cartpole, "short": make_short}


def spaces(make=make_cartpole):
    env = make(rc.EnvContext())
    return env.observation_space, env.action_space


def runner_for(env, make=make_cartpole, *, n=4, frag=25, seed=5, **cfg) -> rc.EnvRunner:
    obs_space, act_space = spaces(make)
    config = rc.RunnerConfig(num_envs=n, rollout_fragment_length=frag, seed=seed, **cfg)
    return rc.EnvRunner(env, rc.RandomPolicy(obs_space, act_space), config=config)


def row_tuples(batch: rc.SampleBatch) -> dict[int, list[tuple]]:
    """Per sub-env, its transitions as sorted tuples (eps_id values may differ)."""
    out: dict[int, list[tuple]] = defaultdict(list)
    cols = [batch[k] for k in ("t", "obs", "actions", "rewards", "new_obs")]
    flags = batch["terminateds"], batch["truncateds"]
    for k, e in enumerate(batch["env_id"].tolist()):
        t, o, a, r, no = (c[k] for c in cols)
        row = (int(t), tuple(o.tolist()), int(a), float(r), tuple(no.tolist()))
        out[e].append((*row, bool(flags[0][k]), bool(flags[1][k])))
    return {e: sorted(v) for e, v in out.items()}


def trajectories(batch: rc.SampleBatch) -> list[rc.SampleBatch]:
    """Split at every change of eps_id (single-agent trajectories are contiguous)."""
    key = batch["eps_id"]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    stops = np.r_[starts[1:], len(key)]
    return [batch[a:b] for a, b in zip(starts, stops)]


def first_obs_by_env(batches: list[rc.SampleBatch]) -> dict[int, list[tuple]]:
    """Per sub-env, the first observations of its episodes, in order."""
    out: dict[int, list[tuple]] = defaultdict(list)
    for b in batches:
        for k in np.flatnonzero(b["t"] == 0).tolist():
            out[int(b["env_id"][k])].append((int(b["eps_id"][k]), tuple(b["obs"][k].tolist())))
    return {e: [o for _, o in sorted(v)] for e, v in out.items()}


def check_cartpole_truth(batch: rc.SampleBatch) -> None:
    """Every transition is what CartPole returns for (obs, action) (state replayed)."""
    sim = gym.make("CartPole-v1").unwrapped
    sim.reset(seed=0)
    for i in range(len(batch)):
        sim.state = batch["obs"][i].astype(np.float64)
        sim.steps_beyond_terminated = None
        obs, reward, term, _, _ = sim.step(int(batch["actions"][i]))
        np.testing.assert_allclose(obs, batch["new_obs"][i], rtol=1e-5, atol=1e-5)
        assert reward == batch["rewards"][i]
        assert term == batch["terminateds"][i]


def check_count_truth(batch: rc.SampleBatch) -> None:
    """Every transition is StepCountEnv's: a recorded reset step would break ``t + 1``."""
    o, no, a = batch["obs"], batch["new_obs"], batch["actions"]
    np.testing.assert_array_equal(no[:, 0], o[:, 0])
    np.testing.assert_array_equal(no[:, 1], o[:, 1] + 1)
    np.testing.assert_array_equal(no[:, 2], a)
    np.testing.assert_array_equal(no[:, 3], o[:, 3])
    np.testing.assert_array_equal(batch["rewards"], 1.0 + a)
    np.testing.assert_array_equal(batch["t"], o[:, 1])


def check_truth(kind: str, batch: rc.SampleBatch) -> None:
    if kind == "short":
        check_count_truth(batch)
    else:
        check_cartpole_truth(batch)


def check_continuity(batch: rc.SampleBatch) -> None:
    """Within a trajectory: t counts up by one, new_obs[t] == obs[t + 1], only the end ends."""
    for traj in trajectories(batch):
        assert np.all(np.diff(traj["t"]) == 1)
        np.testing.assert_array_equal(traj["new_obs"][:-1], traj["obs"][1:])
        ends = traj["terminateds"] | traj["truncateds"]
        assert not ends[:-1].any()


class TwoAgents(rc.MultiAgentEnv):
    """Two agents stepping a StepCountEnv each; the episode ends after 5 steps."""

    possible_agents = ["a", "b"]
    observation_spaces = dict.fromkeys("ab", StepCountEnv.observation_space)
    action_spaces = dict.fromkeys("ab", StepCountEnv.action_space)

    def __init__(self, ctx=None):
        self.envs = {a: make_short() for a in "ab"}

    def reset(self, *, seed=None, options=None):
        out = {
            a: e.reset(seed=None if seed is None else seed + k)
            for k, (a, e) in enumerate(self.envs.items())
        }
        return {a: o for a, (o, _) in out.items()}, {a: i for a, (_, i) in out.items()}

    def step(self, actions):
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for a, act in actions.items():
            obs[a], rew[a], term[a], trunc[a], infos[a] = self.envs[a].step(act)
        term["__all__"] = False
        trunc["__all__"] = any(trunc.values())
        return obs, rew, term, trunc, infos


def assert_same_batches(a: list[rc.SampleBatch], b: list[rc.SampleBatch]) -> None:
    """Every column of every batch equal, in the same order (infos too)."""
    for x, y in zip(a, b, strict=True):
        assert sorted(x.keys()) == sorted(y.keys())
        for key in x:
            if key == "infos":
                assert list(x[key]) == list(y[key])
            else:
                np.testing.assert_array_equal(np.asarray(x[key]), np.asarray(y[key]), err_msg=key)


def _sleeps(pid: int) -> int:
    """How often process ``pid`` has gone to sleep (Linux: voluntary context switches)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def sleeps_per_worker(polls: int) -> list[int]:
    """How often each of 2 env workers slept during ``polls`` synchronous polls."""
    runner = runner_for(make_indexed, make_indexed, n=4, frag=50, seed=3, num_env_workers=2)
    try:
        runner.sample()  # started, first resets done
        pids = [w.proc.pid for w in runner.env.workers]
        before = [_sleeps(p) for p in pids]
        for _ in range(polls // 50):
            runner.sample()
        return [_sleeps(p) - b for p, b in zip(pids, before)]
    finally:
        runner.stop()


class PushRight(rc.RandomPolicy):
    """Always action 1: a CartPole episode's course depends on its start state only."""

    def compute_actions(self, input_batch, explore=True):
        return np.ones(len(input_batch["obs"]), dtype=np.int64), [], {}


def episode_ends(env, horizon, *, n=2, **cfg) -> dict[tuple[int, int], tuple[int, bool, bool]]:
    """``(env_id, episode number) -> (length, terminated, truncated)`` of every episode
    that ended in 3 complete-episode batches (the first few per sub-env)."""
    config = rc.RunnerConfig(
        num_envs=n,
        rollout_fragment_length=30,
        seed=7,
        horizon=horizon,
        batch_mode="complete_episodes",
        **cfg,
    )
    r = rc.EnvRunner(env, PushRight(*spaces()), config=config)
    try:
        batches = [r.sample() for _ in range(3)]
    finally:
        r.stop()
    out: dict[tuple[int, int], tuple[int, bool, bool]] = {}
    seen: dict[int, int] = {}
    for b in batches:
        check_cartpole_truth(b)
        check_continuity(b)
        for ep in sorted(b.split_by_episode(), key=lambda e: int(e["eps_id"][0])):
            e = int(ep["env_id"][0])
            k = seen[e] = seen.get(e, -1) + 1
            out[e, k] = (len(ep), bool(ep["terminateds"][-1]), bool(ep["truncateds"][-1]))
    return out
