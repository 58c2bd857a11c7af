"""``PolicyCollectorGroup.record``: the one write of a poll (rows, episode ends, env steps),
and ``AgentCollector``, the per-agent view of a policy's rows."""

from __future__ import annotations

import numpy as np

from rlconnect.collectors import AgentCollector, PolicyCollectorGroup
from rlconnect.collectors.group import RowChunk
from rlconnect.episodes import ClosingRow, EpisodeEnds


def _chunk(traj: list[int], eps: list[int], obs: list[float]) -> RowChunk:
    n = len(traj)
    columns = {
        "obs": np.asarray(obs, dtype=np.float32).reshape(n, 1),
        "rewards": np.ones(n),
        "terminateds": False,
        "truncateds": False,
        "infos": [{}] * n,
        "t": np.zeros(n, np.int64),
        "eps_id": np.asarray(eps, np.int64),
        "env_id": np.arange(n, dtype=np.int64),
        "agent_index": 0,
    }
    outputs = {"actions": np.arange(n)}
    return RowChunk("p", np.asarray(traj, np.int64), columns, False, outputs, None)


def test_one_record_writes_rows_ends_and_env_steps():
    group = PolicyCollectorGroup(["p"], num_envs=2)
    steps = (np.array([0, 1]), np.array([10, 11]), 1)
    group.record(0, [_chunk([0, 1], [10, 11], [0.0, 5.0])], None, steps)
    group.record(1, [_chunk([0, 1], [10, 11], [1.0, 6.0])], None, steps)
    assert len(group["p"]) == 4 and group.env_steps() == 4
    ends = EpisodeEnds()
    ends.closing.append(ClosingRow("p", 1, 2.5, True, False, 2))  # agent of traj 1 ended
    ends.dropped.append(11)  # ... and then its episode turned out faulty
    ends.finish([10], 2, None)
    assert ends
    group.record(2, [], ends, None)
    assert group.env_steps() == 2 and group.ready("complete_episodes", 2, "env_steps")
    assert len(group.agent("p", 1)) == 0  # the faulty episode's rows are gone
    batches, env_steps = group.build("complete_episodes", 2, "env_steps")
    batch, traj = batches["p"]
    assert env_steps == 2 and traj.tolist() == [0] and batch["obs"].ravel().tolist() == [0.0]


def test_an_agent_collector_closes_a_trajectory_with_its_last_row_repeated():
    group = PolicyCollectorGroup(["p"], num_envs=2)
    group.record(
        0, [_chunk([0, 1], [10, 11], [0.0, 5.0])], None, (np.arange(2), np.array([10, 11]), 1)
    )
    agent = group.agent("p", 1)
    assert isinstance(agent, AgentCollector) and len(agent) == 1
    assert agent.close(1, 2.5, False, True, 1)
    assert agent.rows().tolist() == [1, 2] and not group.agent("p", 7).close(1, 0, True, 0, 1)
    group.record(1, [], None, (np.array([1]), np.array([11]), 1))
    batches, _ = group.build("truncate_episodes", 3, "env_steps")
    batch, traj = batches["p"]
    assert traj.tolist() == [1]  # the closed trajectory's one transition
    assert batch["new_obs"].ravel().tolist() == [5.0]  # no observation made up
    assert batch["rewards"].tolist() == [2.5] and batch["truncateds"].tolist() == [True]
    assert batch["actions"].tolist() == [1]


def test_a_closing_row_takes_the_columns_its_pipeline_made():
    group = PolicyCollectorGroup(["p"], num_envs=1)
    chunk = _chunk([4], [10], [3.0])
    chunk.columns["prev_actions"] = np.array([7])
    chunk.columns["prev_rewards"] = np.array([0.25], np.float32)
    group.record(0, [chunk], None, (np.array([0]), np.array([10]), 1))
    ends = EpisodeEnds()
    made = {"rewards": [1.0], "prev_actions": [2], "prev_rewards": np.array([9.0])}
    ends.closing.append(ClosingRow("p", 4, 9.0, False, True, 1, made))
    group.record(1, [], ends, (np.array([0]), np.array([10]), 1))
    batch, _ = group.build("truncate_episodes", 2, "env_steps")[0]["p"]
    assert batch["rewards"].tolist() == [1.0] and batch["truncateds"].tolist() == [True]
    assert batch["new_prev_actions"].tolist() == [2] and batch["prev_actions"].tolist() == [7]
    assert batch["new_prev_rewards"].tolist() == [9.0]
    assert batch["new_prev_rewards"].dtype == np.float32  # the column's own dtype
    assert batch["new_obs"].ravel().tolist() == [3.0]
