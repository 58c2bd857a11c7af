"""The invariants every fault-injection run must keep, checked against the ledger.

- **Truth**: every row of every batch equals the ledger transition its ``infos["key"]``
  names (obs, action, reward, flags, next obs), in the sub-env and at the ``t`` it says;
  one runner episode id is one ledger episode and back.
- **No leak**: no row of an episode that had a failing fault is in a batch returned after
  the fault fired (in ``complete_episodes`` mode: in no batch at all); no transition a
  fault touched is in a batch when restarts are on.
- **Drops**: one ``episode_faulty`` record per failing fault, in its sub-env, and no other
  (collateral drops = 0); the sub-env was built once more per fault.
- **Conservation**: transitions produced = rows emitted + steps still buffered + steps
  dropped with faulty episodes + bad transitions rejected.
- **Equivalence**: sub-envs without faults produced exactly what a fault-free run with the
  same seeds produces.

``Figures`` tallies a test module's faults, drops and checked rows; ``publish`` writes
them to ``figures.json`` when ``RLCONNECT_WRITE_FIGURES=1``.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from faults import FAILING_KINDS, FaultSchedule, FaultyEnvCreator, KeyedPolicy, Ledger

import rlconnect as rc

FIGURES_PATH = Path(__file__).with_name("figures.json")


class Figures:
    """Tallies of one test module: faults injected and episodes dropped by kind, and
    counts (rows checked, corrupted rows, collateral drops, ...)."""

    def __init__(self) -> None:
        self.faults_injected: Counter[str] = Counter()
        self.episodes_dropped: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    def total_injected(self) -> int:
        return sum(self.faults_injected.values())

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "faults_injected": dict(sorted(self.faults_injected.items())),
            "episodes_dropped": dict(sorted(self.episodes_dropped.items())),
            "counts": dict(sorted(self.counts.items())),
        }

    def publish(self, module: str) -> None:
        """Merge these tallies into ``figures.json`` under ``module`` (only when
        ``RLCONNECT_WRITE_FIGURES=1``), with totals over every module in the file."""
        if os.environ.get("RLCONNECT_WRITE_FIGURES") != "1":
            return
        data = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
        modules = data.get("modules", {})
        modules[module] = self.as_dict()
        totals: dict[str, Counter] = {}
        for figs in modules.values():
            for section, values in figs.items():
                totals.setdefault(section, Counter()).update(values)
        out = {
            "total_faults_injected": sum(totals["faults_injected"].values()),
            "totals": {k: dict(sorted(v.items())) for k, v in totals.items()},
            "modules": dict(sorted(modules.items())),
        }
        FIGURES_PATH.write_text(json.dumps(out, indent=2) + "\n")


def make_runner(
    schedule: FaultSchedule,
    ledger: Ledger,
    *,
    num_envs: int = 4,
    frag: int = 20,
    seed: int = 0,
    hang_s: float = 30.0,
    callbacks: rc.Callbacks | None = None,
    **cfg: Any,
) -> rc.EnvRunner:
    """A runner on ``num_envs`` faulty TraceEnvs with a KeyedPolicy."""
    creator = FaultyEnvCreator(schedule, ledger, hang_s=hang_s)
    space = creator.base.observation_space
    policy = KeyedPolicy(space, creator.base.action_space)
    config = rc.RunnerConfig(num_envs=num_envs, rollout_fragment_length=frag, seed=seed, **cfg)
    return rc.EnvRunner(creator, policy, config=config, callbacks=callbacks)


class Run:
    """Batches of one runner with the time each was returned, and its metric records."""

    def __init__(self, runner: rc.EnvRunner, ledger: Ledger) -> None:
        self.runner, self.ledger = runner, ledger
        self.batches: list[tuple[rc.SampleBatch, int]] = []
        self.metrics: list[dict] = []

    def sample(self, n: int) -> Run:
        for _ in range(n):
            batch = self.runner.sample()
            self.batches.append((batch, time.monotonic_ns()))
            self.metrics.extend(self.runner.get_metrics())
        return self

    @property
    def restart(self) -> bool:
        return self.runner.config.restart_failed_sub_environments


def _parts(batch: Any) -> list[rc.SampleBatch]:
    """The SampleBatches of a batch (one per policy of a MultiAgentBatch)."""
    if isinstance(batch, rc.MultiAgentBatch):
        return list(batch.policy_batches.values())
    return [batch]


def _same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def check_truth(run: Run, figures: Figures) -> dict[int, tuple[int, int]]:
    """Truth and no-leak for every row; returns ``{eps_id: (env, episode)}``."""
    ledger = run.ledger.refresh()
    complete = run.runner.config.batch_mode.value == "complete_episodes"
    identity: dict[int, tuple[int, int]] = {}
    bad = 0
    for batch, returned in ((p, ns) for b, ns in run.batches for p in _parts(b)):
        infos = batch["infos"]
        for r in range(len(batch)):
            key = infos[r].get("key")
            step = ledger.steps.get(key) if key is not None else None
            eps = int(batch["eps_id"][r])
            ok = (
                step is not None
                and int(batch["env_id"][r]) == key[0]
                and int(batch["t"][r]) == key[2]
                and identity.setdefault(eps, key[:2]) == key[:2]
                and _same(batch["obs"][r], step.obs)
                and int(batch["actions"][r]) == step.action
                and _same(batch["rewards"][r], step.reward)
                and bool(batch["terminateds"][r]) == step.terminated
                and bool(batch["truncateds"][r]) == step.truncated
                and _same(batch["new_obs"][r], step.next_obs)
            )
            if ok:
                fault = ledger.fault_of(key[0], key[1])
                leaked = run.restart and fault is not None and (complete or fault[1] < returned)
                ok = not leaked and (step.clean or not run.restart)
            bad += not ok
        figures.counts["rows_checked"] += len(batch)
    figures.counts["corrupted_or_leaked_rows"] += bad
    assert bad == 0, f"{bad} rows are not true to the simulator or leaked from faulty episodes"
    assert len(set(identity.values())) == len(identity), "two runner episodes share one"
    return identity


def check_drops(run: Run, figures: Figures, also_failing: tuple[str, ...] = ()) -> None:
    """One faulty record per failing fault, in its sub-env, none else; one rebuild each
    (``also_failing``: kinds that are failures in this run, e.g. inside ``check_env``)."""
    ledger = run.ledger.refresh()
    failing = [f for f, _ in ledger.faults if f.kind in FAILING_KINDS + also_failing]
    records = Counter(m["env_id"] for m in run.metrics if m["episode_faulty"])
    per_env = Counter(f.env for f in failing)
    collateral = sum(max(records[e] - per_env[e], 0) for e in records)
    figures.counts["collateral_drops"] += collateral
    for f in failing:
        figures.episodes_dropped[f.kind] += 1
    assert collateral == 0, f"episodes dropped beyond the faulty ones: {records} vs {per_env}"
    assert records == per_env, f"faulty records {records} != failing faults {per_env}"
    for env in range(run.runner.num_envs):
        expected = 1 + per_env[env]
        assert ledger.builds[env] == expected, (env, ledger.builds, per_env)


def check_conservation(run: Run, identity: dict[int, tuple[int, int]]) -> None:
    """produced == emitted + buffered + dropped + rejected."""
    ledger = run.ledger.refresh()
    produced = len(ledger.steps)
    parts = [p for b, _ in run.batches for p in _parts(b)]
    emitted = sum(len(p) for p in parts)
    buffered = run.runner.collectors.env_steps()
    emitted_by_eps = Counter(int(e) for p in parts for e in p["eps_id"])
    dropped = sum(
        m["episode_length"] - emitted_by_eps[m["episode_id"]]
        for m in run.metrics
        if m["episode_faulty"]
    )
    rejected = sum(not s.clean for s in ledger.steps.values()) if run.restart else 0
    assert produced == emitted + buffered + dropped + rejected, (
        f"produced {produced} != emitted {emitted} + buffered {buffered} + dropped {dropped}"
        f" + rejected {rejected}"
    )


def check_equivalence(run: Run, reference: Ledger, figures: Figures) -> None:
    """Every transition of a fault-free sub-env (and of faulted sub-envs before their
    first fault) equals the reference run's."""
    ledger = run.ledger.refresh()
    first_fault: dict[int, int] = {}
    for f, _ in ledger.faults:
        first_fault[f.env] = min(first_fault.get(f.env, f.episode), f.episode)
    episodes: dict[tuple[int, int], bool] = {}
    for key, step in ledger.steps.items():
        env, episode, _ = key
        if episode >= first_fault.get(env, np.inf):
            continue
        ref = reference.steps.get(key)
        same = ref is not None and all(_same(a, b) for a, b in zip(step, ref))
        episodes[(env, episode)] = episodes.get((env, episode), True) and same
    figures.counts["unaffected_episodes_compared"] += len(episodes)
    figures.counts["unaffected_episodes_identical"] += sum(episodes.values())
    differ = [k for k, v in episodes.items() if not v]
    assert not differ, f"episodes differ from the fault-free run: {differ[:5]}"


def reference_ledger(run: Run, schedule: FaultSchedule, **cfg: Any) -> Ledger:
    """A fault-free run with the same seeds, long enough to cover ``run``'s steps."""
    ledger = Ledger()
    clean = FaultSchedule(schedule.seed, (), envs=schedule.envs)
    runner = make_runner(clean, ledger, **cfg)
    need = Counter(k[0] for k in run.ledger.refresh().steps)
    while any(sum(k[0] == e for k in ledger.steps) < n for e, n in need.items()):
        runner.sample()
    runner.stop()
    return ledger
