"""Where a synchronous poll of env workers spends its time, stamped in the runner and in
the workers (one clock: ``time.monotonic`` is the same in every process on Linux).

Runs an ``EnvRunner`` with ``num_env_workers=2`` (RandomPolicy) and stamps, per poll:

- ``wake workers``: the runner writing the poll commands and waking each worker;
- ``until worker runs``: from that to the worker starting its poll (per worker);
- ``worker step``: the worker's own poll of its sub-envs (per worker);
- ``answer to runner``: from the end of a worker's poll to the runner having every answer;
- ``rows out of block``: the runner copying the rows out of the shared block;
- ``kernel and rest``: everything else until the next poll (step kernel, acting, batch
  building every ``rollout_fragment_length`` polls).

``--no-linger`` makes idle workers sleep on their pipe at once instead of watching for the
next poll first (``rlconnect.envs.workers.linger``): the "until worker runs" phase shows
what lingering saves. It wraps private methods of ``rlconnect.envs.workers`` (a profiling
tool, not an API), so workers must be forked (Linux's default start method). Medians,
means and the 90th percentile over the polls; the share of polls in which a worker started
more than half a step late shows workers queued behind each other on one CPU.

    python benchmarks/bench_worker_poll.py [--env CartPole-v1] [--num-envs 64] [--polls 2000]
                                           [--no-linger]
    python benchmarks/bench_worker_poll.py --env ALE/Pong-v5 --num-envs 8 --preset atari
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import rlconnect as rc
from rlconnect.envs import make_base_env
from rlconnect.envs.workers import pool as pool_module
from rlconnect.envs.workers import worker as worker_module


def _stamp_workers(folder: Path, polls: int) -> None:
    """Workers write ``(start, end)`` of their first ``polls`` polls to ``folder``."""
    poll = worker_module._Server.poll

    def stamped(self: Any, extra: Any) -> bytes:
        start = time.monotonic()
        out = poll(self, extra)
        log = self.__dict__.setdefault("_stamps", [])
        log.append((start, time.monotonic()))
        if len(log) == polls:
            (folder / f"worker{self.spec.offset}.pkl").write_bytes(pickle.dumps(log))
        return out

    server: Any = worker_module._Server  # wrapped on purpose (a profiling tool, not an API)
    server.poll = stamped


def _stamp_runner(log: dict[str, list[tuple[float, float]]]) -> None:
    """The runner's ``_dispatch``, ``_collect`` and ``_rows`` append ``(start, end)``."""
    for name in ("_dispatch", "_collect", "_rows"):
        method = getattr(pool_module.WorkerEnvs, name)

        def stamped(self: Any, *args: Any, _m: Any = method, _n: str = name) -> Any:
            start = time.monotonic()
            out = _m(self, *args)
            log.setdefault(_n, []).append((start, time.monotonic()))
            return out

        setattr(pool_module.WorkerEnvs, name, stamped)


def _runner(env: str, num_envs: int, preset: str | None) -> rc.EnvRunner:
    config = rc.RunnerConfig(
        num_envs=num_envs,
        rollout_fragment_length=50,
        seed=0,
        check_env=False,
        preset=preset,
        num_env_workers=2,
    )
    base = make_base_env(
        env,
        num_envs=num_envs,
        seed=0,
        env_config=config.env_config,
        preset=preset,
        num_env_workers=2,
    )
    ctx = rc.ConnectorContext(
        base.observation_space(rc.DEFAULT_AGENT_ID),
        base.action_space(rc.DEFAULT_AGENT_ID),
        config.connector_config(),
    )
    space = rc.default_agent_pipeline(ctx).output_space
    return rc.EnvRunner(base, rc.RandomPolicy(space, ctx.action_space), config=config)


def phase_row(name: str, values: Any, width: int = 28) -> str:
    """A table row: the median, mean and 90th percentile of ``values`` (seconds) in us."""
    us = np.asarray(values) * 1e6
    return f"{name:<{width}} {np.median(us):9.1f} {us.mean():9.1f} {np.percentile(us, 90):9.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--polls", type=int, default=2000, help="polls stamped (after 100)")
    ap.add_argument("--quick", action="store_true", help="a short run (300 polls)")
    ap.add_argument(
        "--no-linger",
        action="store_true",
        help="idle workers sleep on their pipe at once (what they did before `linger`)",
    )
    args = ap.parse_args(argv)
    if args.no_linger:  # reaches the workers by fork, like the stamps
        worker_module.linger = lambda *a, **k: False
    polls = 300 if args.quick else args.polls
    skip = 100  # warm-up polls left out
    log: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _stamp_workers(folder, skip + polls + 2)
        _stamp_runner(log)
        runner = _runner(args.env, args.num_envs, args.preset)
        try:
            while len(log.get("_dispatch", ())) < skip + polls + 3:
                runner.sample()
            deadline = time.monotonic() + 10
            files = [folder / f"worker{o}.pkl" for o in (0, (args.num_envs + 1) // 2)]
            while not all(f.exists() for f in files) and time.monotonic() < deadline:
                time.sleep(0.05)
            workers = [np.array(pickle.loads(f.read_bytes())) for f in files]
        finally:
            runner.stop()
    dispatch, collect, rows = (np.array(log[k]) for k in ("_dispatch", "_collect", "_rows"))
    k = np.arange(skip, skip + polls)
    cols: dict[str, np.ndarray] = {
        "wake workers": dispatch[k, 1] - dispatch[k, 0],
        "rows out of block": rows[k, 1] - rows[k, 0],
        "kernel and rest": dispatch[k + 1, 0] - rows[k, 1],
    }
    late = []
    for w, stamps in enumerate(workers):
        j = np.searchsorted(stamps[:, 0], dispatch[k, 0])  # the poll each dispatch started
        start, end = stamps[j, 0], stamps[j, 1]
        cols[f"until worker {w} runs"] = start - dispatch[k, 0]
        cols[f"worker {w} step"] = end - start
        cols[f"answer {w} to runner"] = collect[k, 1] - end
        late.append((start - dispatch[k, 0]) > 0.5 * np.median(end - start))
    total = dispatch[k + 1, 0] - dispatch[k, 0]
    idle = "sleep at once" if args.no_linger else "linger"
    print(
        f"{args.env}, N={args.num_envs}, 2 env workers ({idle}), synchronous; {polls} polls; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'us per poll':<28} {'median':>9} {'mean':>9} {'p90':>9}")
    for name, values in cols.items():
        print(phase_row(name, values))
    print(phase_row("whole poll", total))
    steps_s = args.num_envs / total.mean()
    queued = np.mean(np.any(late, axis=0)) * 100
    print(f"env steps/s from the mean poll: {steps_s:,.0f}")
    print(f"polls in which a worker started more than half a step late: {queued:.1f} %")


if __name__ == "__main__":
    main()
