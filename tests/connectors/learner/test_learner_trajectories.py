"""Trajectories found from eps_id / agent_index, never from row positions."""

from __future__ import annotations

import numpy as np
import pytest
from learner_fakes import batch_of

import rlconnect as rc
from rlconnect.connectors.learner import find_trajectories


def test_rows_left_last_rows_and_how_each_trajectory_ends() -> None:
    batch = batch_of([3, 1, 2, 2], ["term", "trunc", "both", "cut"])
    tr = find_trajectories(batch, "GAE")
    assert tr.rem().tolist() == [2, 1, 0, 0, 1, 0, 1, 0]
    assert tr.last_rows.tolist() == [2, 3, 5, 7]
    assert tr.terminated.tolist() == [True, False, True, False]  # termination wins
    assert tr.bootstrap_rows.tolist() == [3, 7]
    assert tr.longest == 3
    assert np.flatnonzero(tr.terminating_rows()).tolist() == [2, 5]


def test_agents_of_one_episode_are_separate_trajectories() -> None:
    batch = batch_of([2, 3], ["cut", "term"], eps=[7, 7], agents=[0, 1])
    tr = find_trajectories(batch, "GAE")
    assert tr.last_rows.tolist() == [1, 4]


def test_a_key_in_two_separate_runs_is_refused() -> None:
    batch = batch_of([2, 2, 2], ["cut", "cut", "cut"], eps=[1, 2, 1])
    with pytest.raises(ValueError, match=r"GAE: .*eps_id 1.*not contiguous.*rows 0-1 and rows 4-5"):
        find_trajectories(batch, "GAE")
    batch = batch_of([2, 2, 2], ["cut"] * 3, eps=[1, 1, 1], agents=[0, 1, 0])
    with pytest.raises(ValueError, match=r"eps_id 1, agent_index 0.*not contiguous"):
        find_trajectories(batch, "GAE")


def test_rows_out_of_t_order_are_refused() -> None:
    batch = batch_of([3], ["cut"])
    batch["t"] = np.array([0, 2, 1])
    with pytest.raises(ValueError, match=r"rows 1 and 2 .*not in t order"):
        find_trajectories(batch, "GAE")


@pytest.mark.parametrize("flag", ["terminateds", "truncateds"])
def test_a_trajectory_going_on_after_its_end_is_refused(flag: str) -> None:
    batch = batch_of([2, 4], ["term", "cut"])
    ends = batch[flag].copy()
    ends[3] = True
    batch[flag] = ends
    with pytest.raises(ValueError, match=r"row 3 ends its episode.*goes on at row 4"):
        find_trajectories(batch, "GAE")


def test_t_falls_only_where_a_trajectory_starts() -> None:
    batch = batch_of([3, 2], ["cut", "cut"])
    batch["t"] = np.array([5, 6, 7, 0, 1])  # the second trajectory starts lower: fine
    assert find_trajectories(batch, "GAE").last_rows.tolist() == [2, 4]
    batch["t"] = np.array([5, 6, 7, 0, 0])
    with pytest.raises(ValueError, match=r"rows 3 and 4 .*not in t order"):
        find_trajectories(batch, "GAE")


def test_concatenated_fragments_of_one_episode_are_one_trajectory() -> None:
    a = batch_of([3], ["cut"], eps=[5])
    b = batch_of([2], ["term"], eps=[5])
    b["t"] = b["t"] + 3
    tr = find_trajectories(rc.concat_samples([a, b]), "GAE")
    assert tr.last_rows.tolist() == [4] and tr.terminated.tolist() == [True]


@pytest.mark.parametrize("column", ["eps_id", "terminateds"])
def test_missing_columns_are_named(column: str) -> None:
    batch = batch_of([2], ["cut"])
    del batch[column]
    with pytest.raises(ValueError, match=rf"GAE needs an? '{column}' column"):
        find_trajectories(batch, "GAE")


def test_an_empty_batch_has_no_trajectories() -> None:
    batch = batch_of([2], ["cut"])[0:0]
    tr = find_trajectories(batch, "GAE")
    assert len(tr.rem()) == 0 and len(tr.last_rows) == 0 and tr.longest == 0


@pytest.mark.parametrize("dtype", [str, object])
def test_string_and_object_keys_are_found_as_numbers_are(dtype: type) -> None:
    batch = batch_of([2, 3, 1], ["cut", "term", "cut"])
    batch["eps_id"] = np.array(["ep-a", "ep-a", "ep-b", "ep-b", "ep-b", "ep-b"], dtype=dtype)
    batch["agent_index"] = np.array(["x", "x", "x", "x", "x", "y"], dtype=dtype)
    tr = find_trajectories(batch, "GAE")
    assert tr.last_rows.tolist() == [1, 4, 5] and tr.terminated.tolist() == [False, True, False]
    batch["agent_index"] = np.array(["x", "x", "x", "y", "x", "y"], dtype=dtype)
    with pytest.raises(ValueError, match=r"eps_id 'ep-b', agent_index 'x'.*not contiguous"):
        find_trajectories(batch, "GAE")


def test_without_t_and_truncateds_columns_the_keys_and_terminations_decide() -> None:
    batch = batch_of([2, 3], ["term", "cut"])
    del batch["t"], batch["truncateds"]
    tr = find_trajectories(batch, "GAE")
    assert tr.last_rows.tolist() == [1, 4] and tr.terminated.tolist() == [True, False]
    ends = batch["terminateds"].copy()
    ends[2] = True
    batch["terminateds"] = ends
    with pytest.raises(ValueError, match=r"row 2 ends its episode.*goes on at row 3"):
        find_trajectories(batch, "GAE")
