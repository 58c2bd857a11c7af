"""The parts of batch gathering that need no Ray: the delta inbox and batch tags."""

import numpy as np

import rlconnect as rc
from rlconnect.collectors import CountStepsBy
from rlconnect.distributed.gather import DeltaInbox, batch_rows, tag_batch


def test_deltas_come_out_in_runner_order_then_arrival_order_once():
    inbox = DeltaInbox(3)
    inbox.add(2, {"p": {"agent": {"a": 1}}})
    inbox.add(1, {"p": {"agent": {"a": 2}}})
    inbox.add(2, {"p": {"agent": {"a": 3}}})
    assert [d["p"]["agent"]["a"] for d in inbox.take()] == [2, 1, 3]
    assert inbox.take() == []
    inbox.add(3, {})
    inbox.clear()
    assert inbox.take() == []


def test_tags_reach_every_policy_batch_and_rows_follow_count_by():
    a = rc.SampleBatch({"x": np.arange(3)})
    b = rc.SampleBatch({"x": np.arange(2)})
    ma = rc.MultiAgentBatch({"p": a, "q": b}, env_steps=3)
    tag_batch(ma, runner_index=2)
    assert a.meta["runner_index"] == b.meta["runner_index"] == 2
    env_steps, agent_steps = CountStepsBy.ENV_STEPS, CountStepsBy.AGENT_STEPS
    assert batch_rows(ma, env_steps) == 3 and batch_rows(ma, agent_steps) == 5
    assert batch_rows(a, agent_steps) == 3


class _TwoRunners:
    """What sample_round asks of a pool: runners 1 and 2, each with the same two sub-envs
    (env ids 0 and 1) and two rows each, equal rows declared."""

    indices = (1, 2)
    promised_rows = 4

    def submit_sample(self, k: int) -> int:
        return k

    def next_result(self, inflight: dict, what: str, failures: list, resubmit: bool) -> tuple:
        k = inflight.pop(next(iter(inflight)))
        batch = rc.SampleBatch(
            {"env_id": np.array([0, 0, 1, 1]), "x": np.arange(4) + 10 * k},
            meta={"rows_per_env": 2},
        )
        return k, (batch, {})


def test_a_batch_of_several_runners_refuses_time_major_by_name():
    """Runner 1's sub-env 0 and runner 2's are both env_id 0: folding their rows as one
    sub-env's would be a silent reshape, so time_major() names the cause and the fix;
    each runner's own batch folds."""
    import pytest

    from rlconnect.distributed.gather import sample_round

    out, _ = sample_round(_TwoRunners(), DeltaInbox(2), CountStepsBy.ENV_STEPS, 2)
    assert out.meta["runner_rows"] == {1: 4, 2: 4}
    with pytest.raises(ValueError, match="joins the rows of 2 runners"):
        out.time_major()
    one = rc.SampleBatch({"env_id": np.array([0, 0, 1, 1])}, meta={"rows_per_env": 2})
    assert one.time_major()["env_id"].shape == (2, 2)
