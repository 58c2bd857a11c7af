"""Env worker processes never outlive their runner, and may start processes of their own.

Workers are not daemonic, so an env may start a ``multiprocessing.Process`` (a simulator
server, say). ``stop()``, the garbage collection of a runner never stopped, and the
interpreter's exit each end every worker, and with it (through the envs' ``close()``) the
processes its envs started; workers whose runner process was killed end by themselves.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from env_cases import StepCountEnv, check_count_truth, make_with_helper

import rlconnect as rc
from machine_speed import scaled

ENVS_DIR = Path(__file__).parent
SRC_DIR = Path(rc.__file__).parents[1]


def children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return not stat.parent.parent.exists()  # no /proc: trust os.kill


def all_gone(pids: set[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + scaled(within_s)
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def helper_pids(batch: rc.SampleBatch) -> set[int]:
    return {int(i["helper_pid"]) for i in batch["infos"]}


def runner(**cfg) -> rc.EnvRunner:
    config = rc.RunnerConfig(num_envs=3, rollout_fragment_length=10, seed=21, **cfg)
    policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
    return rc.EnvRunner(make_with_helper, policy, config=config)


@pytest.mark.parametrize("cfg", [{"remote_envs": True}, {"num_env_workers": 2}])
def test_envs_in_workers_may_start_processes_of_their_own(cfg):
    def sample(**kw):
        r = runner(**kw)
        try:
            return [r.sample() for _ in range(2)]
        finally:
            r.stop()

    local = sample()
    before = children()
    remote = sample(**cfg)
    assert children() <= before  # the workers ended with stop()
    helpers = set().union(*(helper_pids(b) for b in remote))
    assert len(helpers) == 3 and not helpers & before  # started in the workers
    assert all_gone(helpers)  # ended by the envs' close() in their workers
    for a, b in zip(local, remote, strict=True):
        check_count_truth(b)  # the rewards came from the helpers
        for key in a:
            if key != "infos":
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        strip = [{k: v for k, v in i.items() if k != "helper_pid"} for i in a["infos"]]
        assert strip == [{k: v for k, v in i.items() if k != "helper_pid"} for i in b["infos"]]


def test_a_runner_dropped_without_stop_ends_its_workers():
    before = children()
    r = runner(remote_envs=True)
    helpers = helper_pids(r.sample())
    workers = children() - before
    assert len(workers) == 3 and len(helpers) == 3
    del r
    gc.collect()
    assert not children() & workers  # ended (and reaped) with the runner
    assert all_gone(helpers)


_SCRIPT = """
import weakref
class Early: pass
early = Early()
weakref.finalize(early, print, end="")  # weakref's exit hook now runs after multiprocessing's
import multiprocessing, sys, time
sys.path.insert(0, {envs!r})
import rlconnect as rc
from env_cases import StepCountEnv, make_with_helper

