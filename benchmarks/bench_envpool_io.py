"""EnvPool's Python wrapper against its C++ calls: microseconds per synchronous step.

A CartPole-v1 pool of N=64 envs (1 thread) is stepped with random actions three ways:
EnvPool's public ``send`` + ``recv``, the same through ``rlconnect.envs.envpool_io``'s
direct route (the pool's C++ ``_send`` / ``_recv``, what the runner uses for pools of the
common layout), and ``step`` for reference. The contenders take turns for ``--rounds``
rounds; the table gives the median [min-max] microseconds per step and the difference of
the medians: the wrapper's own cost per poll, which the runner no longer pays.

    python benchmarks/bench_envpool_io.py [--quick] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from rlconnect.envs.envpool_io import PoolIO, pool_io

N = 64


def contenders() -> tuple[dict[str, Callable[[np.ndarray], object]], Callable[[], None]]:
    import envpool

    pools = [envpool.make_gymnasium("CartPole-v1", num_envs=N, num_threads=1, seed=0) for _ in "ab"]
    for p in pools:
        p.reset()
    public, direct = PoolIO(pools[0]), pool_io(pools[1])
    assert type(direct) is not PoolIO, "this EnvPool has no direct route"

    def close() -> None:
        for p in pools:
            p.close()

    def public_poll(a: np.ndarray) -> object:
        public.send(a, None)
        return public.recv()

    def direct_poll(a: np.ndarray) -> object:
        direct.send(a, None)
        return direct.recv()

    return {
        "public send + recv": public_poll,
        "direct send + recv": direct_poll,
        "public step": lambda a: pools[0].step(a),
    }, close


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rounds, steps = (1, 200) if args.quick else (args.rounds, 5000)
    try:
        runs, close = contenders()
    except ImportError as exc:
        print(f"skipped: {exc}")
        return
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, size=N) for _ in range(256)]
    us: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for r in range(rounds):
            for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
                run, t0 = runs[name], time.perf_counter()
                for k in range(steps):
                    run(actions[k % 256])
                us[name].append((time.perf_counter() - t0) / steps * 1e6)
    finally:
        close()
    print(f"EnvPool CartPole-v1, N={N}, 1 thread: us per synchronous step, median [min-max]")
    for name, values in us.items():
        print(f"{name:<22} {statistics.median(values):8.1f}  [{min(values):.1f}-{max(values):.1f}]")
    saved = statistics.median(us["public send + recv"]) - statistics.median(
        us["direct send + recv"]
    )
    print(f"the wrapper's own cost per poll: {saved:.1f} us")


if __name__ == "__main__":
    main()
