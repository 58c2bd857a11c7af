"""Fault injection for the runner: seeded schedules, faulty envs and policies, a ledger.

- ``FaultSchedule``: a deterministic ``(sub-env index, episode, step) -> fault kind``
  drawn from a seed (no probabilities at run time, so counts can be asserted);
  ``OneFault`` and ``EveryEpisode`` (a sub-env failing in every episode) are fixed ones.
- ``Ledger``: what the faulty envs of one run really produced. It holds every transition
  ``(obs, action, reward, terminated, truncated, next_obs)`` under its key ``(env index,
  episode, t)``, each injected fault with the time it fired, and how often each sub-env
  was built. Episode numbers live in the ledger, so a rebuilt sub-env continues the
  schedule (RLlib keeps such a counter in a named actor). In-process it is a plain
  object; with a ``path`` (worker processes) it is kept in files.
- ``FaultyEnv``: wraps any gymnasium env and injects the scheduled faults. Each step's info
  carries the key of the transition it completes, so every batch row can be traced back
  to the ledger (``infos`` of a row are those of the step that produced its ``new_obs``).
- ``KeyedPolicy``: actions are a function of the observation only, so the data of a
  sub-env does not depend on what the other sub-envs did (data equivalence); with
  ``bad={call: kind}`` it is the faulty policy (raises, or returns out-of-space actions).
- ``RaisingCallbacks``: callbacks that raise in one hook on cue.

The multi-agent counterpart (``TeamEnv``, dropped observations, rewards without one,
early and missing final observations) lives in ``test_multi_agent_faults.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

import rlconnect as rc

#: kinds that make ``reset`` fail, and kinds that make ``step`` fail or lie
RESET_KINDS = ("reset_raise",)
RAISE_KINDS = ("step_raise", "noargs_raise", "odd_raise", "unpicklable_raise")
VALUE_KINDS = ("nan_obs", "inf_obs", "nan_reward")
SHAPE_KINDS = ("bad_shape", "bad_dtype")
#: kinds that change only a step's info (not failures): a lock, which cannot be pickled
INFO_KINDS = ("unpicklable_info",)
#: a step failure scheduled in every episode of a sub-env (``EveryEpisode``): the
#: restart budget must end it with ``EnvError``
EVERY_EPISODE_KIND = "every_episode_raise"
#: faults the runner must treat as failures of the sub-env (restart: episode dropped)
FAILING_KINDS = RESET_KINDS + RAISE_KINDS + VALUE_KINDS + SHAPE_KINDS + ("hang", EVERY_EPISODE_KIND)


class InjectedFault(RuntimeError):
    """What a FaultyEnv raises for ``step_raise`` / ``reset_raise``."""


class NoArgsFault(Exception):
    """Raised without arguments: ``str()`` is empty, ``args[0]`` fails."""


class OddFault(Exception):
    """Needs two constructor arguments and has a broken ``__str__``: an error path that
    formats it with ``str`` or rebuilds it with ``type(exc)(exc)`` breaks."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code

    def __str__(self) -> str:
        raise ValueError("OddFault cannot be printed")


class UnpicklableFault(Exception):
    """Holds a lock: it cannot be sent from a worker process as itself."""

    def __init__(self) -> None:
        super().__init__("injected failure that cannot be pickled")
        self.lock = threading.Lock()


class Fault(NamedTuple):
    """One scheduled fault: in sub-env ``env``'s ``episode`` at step ``t`` (0: the reset)."""

    env: int
    episode: int
    t: int
    kind: str