config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=6, seed=0, remote_envs=True)
policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
runner = rc.EnvRunner(make_with_helper, policy, config=config)
batch = runner.sample()
workers = [p.pid for p in multiprocessing.active_children()]
helpers = sorted({{i["helper_pid"] for i in batch["infos"]}})
print(" ".join(map(str, workers + helpers)), flush=True)
time.sleep({hold_s})
# the script ends here, the runner still referenced and never stopped
"""


def script(hold_s: float = 0.0) -> tuple[list[str], dict[str, str]]:
    """A Python command running ``_SCRIPT``, and the environment it needs."""
    code = textwrap.dedent(_SCRIPT.format(envs=str(ENVS_DIR), hold_s=hold_s))
    path = os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])
    return [sys.executable, "-c", code], {**os.environ, "PYTHONPATH": path}


def test_interpreter_exit_ends_the_workers_of_a_runner_never_stopped():
    cmd, env = script()
    # exit did not wait on a worker forever (a wait that long is a hang, and raises)
    timeout = scaled(60.0)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert out.returncode == 0, out.stderr
    pids = {int(p) for p in out.stdout.split()}
    assert len(pids) == 4  # two workers, two helpers
    assert all_gone(pids)
    assert "Traceback" not in out.stderr and "leaked" not in out.stderr, out.stderr


def test_the_workers_of_a_killed_runner_process_end_by_themselves():
    cmd, env = script(hold_s=60)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        pids = {int(p) for p in proc.stdout.readline().split()}
    finally:
        proc.kill()
        proc.wait()
    assert len(pids) == 4  # two workers, two helpers
    assert all_gone(pids)  # the pipes to the runner closed: the workers closed their envs


@pytest.mark.slow
def test_a_killed_worker_whose_env_started_a_process_is_still_found_dead(tmp_path):
    """The helper, which outlives the killed worker until released, holds the worker's
    end of the pipe open: no end of file tells the runner, the worker's process does; the
    worker is replaced while the old helper still runs, and that helper, once released,
    ends by itself."""
    before = children()
    release = tmp_path / "release"
    env_config = {"helper_linger_s": 120.0, "helper_release": str(release)}
    r = runner(remote_envs=True, restart_failed_sub_environments=True, env_config=env_config)
    try:
        helpers = helper_pids(r.sample())
        r.get_metrics()
        old = {p.name: p.pid for p in multiprocessing.active_children() if p.pid not in before}
        os.kill(old["rlconnect-env-worker-1"], signal.SIGKILL)
        # a runner that waited for the helper would hang: let it go after a while, so
        # that such a runner fails the check below instead
        watchdog = threading.Timer(scaled(20.0), release.touch)
        watchdog.start()
        batches = [r.sample() for _ in range(2)]
        watchdog.cancel()
        # not waiting for the helper to end: every old helper, the killed worker's too, runs
        assert all(alive(p) for p in helpers)
        metrics = r.get_metrics()
        helpers |= set().union(*(helper_pids(b) for b in batches))
        assert len(helpers) == 4  # the rebuilt sub-env started a new one
    finally:
        release.touch()
        r.stop()
    assert children() <= before
    assert all_gone(helpers)  # the killed worker's helper too
    for b in batches:
        assert len(b) == 30
        check_count_truth(b)
    assert [m["env_id"] for m in metrics if m["episode_faulty"]] == [1]


class LoggedClose(StepCountEnv):
    """Appends its sub-env index to a file when closed; odd sub-envs step slowly."""

    def __init__(self, ctx: rc.EnvContext) -> None:
        super().__init__(10_000 * ctx.vector_index)
        self.index, self.log = ctx.vector_index, ctx.config["close_log"]
        self.delay = 0.05 if ctx.vector_index % 2 else 0.0

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)

    def close(self) -> None:
        with open(self.log, "a") as f:
            f.write(f"{self.index}\n")


def make_logged(ctx: rc.EnvContext):
    return gym.wrappers.TimeLimit(LoggedClose(ctx), max_episode_steps=7)


def test_stop_closes_every_env_also_in_workers_busy_with_a_step(tmp_path, monkeypatch):
    """stop() waits for a step in flight (0.05 s), then the workers close their envs: it
    neither kills them at once nor waits out the kill deadline (made long here)."""
    monkeypatch.setattr("rlconnect.envs.workers.pool.CLOSE_WAIT_S", 30.0)
    log = tmp_path / "closed"
    config = rc.RunnerConfig(
        num_envs=4,
        rollout_fragment_length=4,
        seed=0,
        remote_envs=True,
        env_poll_size=1,
        env_config={"close_log": str(log)},
    )
    policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
    before = children()
    r = rc.EnvRunner(make_logged, policy, config=config)
    r.sample()  # returns while the slow sub-envs' workers still step
    start = time.monotonic()
    r.stop()
    assert time.monotonic() - start < scaled(3.0)  # a step's wait, not the kill deadline
    assert children() <= before
    assert sorted(int(i) for i in log.read_text().split()) == [0, 1, 2, 3]


def test_ctrl_c_does_not_end_the_workers():
    """SIGINT (Ctrl-C in a terminal reaches the whole process group) is the runner's to
    act on: a worker that gets it keeps stepping, and the runner ends it when it stops."""
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=10, seed=3, num_env_workers=2)
    policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
    before = children()
    r = rc.EnvRunner(lambda ctx: gym.wrappers.TimeLimit(StepCountEnv(), 7), policy, config=config)
    try:
        r.sample()
        workers = children() - before
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGINT)  # handled before the worker reads its next command
        check_count_truth(r.sample())  # the same processes step on
        assert all(alive(pid) for pid in workers)
        assert children() - before == workers
    finally:
        r.stop()
    assert all_gone(workers)


_HANG_SCRIPT = """
import ctypes, multiprocessing, os, sys, threading, time
import gymnasium as gym
import numpy as np
import rlconnect as rc

