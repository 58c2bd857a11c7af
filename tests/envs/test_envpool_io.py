"""EnvPool I/O: the pool's C++ send/recv equal its public API; the step starts early."""

from __future__ import annotations

import numpy as np
import pytest
from env_cases import check_cartpole_truth, spaces

import rlconnect as rc
from rlconnect.envs.envpool_io import PoolIO, pool_io

envpool = pytest.importorskip("envpool")  # the optional extra (installed with "dev")


def _steps(io: PoolIO, ids: np.ndarray | None, polls: int) -> dict[int, list]:
    """Each env's steps, by env id. Actions depend only on the env and its step count, so
    an asynchronous pool's order of arrival (thread timing) changes nothing."""
    n = int(io.pool.config["num_envs"])
    count = np.zeros(n, dtype=np.int64)
    out: dict[int, list] = {e: [] for e in range(n)}
    for _ in range(polls):
        envs = np.arange(n) if ids is None else ids
        io.send((count[envs] * 7 + envs) % io.pool.action_space.n, ids)
        count[envs] += 1
        obs, rew, term, trunc, info = io.recv()
        for k, e in enumerate(info["env_id"].tolist()):
            extra = {name: v[k] for name, v in info.items() if name != "players"}
            out[e].append((obs[k], rew[k], term[k], trunc[k], extra))
        if ids is not None:  # an asynchronous pool: send to those that came back
            ids = info["env_id"].astype(np.int32)
    return out


@pytest.mark.parametrize(
    ("task", "kw"),
    [("CartPole-v1", {}), ("CartPole-v1", {"batch_size": 2}), ("Pong-v5", {"stack_num": 1})],
)
def test_direct_io_gives_what_envpools_public_api_gives(task, kw):
    if task.startswith("Pong"):
        pytest.importorskip("ale_py")
    n, runs = 4, []
    for direct in (True, False):
        pool = envpool.make_gymnasium(task, num_envs=n, seed=3, num_threads=1, **kw)
        io = pool_io(pool) if direct else PoolIO(pool)
        assert (type(io) is not PoolIO) == direct  # these pools take the direct route
        ids = None
        if "batch_size" in kw:
            pool.async_reset()
            ids = io.recv()[4]["env_id"].astype(np.int32)  # in order of arrival
        else:
            pool.reset()
        runs.append(_steps(io, ids, 60))
        pool.close()
    mine, theirs = runs
    for e in range(n):
        k = min(len(mine[e]), len(theirs[e]))
        assert k >= 10
        for a, b in zip(mine[e][:k], theirs[e][:k]):
            for x, y in zip(a[:4], b[:4]):
                np.testing.assert_array_equal(x, y)
            assert a[4].keys() == b[4].keys()
            for name in a[4]:
                np.testing.assert_array_equal(a[4][name], b[4][name])


def test_a_pool_without_envpools_cpp_methods_takes_the_public_route():
    class Wrapped:  # e.g. another EnvPool version, or a proxy around a pool
        def __init__(self, pool) -> None:
            self._pool = pool
            self.action_space = pool.action_space
            self.config = pool.config

        def send(self, actions, env_ids=None):
            return self._pool.send(actions, env_ids)

        def recv(self):
            return self._pool.recv()

    io = pool_io(Wrapped(envpool.make_gymnasium("CartPole-v1", num_envs=2)))
    assert type(io) is PoolIO


class _Logged:
    """A pool proxy logging its sends and receives into ``log``."""

    def __init__(self, pool, log: list) -> None:
        self._pool, self._log = pool, log

    def __getattr__(self, name):
        real = getattr(self._pool, name)
        if name.lstrip("_") not in ("send", "recv"):
            return real

        def call(*args):
            self._log.append(name.lstrip("_"))
            return real(*args)

        return call


def test_the_pool_steps_while_the_runner_ends_episodes():
    """The actions go out once every row has one, before the poll's episodes end (their
    resets are queued with them), and the next poll only receives."""
    log: list = []

    class Ends(rc.Callbacks):
        def on_episode_end(self, **kwargs) -> None:
            log.append("end")

    config = rc.RunnerConfig(num_envs=4, rollout_fragment_length=40, seed=7)
    policy = rc.RandomPolicy(*spaces())
    r = rc.EnvRunner("envpool:CartPole-v1", policy, config=config, callbacks=Ends())
    r.sample()
    r.env.pool = _Logged(r.env.pool, log)
    log.clear()
    try:
        batches = [r.sample() for _ in range(2)]
    finally:
        r.stop()
    for b in batches:
        check_cartpole_truth(b)
    assert "end" in log
    # every episode end comes after the send of its poll and before the next receive
    for i, event in enumerate(log):
        if event == "end":
            before = [e for e in log[:i] if e != "end"]
            assert before[-1] == "send", log[max(0, i - 4) : i + 1]
    # the first receive is the step the first sample started, stop() receives the last
    assert log[0] == "recv" and log[-1] == "recv"
    assert log.count("recv") == log.count("send") + 1
