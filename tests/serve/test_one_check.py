"""A served request is checked once, by the episode hub, exactly as an ExternalEnv's own
call: the same bad value gets the same error (class and message) on both routes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.serve import PolicyServer, ServingEnv, ServingMultiAgentEnv

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)
GOOD = np.zeros(3, np.float32)
EID = "e"

#: (endpoint, request body, the same call on an ExternalEnv) of a single-agent episode
SINGLE: dict[str, tuple[str, dict, Callable[[Any], Any]]] = {
    "observation of another shape": (
        "log_action",
        {"episode_id": EID, "obs": np.zeros(5, np.float32), "action": 0},
        lambda env: env.log_action(EID, np.zeros(5, np.float32), 0),
    ),
    "NaN observation": (
        "end_episode",
        {"episode_id": EID, "obs": np.full(3, np.nan, np.float32)},
        lambda env: env.end_episode(EID, np.full(3, np.nan, np.float32)),
    ),
    "logged action outside the space": (
        "log_action",
        {"episode_id": EID, "obs": GOOD, "action": 5},
        lambda env: env.log_action(EID, GOOD, 5),
    ),
    "string reward": (
        "log_returns",
        {"episode_id": EID, "reward": "lots"},
        lambda env: env.log_returns(EID, "lots"),
    ),
    "bool reward": (
        "log_returns",
        {"episode_id": EID, "reward": True},
        lambda env: env.log_returns(EID, True),
    ),
    "infinite reward": (
        "log_returns",
        {"episode_id": EID, "reward": float("inf")},
        lambda env: env.log_returns(EID, float("inf")),
    ),
    "episode id too long": (
        "start_episode",
        {"episode_id": "x" * 257},
        lambda env: env.start_episode("x" * 257),
    ),
}

#: the same for a multi-agent episode (agents "a" and "b")
MULTI: dict[str, tuple[str, dict, Callable[[Any], Any]]] = {
    "observations not a dict": (
        "log_action",
        {"episode_id": EID, "obs": [GOOD], "action": {"a": 0}},
        lambda env: env.log_action(EID, [GOOD], {"a": 0}),
    ),
    "actions for other agents": (
        "log_action",
        {"episode_id": EID, "obs": {"a": GOOD}, "action": {"b": 0}},
        lambda env: env.log_action(EID, {"a": GOOD}, {"b": 0}),
    ),
    "an agent's info not a dict": (
        "log_returns",
        {"episode_id": EID, "reward": {"a": 1.0}, "info": {"a": 5}},
        lambda env: env.log_returns(EID, {"a": 1.0}, {"a": 5}),
    ),
    "empty rewards": (
        "log_returns",
        {"episode_id": EID, "reward": {}},
        lambda env: env.log_returns(EID, {}),
    ),
    "an agent without spaces": (
        "end_episode",
        {"episode_id": EID, "obs": {"z": GOOD}},
        lambda env: env.end_episode(EID, {"z": GOOD}),
    ),
}


def _server(env: Any) -> PolicyServer:
    runner = rc.EnvRunner(env, rc.RandomPolicy(OBS, ACT, seed=0))
    server = PolicyServer(runner, "127.0.0.1", 0)
    server.handle("start_episode", {"episode_id": EID})
    return server


@pytest.fixture(scope="module")
def single() -> Iterator[PolicyServer]:
    server = _server(ServingEnv(ACT, OBS, 4))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def multi() -> Iterator[PolicyServer]:
    spaces = {"a": OBS, "b": OBS}
    server = _server(ServingMultiAgentEnv({"a": ACT, "b": ACT}, spaces, 4))
    yield server
    server.stop()


def _both_refuse(server: PolicyServer, local: Any, case: tuple) -> tuple[Exception, Exception]:
    endpoint, body, call = case
    with pytest.raises(rc.envs.EpisodeError) as served:
        server.handle(endpoint, body)
    with pytest.raises(rc.envs.EpisodeError) as own:
        call(local)
    return served.value, own.value


@pytest.mark.parametrize("case", list(SINGLE))
def test_a_served_request_meets_the_check_an_external_envs_call_meets(single, case):
    local = rc.ExternalEnv(ACT, OBS)
    local.start_episode(EID)
    served, own = _both_refuse(single, local, SINGLE[case])
    assert (type(served), str(served)) == (type(own), str(own))
    assert single.env.hub.queued == 0  # nothing of a refused request was kept


@pytest.mark.parametrize("case", list(MULTI))
def test_a_served_multi_agent_request_meets_the_same_check_too(multi, case):
    local = rc.ExternalMultiAgentEnv({"a": ACT, "b": ACT}, {"a": OBS, "b": OBS})
    local.start_episode(EID)
    served, own = _both_refuse(multi, local, MULTI[case])
    assert (type(served), str(served)) == (type(own), str(own))
    assert multi.env.hub.queued == 0
