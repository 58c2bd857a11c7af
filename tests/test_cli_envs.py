"""Env creators that ``rlconnect sample --env test_cli_envs:...`` loads (tests/ is on sys.path)."""

from __future__ import annotations

import gymnasium as gym


def make_env(ctx=None):
    """A plain CartPole, built by a creator function."""
    return gym.make("CartPole-v1")


class _Broken(gym.Wrapper):
    def step(self, action):
        raise RuntimeError("simulated failure in the env")


def broken_env(ctx=None):
    """CartPole whose step always raises."""
    return _Broken(gym.make("CartPole-v1"))