class FaultSchedule:
    """Seeded and deterministic: episode ``k`` of sub-env ``i`` gets at most one fault.

    With probability ``p`` (drawn from ``(seed, i, k)``, so it is the same in every run and
    after any restart) the episode gets a fault of one of ``kinds`` at a step drawn from
    ``[first_step, last_step]``; reset kinds fire in the reset. Only sub-envs in ``envs``
    get faults, so the others can be compared with a fault-free run.
    """

    def __init__(
        self,
        seed: int,
        kinds: tuple[str, ...],
        *,
        envs: tuple[int, ...] = (1, 3),
        p: float = 0.5,
        first_step: int = 1,
        last_step: int = 6,
    ) -> None:
        self.seed, self.kinds, self.envs, self.p = seed, kinds, envs, p
        self.first_step, self.last_step = first_step, last_step

    def at(self, env: int, episode: int) -> Fault | None:
        """The fault of ``(env, episode)``, if any."""
        if env not in self.envs or not self.kinds:
            return None
        rng = np.random.default_rng([self.seed, env, episode])
        if rng.random() >= self.p:
            return None
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        t = 0 if kind in RESET_KINDS else int(rng.integers(self.first_step, self.last_step + 1))
        return Fault(env, episode, t, kind)


class OneFault(FaultSchedule):
    """Exactly one fault: ``kind`` in episode ``episode`` of sub-env ``env`` at step ``t``."""

    def __init__(self, kind: str, *, env: int = 1, episode: int = 1, t: int = 3) -> None:
        super().__init__(0, (kind,), envs=(env,))
        self.fault = Fault(env, episode, 0 if kind in RESET_KINDS else t, kind)

    def at(self, env: int, episode: int) -> Fault | None:
        return self.fault if (env, episode) == self.fault[:2] else None


class EveryEpisode(FaultSchedule):
    """Sub-env ``env`` raises at step ``t`` of each of its first ``episodes`` episodes
    (``every``: only of every ``every``-th one), after ``t - 1`` good steps. ``episodes``
    bounds the run, so a runner that keeps restarting ends instead of looping forever."""

    def __init__(self, *, env: int = 1, t: int = 2, episodes: int = 50, every: int = 1) -> None:
        super().__init__(0, (EVERY_EPISODE_KIND,), envs=(env,))
        self.env, self.t, self.episodes, self.every = env, t, episodes, every

    def at(self, env: int, episode: int) -> Fault | None:
        if env != self.env or episode >= self.episodes or episode % self.every:
            return None
        return Fault(env, episode, self.t, EVERY_EPISODE_KIND)


class Step(NamedTuple):
    """One transition as the simulator produced it (``clean``: no fault touched it)."""

    obs: np.ndarray
    action: int
    reward: float
    terminated: bool
    truncated: bool
    next_obs: np.ndarray
    clean: bool


class Ledger:
    """What the faulty envs of one run produced (see the module docstring)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.steps: dict[tuple[int, int, int], Step] = {}
        self.faults: list[tuple[Fault, int]] = []  # (fault, time.monotonic_ns() it fired)
        self.builds: Counter[int] = Counter()
        self._episodes: Counter[int] = Counter()
        if path is not None:
            path.mkdir(parents=True, exist_ok=True)

    # -- written by the envs (in worker processes: to files) ------------------------------
    def _append(self, env: int, record: dict) -> None:
        assert self.path is not None
        with open(self.path / f"env{env}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def next_episode(self, env: int) -> int:
        """The number of ``env``'s next episode; it survives restarts of the sub-env."""
        if self.path is None:
            self._episodes[env] += 1
            return self._episodes[env] - 1
        counter = self.path / f"env{env}.episodes"
        k = int(counter.read_text()) if counter.exists() else 0
        tmp = counter.with_suffix(".tmp")
        tmp.write_text(str(k + 1))
        os.replace(tmp, counter)  # atomic: a worker killed meanwhile leaves the old count
        return k

    def built(self, env: int) -> None:
        if self.path is None:
            self.builds[env] += 1
        else:
            self._append(env, {"built": env})

    def add_step(self, key: tuple[int, int, int], step: Step) -> None:
        if self.path is None:
            self.steps[key] = step
        else:
            rec = step._asdict()
            rec.update(obs=step.obs.tolist(), next_obs=step.next_obs.tolist(), key=key)
            self._append(key[0], {"step": rec})

    def add_fault(self, fault: Fault) -> None:
        now = time.monotonic_ns()
        if self.path is None:
            self.faults.append((fault, now))
        else:
            self._append(fault.env, {"fault": list(fault), "ns": now})

    # -- read by the tests ----------------------------------------------------------------
    def refresh(self) -> Ledger:
        """Read what worker processes wrote (file-backed ledgers; a no-op otherwise)."""
        if self.path is None:
            return self
        self.steps, self.faults, self.builds = {}, [], Counter()
        for file in sorted(self.path.glob("env*.jsonl")):
            for line in file.read_text().splitlines():
                rec = json.loads(line)
                if "built" in rec:
                    self.builds[rec["built"]] += 1
                elif "fault" in rec:
                    self.faults.append((Fault(*rec["fault"]), rec["ns"]))
                else:
                    s = rec["step"]
                    key = tuple(s.pop("key"))
                    self.steps[key] = Step(
                        **{**s, "obs": np.float32(s["obs"]), "next_obs": np.float32(s["next_obs"])}
                    )
        return self

    def fault_of(self, env: int, episode: int) -> tuple[Fault, int] | None:
        """The failing fault injected in ``(env, episode)`` and when, if any."""
        for f, ns in self.faults:
            if (f.env, f.episode) == (env, episode) and f.kind in FAILING_KINDS:
                return f, ns
        return None

    def injected(self) -> Counter[str]:
        return Counter(f.kind for f, _ in self.faults)


