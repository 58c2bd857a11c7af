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
