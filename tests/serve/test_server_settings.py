"""A PolicyServer's limits: one ``ServerSettings``, given whole or field by field, and
each layer (the episode hub, HTTP, the per-connection share) gets its part of it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlconnect as rc
from rlconnect.serve import PolicyServer, ServerSettings, ServingEnv

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


def test_keywords_and_settings_make_the_same_server():
    by_keyword = PolicyServer(
        rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, max_concurrent=8, batch_wait_s=0.01
    )
    settings = ServerSettings(max_concurrent=8, batch_wait_s=0.01, max_body_bytes=4096)
    whole = PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, settings=settings)
    mixed = PolicyServer(
        rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, settings=settings, batch_wait_s=0.5
    )
    try:
        assert by_keyword.settings == ServerSettings(max_concurrent=8, batch_wait_s=0.01)
        assert whole.settings == settings
        assert mixed.settings.batch_wait_s == 0.5  # a keyword wins over settings
        assert mixed.settings.max_body_bytes == 4096
        for server in (by_keyword, whole):
            limits = server.env.hub.limits
            assert (limits.batch_wait_s, limits.max_batch) == (0.01, 8)  # all lanes
            assert limits.max_queued_steps == 4096  # 16 per lane, at least 4096
            assert limits.get_action_timeout_s == limits.episode_timeout_s == 60.0
            assert server.env.max_concurrent == 8
        assert whole.health()["max_body_bytes"] == 4096
        assert by_keyword.health()["max_body_bytes"] == ServerSettings().max_body_bytes
    finally:
        for server in (by_keyword, whole, mixed):
            server.stop()


def test_a_served_runner_keeps_its_lanes_and_gets_the_servers_limits():
    env = ServingEnv(ACT, OBS, 12, get_action_timeout_s=5.0)
    runner = rc.EnvRunner(lambda ctx: env, rc.RandomPolicy(OBS, ACT, seed=0))
    assert env.hub.limits.get_action_timeout_s == 5.0
    server = PolicyServer(runner, "127.0.0.1", 0, max_concurrent=3, max_queued_steps=7)
    try:
        assert server.env is env and env.hub.max_concurrent == 12
        limits = env.hub.limits
        assert (limits.max_queued_steps, limits.max_batch) == (7, 12)
        assert limits.get_action_timeout_s == 60.0  # the server's, not the env's own
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"batch_wait_s": -1.0}, "batch_wait_s must be >= 0"),
        ({"max_queued_steps": -3}, "max_queued_steps must be an int >= 0"),
        ({"get_action_timeout_s": 0}, "get_action_timeout_s must be a number > 0"),
        ({"request_timeout_s": 0}, "request_timeout_s must be > 0 or None"),
        ({"max_episodes_per_client": 0}, "max_episodes_per_client must be a positive"),
        ({"backlog": 1.5}, "backlog must be a positive int"),
    ],
)
def test_a_bad_limit_is_refused_before_anything_is_built(bad, match):
    with pytest.raises(ValueError, match=match):
        ServerSettings(**bad)
    with pytest.raises(ValueError, match=match):
        PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, **bad)


def test_an_unknown_keyword_names_the_settings():
    with pytest.raises(TypeError, match=r"unknown keyword arguments \['max_concurent'\].*"):
        PolicyServer(rc.RandomPolicy(OBS, ACT, seed=0), "127.0.0.1", 0, max_concurent=4)