class TraceEnv(gym.Env):
    """A small seeded env: obs ``[noise, t / 10, last action]``, random rewards and
    episode lengths in [4, 15], ending terminated or truncated."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(4, 16))
        return np.array([self.np_random.uniform(-1, 1), 0.0, -1.0], np.float32), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise AssertionError(f"TraceEnv got an action outside its space: {action!r}")
        return self._advance(int(action))

    def _advance(self, action: int) -> tuple:
        self.t += 1
        obs = np.array([self.np_random.uniform(-1, 1), self.t / 10, action], np.float32)
        reward = float(np.round(self.np_random.normal(), 3)) + float(action)
        done = self.t >= self.length
        term = done and bool(self.np_random.random() < 0.5)
        return obs, reward, term, done and not term, {}


class FaultyEnv(gym.Wrapper):
    """Injects the scheduled faults of sub-env ``index`` and logs into ``ledger``."""

    def __init__(
        self, env: gym.Env, index: int, schedule: FaultSchedule, ledger: Ledger, hang_s: float
    ) -> None:
        super().__init__(env)
        self.index, self.schedule, self.ledger, self.hang_s = index, schedule, ledger, hang_s
        self.fault: Fault | None = None
        ledger.built(index)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.episode = self.ledger.next_episode(self.index)
        self.t = 0
        self.fault = self.schedule.at(self.index, self.episode)
        if self.fault is not None and self.fault.t == 0:
            self.ledger.add_fault(self.fault)
            raise InjectedFault(f"injected reset failure in sub-env {self.index}")
        self.obs, info = self.env.reset(seed=seed, options=options)
        return self.obs, info

    def step(self, action):
        key = (self.index, self.episode, self.t)
        fault = self.fault if self.fault is not None and self.fault.t == self.t + 1 else None
        kind = fault.kind if fault is not None else None
        if kind in RAISE_KINDS or kind in ("hang", EVERY_EPISODE_KIND):
            self.ledger.add_fault(fault)
            if kind == EVERY_EPISODE_KIND:
                raise InjectedFault(f"injected failure in episode {self.episode} of {self.index}")
            if kind == "step_raise":
                raise InjectedFault(f"injected step failure in sub-env {self.index}")
            if kind == "noargs_raise":
                raise NoArgsFault()
            if kind == "odd_raise":
                raise OddFault(7, "odd")
            if kind == "unpicklable_raise":
                raise UnpicklableFault()
            time.sleep(self.hang_s)  # hang: the runner must give up on this worker first
        obs, reward, term, trunc, info = self.env.step(action)
        if kind in INFO_KINDS:
            self.ledger.add_fault(fault)
            info = {**info, "handle": threading.Lock()}
        elif kind is not None:
            obs, reward = corrupt(kind, obs, reward, self.observation_space)
            self.ledger.add_fault(fault)
        clean = kind is None or kind in INFO_KINDS
        self.ledger.add_step(key, Step(self.obs, int(action), reward, term, trunc, obs, clean))
        self.obs = obs
        self.t += 1
        return obs, reward, term, trunc, {**info, "key": key}


def corrupt(kind: str, obs: np.ndarray, reward: float, space: gym.Space) -> tuple[Any, float]:
    """The bad output of a value, shape or space fault."""
    obs = np.array(obs, copy=True)
    if kind == "nan_obs":
        obs[0] = np.nan
    elif kind == "inf_obs":
        obs[1] = -np.inf
    elif kind == "nan_reward":
        reward = float("nan")
    elif kind == "bad_shape":
        obs = np.concatenate([obs, obs])
    elif kind == "bad_dtype":
        obs = obs.astype(np.complex64)
    elif kind == "out_of_space":
        obs[0] = space.high[0] * 3  # finite, outside the bounds
    else:
        raise ValueError(kind)
    return obs, reward


class FaultyEnvCreator:
    """``creator(ctx) -> FaultyEnv(TraceEnv)``; picklable, for worker processes too."""

    def __init__(
        self, schedule: FaultSchedule, ledger: Ledger, *, base: type = TraceEnv, hang_s: float = 30
    ) -> None:
        self.schedule, self.ledger, self.base, self.hang_s = schedule, ledger, base, hang_s

    def __call__(self, ctx: rc.EnvContext) -> gym.Env:
        return FaultyEnv(self.base(), ctx.vector_index, self.schedule, self.ledger, self.hang_s)


class KeyedPolicy(rc.Policy):
    """A Discrete action that is a function of the observation only (no shared RNG), so
    each sub-env's data is independent of the others'. ``bad`` (call number -> kind)
    makes it fail: ``"raise"``, ``"out_of_space"``, ``"negative"``, ``"float"``."""

    def __init__(self, observation_space, action_space, bad: Mapping[int, str] | None = None):
        super().__init__(observation_space, action_space, seed=0)
        self.bad = dict(bad or {})
        self.calls = 0

    def compute_actions(self, input_batch, explore=True):
        self.calls += 1
        obs = np.asarray(input_batch["obs"], np.float64).reshape(len(input_batch["obs"]), -1)
        n = int(self.action_space.n)
        code = np.nan_to_num(np.abs(obs[:, 0]) * 1e4, posinf=0.0)
        actions = code.astype(np.int64) % n
        kind = self.bad.get(self.calls)
        if kind == "raise":
            raise InjectedFault(f"injected policy failure at call {self.calls}")
        if kind == "out_of_space":
            actions[-1] = n + 4
        elif kind == "negative":
            actions[0] = -1
        elif kind == "float":
            return actions.astype(np.float64) + 0.5, [], {}
        return actions, [], {}


class RaisingCallbacks(rc.Callbacks):
    """Raises ``InjectedFault`` in hook ``hook`` at its ``at``-th call; counts calls."""

    def __init__(self, hook: str, at: int) -> None:
        self.hook, self.at = hook, at
        self.calls: Counter[str] = Counter()

    def _tick(self, name: str) -> None:
        self.calls[name] += 1
        if name == self.hook and self.calls[name] == self.at:
            raise InjectedFault(f"injected callback failure in {name}")

    def on_episode_created(self, **kw):
        self._tick("on_episode_created")

    def on_episode_start(self, **kw):
        self._tick("on_episode_start")

    def on_episode_step(self, **kw):
        self._tick("on_episode_step")

    def on_episode_end(self, **kw):
        self._tick("on_episode_end")

    def on_postprocess_trajectory(self, **kw):
        self._tick("on_postprocess_trajectory")

    def on_sample_end(self, **kw):
        self._tick("on_sample_end")
