"""How fast is the Atari preset against a hand-written gymnasium loop, and how much memory
do its batches take?

Timed (env steps per second, each env step = 4 emulator frames, random actions):

- ``rlconnect preset``: ``rc.EnvRunner(game, rc.RandomPolicy, RunnerConfig(preset="atari",
  num_envs=N))``: env-side frame skip / max-pool / no-op and FIRE resets on gray screens
  read from the emulator and resized to 84x84, then the batched connectors ClipReward ->
  FrameStack(4), storing every transition in the runner's batches (``obs`` and
  ``new_obs``, each frame once).
- ``with Resize connector``: the same with ``env_config={"screen_size": None}``: 210x160
  frames from the env, resized by the ``Resize`` connector over the whole batch (what the
  preset did before the env resized its frames).
- ``gymnasium loop``: N envs ``AtariPreprocessing(frame_skip=4, screen_size=84,
  noop_max=30)`` + ``FrameStackObservation(4)``, stepped one after another in a Python
  loop, the reward's sign taken, observations kept in a list (the same work, by hand).

The three take turns in rounds in one process (machines are shared and noisy); the table
shows the median [range] steps/s of each, of the per-round ratios, and of the same ratio
of CPU time spent by this process (less disturbed by other programs on the machine).

Memory: bytes per stored transition of the preset's batches (``SampleBatch.nbytes``,
``obs`` + ``new_obs`` + the small columns), scaled to 1M transitions, for three layouts:
``plain`` (every (4, 84, 84) stack stored whole, what reading the columns gives: 56,448
bytes of stacks per transition), ``frames once`` (the default: each frame once plus an
index, ``rlconnect.batches.frame_stacks``) and ``frames once + LZ4``
(``RunnerConfig(compress_observations=True)``); and what reading ``batch["obs"]`` and
``batch["new_obs"]`` (materialising them) costs per transition.

    python benchmarks/bench_pixels.py            # full (~1-2 min)
    python benchmarks/bench_pixels.py --quick    # smoke run (N = 1, 2; seconds)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from _common import machine, median_range, print_table, ratios, take_turns

import rlconnect as rc
from rlconnect.envs.atari import FireReset, make_atari_env

STACKED = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def _policy(game: str) -> rc.RandomPolicy:
    env = make_atari_env(game)
    policy = rc.RandomPolicy(STACKED, env.action_space)
    env.close()
    return policy


def _runner(
    game: str, num_envs: int, batch_rows: int, compress: bool = False, native: bool = False
) -> rc.EnvRunner:
    """The preset runner; one ``sample()`` returns about ``batch_rows`` transitions.
    ``native``: 210x160 frames from the env, resized by the ``Resize`` connector."""
    config = rc.RunnerConfig(
        preset="atari",
        num_envs=num_envs,
        rollout_fragment_length=max(batch_rows // num_envs, 8),
        seed=0,
        compress_observations=compress,
        env_config={"screen_size": None} if native else {},
    )
    return rc.EnvRunner(game, _policy(game), config=config)


def _reference_env(game: str) -> gym.Env:
    env = gym.make(game, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(FireReset(env), 4)


class _HandLoop:
    """N gymnasium envs stepped one after another, observations kept in a list."""

    def __init__(self, game: str, num_envs: int) -> None:
        self.envs = [_reference_env(game) for _ in range(num_envs)]
        self.obs = [env.reset(seed=i)[0] for i, env in enumerate(self.envs)]
        space = self.envs[0].action_space
        assert isinstance(space, gym.spaces.Discrete), "Atari games have Discrete actions"
        self.n_actions = space.n
        self.rng = np.random.default_rng(0)

    def run(self, steps: int) -> int:
        kept: list[np.ndarray] = []
        done = 0
        while done < steps:
            actions = self.rng.integers(self.n_actions, size=len(self.envs))
            for i, env in enumerate(self.envs):
                new, reward, terminated, truncated, _ = env.step(int(actions[i]))
                kept.append(np.sign(float(reward)))
                kept.append(self.obs[i])
                self.obs[i] = env.reset()[0] if terminated or truncated else new
            done += len(self.envs)
        return done

    def close(self) -> None:
        for env in self.envs:
            env.close()


Timing = tuple[float, float]  # (env steps/s, CPU seconds per env step)


def _timed(runner: rc.EnvRunner, rows_wanted: int) -> tuple[float, float]:
    """(env steps/s, CPU seconds per step) of ``sample()`` calls until ``rows_wanted``."""
    rows, start, cpu = 0, time.perf_counter(), time.process_time()
    while rows < rows_wanted:
        rows += runner.sample().count
    return rows / (time.perf_counter() - start), (time.process_time() - cpu) / rows


def bench_speed(game: str, num_envs: int, steps: int, rounds: int) -> dict[str, list[Timing]]:
    """(env steps/s, CPU seconds per step) of the preset, of the preset resizing with the
    ``Resize`` connector instead of in the env, and of the hand loop, round by round. CPU
    time is the process's own, which other programs on a shared machine disturb less."""
    per_round = max(steps // rounds, num_envs)
    with (
        _runner(game, num_envs, per_round) as runner,  # (registers ale-py's games)
        _runner(game, num_envs, per_round, native=True) as connector,
    ):
        loop = _HandLoop(game, num_envs)
        runner.sample()  # warm up: env resets, first batch
        connector.sample()
        loop.run(8 * num_envs)

        def by_hand() -> Timing:
            start, cpu = time.perf_counter(), time.process_time()
            done = loop.run(per_round)
            return done / (time.perf_counter() - start), (time.process_time() - cpu) / done

        runs = take_turns(
            {
                "preset": lambda: _timed(runner, per_round),
                "connector": lambda: _timed(connector, per_round),
                "gymnasium": by_hand,
            },
            rounds,
        )
    loop.close()
    return runs


def speed_row(n: int, runs: dict[str, list[Timing]]) -> tuple:
    """A table row: rates, and the preset's speed over the others', by wall and CPU time
    (median [range] of the per-round ratios)."""
    rate = {k: [r for r, _ in v] for k, v in runs.items()}
    cpu = {k: [c for _, c in v] for k, v in runs.items()}
    return (
        n,
        median_range(rate["preset"]),
        median_range(rate["gymnasium"]),
        median_range(ratios(rate["preset"], rate["gymnasium"]), ".2f"),
        median_range(ratios(cpu["gymnasium"], cpu["preset"]), ".2f"),
        median_range(rate["connector"]),
        median_range(ratios(rate["preset"], rate["connector"]), ".2f"),
        median_range(ratios(cpu["connector"], cpu["preset"]), ".2f"),
    )


def bench_memory(game: str, num_envs: int, steps: int) -> dict:
    """Bytes per stored transition of each layout, and µs per transition to read ``obs``
    and ``new_obs`` from the compact ones (materialise them; best of 3) or, for scale, to
    copy them when they are plain arrays."""
    out: dict = {}
    for compress in (False, True):
        with _runner(game, num_envs, steps, compress=compress) as runner:
            runner.sample()
            batches: list[rc.SampleBatch] = []
            rows = 0
            while rows < steps:
                batch = runner.sample()
                assert isinstance(batch, rc.SampleBatch), "a single-agent env samples a SampleBatch"
                batches.append(batch)
                rows += len(batch)
        nbytes = sum(b.nbytes for b in batches)
        read_s = _best_seconds(_read, batches)
        plain = [rc.SampleBatch({k: b[k] for k in b}) for b in batches]  # stacks whole
        copy_s = _best_seconds(_copy, plain)
        out["plain"] = (sum(p.nbytes for p in plain) / rows, copy_s / rows * 1e6)
        out["frames once + LZ4" if compress else "frames once"] = (
            nbytes / rows,
            read_s / rows * 1e6,
        )
    return out


def _read(batches: list[rc.SampleBatch]) -> list:
    return [(b["obs"], b["new_obs"]) for b in batches]


def _copy(batches: list[rc.SampleBatch]) -> list:
    return [(b["obs"].copy(), b["new_obs"].copy()) for b in batches]


def _best_seconds(fn: Callable[[list], list], batches: list, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(batches)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small step counts (smoke test)")
    parser.add_argument("--game", default="ALE/Pong-v5")
    parser.add_argument("--rounds", type=int, default=None, help="alternations per N")
    args = parser.parse_args(argv)
    # quick: every contender, table and layout once, on the fewest envs and steps
    steps, sizes = (32, (1, 2)) if args.quick else (4000, (1, 8))
    rounds = args.rounds or (1 if args.quick else 10)

    print(machine())
    print(f"{args.game}, {steps} env steps per N (4 frames each) in {rounds} rounds, env steps/s")
    rows = [speed_row(n, bench_speed(args.game, n, steps, rounds)) for n in sizes]
    header = ("N", "rlconnect preset", "gymnasium loop", "ratio", "by CPU")
    print_table((*header, "with Resize connector", "preset vs it", "by CPU"), rows)

    mem = bench_memory(args.game, sizes[-1], steps)
    print(
        f"\nmemory of stored batches (preset, N={sizes[-1]}): bytes per transition -> "
        "per 1M transitions"
    )
    layouts = [
        ("plain (stacks stored whole)", *mem["plain"], "copying"),
        ("frames once (the default)", *mem["frames once"], "reading"),
        ("frames once + LZ4 (compress_observations=True)", *mem["frames once + LZ4"], "reading"),
    ]
    for label, per, us, verb in layouts:
        gib = per * 1e6 / 2**30
        print(f"  {label:<47} {per:>7.0f} B -> {gib:6.2f} GiB per 1M transitions", end="")
        print(f"  ({verb} obs+new_obs: {us:5.1f} µs)")


if __name__ == "__main__":
    main()
