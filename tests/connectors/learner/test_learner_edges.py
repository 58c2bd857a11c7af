"""Learner connectors on the edges an outside check found (issue 55): slices of a larger
batch, narrow and integer dtypes, empty batches, huge finite rewards."""

from __future__ import annotations

import numpy as np
import pytest
from learner_fakes import ValuePolicy, batch_of, ctx

import rlconnect as rc


def test_normalizing_a_minibatch_slice_leaves_the_parent_batch_as_it_was():
    """Before: ``adv -= mean`` wrote through the slice's view into the parent batch, so a
    PPO loop normalising minibatches corrupted the advantages of later epochs."""
    parent = rc.SampleBatch({"advantages": np.arange(8, dtype=np.float32)})
    before = parent["advantages"].copy()
    part = parent[2:6]
    out = rc.NormalizeAdvantages(ctx())(part, ValuePolicy())
    np.testing.assert_array_equal(parent["advantages"], before)
    a = before[2:6].astype(np.float64)
    np.testing.assert_allclose(out["advantages"], (a - a.mean()) / a.std(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.int64, np.int32, np.float64])
def test_normalize_takes_any_real_dtype_and_gives_float32(dtype):
    """Before: float16 advantages above ~256 overflowed (``adv * adv``) to all zeros, and
    int64 ones raised numpy's casting error."""
    values = np.array([300.0, 900.0, -600.0, 1200.0, 0.0])
    out = rc.NormalizeAdvantages(ctx())(
        rc.SampleBatch({"advantages": values.astype(dtype)}), ValuePolicy()
    )["advantages"]
    a = values.astype(dtype).astype(np.float64)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (a - a.mean()) / a.std(), rtol=1e-6)
    assert abs(float(out.std()) - 1.0) < 1e-5


def _cartpole_batch() -> tuple[rc.SampleBatch, rc.Policy]:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    policy = rc.MLPPolicy(env.observation_space, env.action_space, vf_head=True, seed=0)
    config = rc.RunnerConfig(rollout_fragment_length=6, seed=0)
    batch = rc.EnvRunner("CartPole-v1", policy, config=config).sample()
    assert isinstance(batch, rc.SampleBatch)
    return batch, policy


def test_vtrace_on_an_empty_batch_gives_empty_columns():
    """Before: torch's ``cannot reshape tensor of 0 elements`` from the MLP."""
    batch, policy = _cartpole_batch()
    ctx_ = rc.ConnectorContext.from_policy(policy)
    no_logp = batch[0:0].copy()
    del no_logp["action_logp"]
    out = rc.VTrace(ctx_)(batch[0:0].copy(), policy)
    for name in ("vtrace_targets", "pg_advantages"):
        assert out[name].shape == (0,) and out[name].dtype == np.float32
    full = rc.VTrace(ctx_)(batch, policy)  # and the same connector on rows still works
    assert full["vtrace_targets"].shape == (6,)
    with pytest.raises(ValueError, match="action_logp"):  # what it needs is still checked
        rc.VTrace(ctx_)(no_logp, policy)


def test_n_step_sums_beyond_float32_are_a_named_error_not_a_silent_inf():
    """Before: finite rewards of 2e38 gave ``n_step_rewards`` of inf (two of them sum to
    3.98e38, beyond float32's 3.4e38), with only numpy's overflow warning."""
    batch = batch_of([3], ["cut"], seed=0)
    batch["rewards"] = np.full(3, 2e38, np.float32)
    with pytest.raises(ValueError) as info:
        rc.NStepReturns(ctx(), n=3, gamma=0.99)(batch, ValuePolicy())
    msg = str(info.value)
    assert msg.startswith("NStepReturns: the n-step reward sum (column 'n_step_rewards') at row 0")
    assert "beyond float32's range" in msg and "clip_rewards" in msg
    assert "n_step_rewards" not in batch  # the batch is unchanged
    batch["rewards"] = np.full(3, 1e38, np.float32)  # large, but the sums fit: exact
    out = rc.NStepReturns(ctx(), n=3, gamma=0.5)(batch, ValuePolicy())["n_step_rewards"]
    np.testing.assert_allclose(out, [1.75e38, 1.5e38, 1e38], rtol=1e-6)


def test_the_compiled_passes_are_cached_on_disk(tmp_path):
    """A fresh process with ``NUMBA_CACHE_DIR`` writes the machine code there, and a second
    one loads it instead of compiling (before: every process compiled, 1-2 s)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from machine_speed import scaled

    here = Path(__file__).parent
    src = Path(rc.__file__).parents[1]
    code = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
        "import rlconnect as rc\n"
        "from learner_fakes import ValuePolicy, batch_of, ctx\n"
        "rc.GAE(ctx())(batch_of([4, 2], ['cut', 'term'], seed=0), ValuePolicy())\n"
        "from rlconnect.connectors.learner import _kernels\n"
        "print(sum(d.stats.cache_hits.total() for d in [_kernels.gae, _kernels.trajectory_ends]))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, str(src), str(here)],
            capture_output=True,
            text=True,
            env=env,
            timeout=scaled(120),
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    assert list(tmp_path.rglob("*.nbi")), "nothing was cached"
    assert int(runs[0][-1]) == 0 and int(runs[1][-1]) >= 2  # compiled, then loaded


def test_without_a_writable_cache_folder_the_passes_still_compile(monkeypatch):
    """numba refuses ``cache=True`` at decoration where no folder is writable (a read-only
    install): the kernel is then compiled per process, without failing."""
    import numba

    from rlconnect.connectors.learner import _kernels

    real = numba.njit

    def no_locator(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file")
        return real(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", no_locator)

    def add_one(x):
        return x + 1

    assert _kernels._compiled(add_one)(2) == 3