method, where, hang = sys.argv[1:4]
if method != "default":
    multiprocessing.set_start_method(method)


class HangEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        print(os.getpid(), flush=True)  # the worker shares the runner's stdout
        if hang == "gil":  # a C call that keeps the GIL: no thread of the worker runs
            ctypes.PyDLL(None).sleep(3600)
        time.sleep(3600)


def sample():
    policy = rc.RandomPolicy(HangEnv.observation_space, HangEnv.action_space)
    config = rc.RunnerConfig(num_envs=1, num_env_workers=1, rollout_fragment_length=4)
    rc.EnvRunner(lambda ctx: HangEnv(), policy, config=config).sample()


if __name__ == "__main__":
    if where == "thread":
        threading.Thread(target=sample).start()
    else:
        sample()
"""


def _read_line(proc: subprocess.Popen, within_s: float) -> str:
    """The first line ``proc`` prints, within ``within_s`` (a select with a deadline)."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], within_s)
    assert ready, f"no line within {within_s} s"
    return proc.stdout.readline()


@pytest.mark.skipif(sys.platform == "win32", reason="the watchdog follows a POSIX parent")
@pytest.mark.parametrize(
    ("method", "where", "hang"),
    [
        ("default", "main", "sleep"),  # the parent-death signal (Linux) and the watchdog
        ("default", "thread", "sleep"),  # started from a thread: the watchdog alone
        pytest.param(
            "default",
            "main",
            "gil",  # the step holds the GIL: the parent-death signal alone
            marks=pytest.mark.skipif(
                not sys.platform.startswith("linux"), reason="the death signal is Linux's"
            ),
        ),
        ("forkserver", "thread", "sleep"),  # the fork server goes with the runner
    ],
)
def test_a_worker_hung_in_a_step_dies_with_its_killed_runner(tmp_path, method, where, hang):
    """SIGKILL the runner's process while its worker's step sleeps for an hour: the
    worker ends within seconds, whether or not the step ever returns."""
    script = tmp_path / "hang.py"
    script.write_text(_HANG_SCRIPT)
    path = os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, str(script), method, where, hang],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    try:
        worker = int(_read_line(proc, within_s=60))
        assert alive(worker) and worker != proc.pid
    finally:
        proc.kill()
        proc.wait()
        killed = time.monotonic()
    assert all_gone({worker}, within_s=10.0), "the worker outlived its runner"
    print(f"{method}/{where}/{hang}: worker gone {time.monotonic() - killed:.2f} s after the kill")


def test_a_worker_started_from_a_thread_outlives_that_thread():
    """The parent-death signal follows the thread that started a worker: a worker
    started from a thread that ends (a server's sampling thread) must not die with it."""
    config = rc.RunnerConfig(num_envs=2, rollout_fragment_length=5, seed=1, num_env_workers=1)
    policy = rc.RandomPolicy(StepCountEnv.observation_space, StepCountEnv.action_space)
    before = children()
    made: list[rc.EnvRunner] = []

    def build() -> None:
        made.append(rc.EnvRunner(lambda ctx: StepCountEnv(), policy, config=config))
        made[0].sample()

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    r = made[0]
    try:
        workers = children() - before
        assert len(workers) == 1
        time.sleep(0.5)  # a signal sent when the thread ended would have arrived by now
        check_count_truth(r.sample())
        assert children() - before == workers and all(alive(p) for p in workers)
    finally:
        r.stop()
    assert all_gone(workers)
