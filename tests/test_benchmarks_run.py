"""Every benchmark script (``benchmarks/`` for users, ``benchmarks/dev/`` for developers) runs
to completion in its quick mode and prints its table.

No timing assertions: machines are noisy; the scripts print ratios for people to read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: script -> (timeout in seconds, words its output must contain)
BENCHMARKS = {
    "bench_learner.py": (
        120,
        ("rc.GAE", "per-trajectory loop", "times faster", "max |difference|"),
    ),
    "bench_numba_cache.py": (
        240,
        ("import numba", "first GAE", "cold", "warm", "no cache", "code (.nbc) files"),
    ),
    "bench_learner_sampling.py": (
        120,
        ("GAE + NormalizeAdvantages", "ratio to plain", "of a sample()'s CPU time"),
    ),
    "bench_connectors.py": (
        120,
        ("µs/call", "µs/row", "1024 one-row calls / one 1024-row call", " 64 ", " 1024 "),
    ),
    "bench_sampling.py": (
        300,
        (
            "hand-torch",
            "runner-torch",
            "runner-mlp",
            "mlp / hand-torch",
            "targets",
            "check_finite cost",
        ),
    ),
    "dev/bench_gc.py": (240, ("garbage collector", "gen 0 / 1 / 2", "cartpole-inprocess N=64")),
    "dev/bench_instructions.py": (
        420,
        ("instructions per env step", "rps_v2", "4 agents acting", "runner/hand"),
    ),
    "bench_minibatches.py": (
        120,
        ("minibatches (torch)", "hand (numpy)", "ratio hand (torch) / minibatches (torch)"),
    ),
    "bench_metrics.py": (
        120,
        ("ratio to no loggers", "episode folding (always on)", "metrics() + 3 loggers"),
    ),
    "bench_multi_agent.py": (240, ("rps N=1", "four N=8", "runner / hand")),
    "bench_overhead.py": (120, ("own cost per env step", "CPU us per row", "256 ")),
    "bench_parallel.py": (300, ("SyncVectorEnv", "in-process", "env workers", "EnvPool")),
    "bench_offline.py": (300, ("write rows/s", "read MB/s", "disk MB", "cartpole", "atari")),
    "bench_pixels.py": (
        240,
        ("rlconnect preset", "gymnasium loop", "compress_observations=True", "per 1M transitions"),
    ),
    "bench_remote_envs.py": (120, ("remote_envs", "slow env (1 ms/step)", "remote / in-process")),
    "bench_serving.py": (240, ("remote", "local", "p50", "p99")),
    "dev/bench_vs_commit.py": (
        300,
        ("working tree vs HEAD", "work / base per round", "cartpole-workers", "cartpole-inprocess"),
    ),
    "soak.py": (240, ("steps/s", "RSS MB", "growth", "requests/s", "timed out", "answering True")),
    "bench_tensor.py": (
        240,
        (
            "BatchedCartPole, 64x64 tanh MLP",
            "VMAS balance, 3 agents",
            "ratio to hand loop",
            "rlconnect / TorchRL Collector per round",
            "Targets (issue 53)",
        ),
    ),
}

#: scripts that need a local Ray runtime (started by the script): run under the ``ray`` marker
RAY_BENCHMARKS = {
    "bench_scaling.py": (
        300,
        (
            "Steps/s by number of remote runners",
            "vs K=0",
            "Ray overhead per batch",
            "round trip ms (K=1)",
            "sync_weights",
        ),
    ),
}

#: script -> why no test runs its quick mode (none now; a new script must be added above or here)
EXEMPT: dict[str, str] = {}


def _run_quick(script: str, timeout: int, words: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for word in words:
        assert word in proc.stdout, f"{script} printed no {word!r}"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_benchmark_quick_mode_prints_its_table(script: str) -> None:
    _run_quick(script, *BENCHMARKS[script])


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("script", sorted(RAY_BENCHMARKS))
def test_ray_benchmark_quick_mode_prints_its_table(script: str) -> None:
    pytest.importorskip("ray")
    _run_quick(script, *RAY_BENCHMARKS[script])


def _scripts(folder: Path) -> list[str]:
    """The runnable scripts of ``folder`` (helpers such as ``_common.py`` left out)."""
    return sorted(
        p.name for p in folder.glob("*.py") if p.name.startswith("bench_") or p.name == "soak.py"
    )


def test_every_script_is_run_or_exempted():
    """Each runnable script of ``benchmarks/`` and ``benchmarks/dev/`` has its quick mode run
    by a test above or is exempted with a reason: exactly one of the three, and no entry
    names a script that is gone."""
    scripts = _scripts(ROOT / "benchmarks") + [
        f"dev/{s}" for s in _scripts(ROOT / "benchmarks" / "dev")
    ]
    places = {"BENCHMARKS": BENCHMARKS, "RAY_BENCHMARKS": RAY_BENCHMARKS, "EXEMPT": EXEMPT}
    nowhere = [s for s in scripts if not any(s in d for d in places.values())]
    assert not nowhere, f"scripts no test runs and none exempts: {nowhere}"
    twice = [s for s in scripts if sum(s in d for d in places.values()) > 1]
    assert not twice, f"scripts in more than one of {sorted(places)}: {twice}"
    stale = sorted(set().union(*places.values()) - set(scripts))
    assert not stale, f"entries for scripts that do not exist: {stale}"
    assert all(reason.strip() for reason in EXEMPT.values()), "an exemption gives no reason"


def test_every_script_is_in_the_guide_in_its_place():
    """docs/performance.md names each user benchmark as ``benchmarks/<script>`` and each
    developer tool as ``benchmarks/dev/<script>``: one place for each, none left out."""
    guide = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    users, dev = _scripts(ROOT / "benchmarks"), _scripts(ROOT / "benchmarks" / "dev")
    assert users and dev
    missing = [f"benchmarks/{s}" for s in users if f"python benchmarks/{s}" not in guide]
    missing += [f"benchmarks/dev/{s}" for s in dev if f"python benchmarks/dev/{s}" not in guide]
    assert not missing, f"scripts docs/performance.md does not say how to run: {missing}"
    assert not set(users) & set(dev), "a script is both a user benchmark and a dev tool"


def _medians(line: str) -> list[str]:
    """The leading figure of each cell after the first of a Markdown table row."""
    return [cell.strip().split(" ")[0] for cell in line.strip().strip("|").split("|")[1:]]


def test_the_readme_quotes_the_guides_run_against_a_hand_loop():
    """One figure for one workload: the README's rlconnect rows are the medians of
    docs/performance.md's table of the runner against a hand-written loop."""
    guide = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = guide.split("### The runner against a hand-written loop", 1)[1].split("###")[0]
    rows = {
        line.split("|")[1].strip(): _medians(line)
        for line in section.splitlines()
        if line.startswith(("| 1 |", "| 8 |", "| 64 |"))
    }
    assert set(rows) == {"1", "8", "64"}, section
    torch, mlp = {}, {}
    for line in readme.splitlines():
        if line.startswith("| rlconnect `EnvRunner` + `TorchPolicy` |"):
            torch = dict(zip(("1", "8", "64"), _medians(line)))
        if line.startswith("| rlconnect `EnvRunner` + `MLPPolicy` |"):
            mlp = dict(zip(("1", "8", "64"), _medians(line)))
    assert torch and mlp, "the README has no rlconnect rows"
    for n, cells in rows.items():
        assert torch[n] == cells[0], f"TorchPolicy at N={n}: README {torch[n]}, guide {cells[0]}"
        assert mlp[n] == cells[-1], f"MLPPolicy at N={n}: README {mlp[n]}, guide {cells[-1]}"
