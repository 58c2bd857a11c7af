"""NextStepRows: exactly T rows per slot from a NEXT_STEP env's transitions, the rest carried.

What is attacked: over consecutive samples with random reset steps and extra rounds, each
slot (two agents per sub-env) hands out exactly T rows, which are its transitions in time
order with none lost or repeated (nested columns too); carried rows keep their
``weights_seq``; a faulty sub-env hands out every row before its bad round and carries
none; ``extra_rounds`` covers the worst deficit, alternating resets included.
"""

from __future__ import annotations

import numpy as np
import torch

from rlconnect.collectors.tensor_carry import NextStepRows
from rlconnect.collectors.tensor_store import TensorStore

N, AGENTS, T = 5, 2, 6
CPU = torch.device("cpu")


def _constant(weights: int) -> dict:
    return {
        "env_id": torch.arange(N).repeat(AGENTS),
        "agent_index": torch.arange(AGENTS).repeat_interleave(N),
        "weights_seq": weights,
    }


def _sample(
    rows: NextStepRows, store: TensorStore, valid: np.ndarray, clock: int, bad: dict, weights: int
) -> tuple:
    """Write ``len(valid)`` rounds (value: the global round * 100 + slot) and build."""
    store.reserve(len(valid))
    for k in range(len(valid)):
        value = (clock + k) * 100.0 + torch.arange(store.rows, dtype=torch.float32)
        store.write(k, {"x": value, "nest": {"y": -value[:, None].repeat(1, 2)}})
    batch = rows.build("p", store, valid, bad, _constant(weights))
    steps = rows.finish(valid, np.zeros(N, dtype=bool), bad, T)
    return batch, steps


def test_slots_hand_out_their_transitions_in_order_t_at_a_time() -> None:
    rng = np.random.default_rng(0)
    rows, store = NextStepRows(N, CPU), TensorStore(T, AGENTS * N, CPU)
    expected: list[list[tuple[float, int]]] = [[] for _ in range(AGENTS * N)]
    handed: list[list[tuple[float, int]]] = [[] for _ in range(AGENTS * N)]
    clock = 0
    for sample in range(6):
        valid = rng.random((T + 4, N)) > 0.3
        valid[T:] = True  # (the extra rounds cover every deficit here)
        batch, steps = _sample(rows, store, valid, clock, {}, weights=sample)
        assert steps == N * T and batch.meta["rows_per_env"] == T
        assert batch.time_major()["x"].shape == (T, AGENTS * N)
        for s in range(AGENTS * N):
            recorded = np.flatnonzero(valid[:, s % N])
            expected[s] += [((clock + k) * 100.0 + s, sample) for k in recorded]
            mine = slice(s * T, (s + 1) * T)
            assert torch.equal(batch["nest"]["y"][mine, 0], -batch["x"][mine])
            handed[s] += zip(batch["x"][mine].tolist(), batch["weights_seq"][mine].tolist())
            assert bool((batch["env_id"][mine] == s % N).all())
        clock += len(valid)
    for s in range(AGENTS * N):
        assert handed[s] == expected[s][: len(handed[s])], s
    assert (rows.carried == [len(e) - len(h) for e, h in zip(expected[:N], handed[:N])]).all()


def test_a_faulty_sub_env_hands_out_all_it_had_and_carries_nothing() -> None:
    rows, store = NextStepRows(N, CPU), TensorStore(T, AGENTS * N, CPU)
    valid = np.ones((T + 3, N), dtype=bool)
    _sample(rows, store, valid, 0, {}, weights=0)  # every sub-env carries 3 rows
    assert (rows.carried == 3).all()
    valid = rows.valid(np.zeros((T, N), dtype=bool), {2: 1})  # sub-env 2 bad at round 1
    batch, steps = _sample(rows, store, valid, 100, {2: 1}, weights=1)
    counts = torch.bincount(batch["env_id"], minlength=N) // AGENTS
    assert counts.tolist() == [T, T, 4, T, T]  # 3 carried + 1 before its bad round
    assert steps == 4 * T + 4 and "rows_per_env" not in batch.meta
    assert rows.carried.tolist() == [3, 3, 0, 3, 3] and not rows.first_resets.any()
    two = batch["x"][batch["env_id"] == 2].tolist()
    assert two == [2.0 + 100 * k for k in (6, 7, 8)] + [10002.0] + [
        7.0 + 100 * k for k in (6, 7, 8)
    ] + [10007.0]


def test_extra_rounds_cover_the_worst_deficit() -> None:
    rows = NextStepRows(3, CPU)
    valid = np.ones((T, 3), dtype=bool)
    valid[::2, 0] = False  # sub-env 0: a reset every other round, 3 short
    valid[1, 1] = False  # sub-env 1: 1 short, its next round a reset
    ended_last = np.array([False, True, False])
    assert rows.extra_rounds(valid, ended_last, {}, T) == 2 * 3 - 1
    assert rows.extra_rounds(valid, ended_last, {0: 0}, T) == 2 * 1 - 1 + 1
    assert rows.extra_rounds(np.ones((T, 3), dtype=bool), ended_last, {}, T) == 0
