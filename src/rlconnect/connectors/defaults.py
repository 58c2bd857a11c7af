"""The standard agent and action pipelines, built from a few ``ctx.config`` keys.

Agent pipeline, in order (each only when it applies):

1. ``FlattenObservations`` when the observation space is not a Box (Dict, Tuple,
   Discrete, MultiDiscrete, MultiBinary); Box observations (vectors, images) pass unchanged.
2. ``MeanStdFilter`` when ``observation_filter="MeanStdFilter"`` (default ``"NoFilter"``);
   ``observation_filter_sync="frozen"`` (default ``"immediate"``) builds it with
   ``freeze_between_syncs=True``.
3. ``ClipReward`` when ``clip_rewards`` is True (sign) or a positive number (default None;
   False also means off).
4. ``FrameStack(num_frames=framestack)`` when ``framestack`` is an int >= 1 (default None).
5. ``StateBuffer`` when the policy is recurrent (``ctx.initial_states`` is not empty).

With ``preset="atari"`` (the only preset) the agent chain is the DeepMind Atari one instead:
``Grayscale`` (only for RGB ``(H, W, 3)`` frames) -> ``Resize(84, 84)`` (only when the frames
are not 84x84 already) -> ``ClipReward`` (sign, or ``clip_rewards`` when set) ->
``FrameStack(framestack or 4)``, so the policy sees ``Box(0, 255, (4, 84, 84), uint8)``.
Frame skipping with max-pooling and no-op / FIRE resets are env-side
(``rlconnect.envs.atari``). ``observation_filter="MeanStdFilter"`` cannot be combined with it.

Action pipeline: ``ConvertToNumpy``; then ``UnsquashActions`` when
``normalize_actions=True`` (the default) and the action space is a Box; then
``ClipActions`` when ``clip_actions=True`` (default False) and it is a Box.

Other config keys are ignored (the config is shared with the runner). A bad value of one
of these keys raises ValueError naming the key and what is allowed.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rlconnect.connectors.action import ClipActions, ConvertToNumpy, UnsquashActions
from rlconnect.connectors.agent import (
    ClipReward,
    FlattenObservations,
    FrameStack,
    Grayscale,
    MeanStdFilter,
    Resize,
    StateBuffer,
)
from rlconnect.connectors.base import ActionConnector, AgentConnector, ConnectorContext
from rlconnect.connectors.pipeline import ActionConnectorPipeline, AgentConnectorPipeline
from rlconnect.spaces import describe_space

__all__ = [
    "ATARI_FRAMESTACK",
    "ATARI_SCREEN",
    "OBSERVATION_FILTERS",
    "OBSERVATION_FILTER_SYNCS",
    "PRESETS",
    "default_action_pipeline",
    "default_agent_pipeline",
]

OBSERVATION_FILTERS = ("NoFilter", "MeanStdFilter")
OBSERVATION_FILTER_SYNCS = ("immediate", "frozen")
PRESETS = ("atari",)
ATARI_SCREEN = (84, 84)
"""Height and width of the frames the Atari preset outputs."""
ATARI_FRAMESTACK = 4
"""Frames the Atari preset stacks unless ``framestack`` says otherwise."""


def _bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"config[{key!r}] must be True or False, got {value!r}")
    return value


def _observation_filter(config: Mapping[str, Any]) -> str:
    value = config.get("observation_filter", "NoFilter")
    if value not in OBSERVATION_FILTERS:
        raise ValueError(
            f"config['observation_filter'] must be one of {list(OBSERVATION_FILTERS)}, "
            f"got {value!r}"
        )
    return value


def _freeze_filter(config: Mapping[str, Any]) -> bool:
    """``observation_filter_sync``: "frozen" freezes the filter between sync points."""
    value = config.get("observation_filter_sync", "immediate")
    if value not in OBSERVATION_FILTER_SYNCS:
        raise ValueError(
            f"config['observation_filter_sync'] must be one of {list(OBSERVATION_FILTER_SYNCS)}, "
            f"got {value!r}"
        )
    return value == "frozen"


def _reward_limit(config: Mapping[str, Any]) -> tuple[bool, float | None]:
    """``(clip?, limit)`` from ``clip_rewards``: None/False off, True sign, x > 0 clip."""
    value = config.get("clip_rewards")
    if value is None or value is False:
        return False, None
    if value is True:
        return True, None
    if isinstance(value, numbers.Real) and float(value) > 0:
        return True, float(value)
    raise ValueError(
        "config['clip_rewards'] must be None (off), True (keep the sign) or a positive "
        f"number (clip to [-x, x]), got {value!r}"
    )


def _framestack(config: Mapping[str, Any]) -> int | None:
    value = config.get("framestack")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"config['framestack'] must be None or an int >= 1, got {value!r}")
    return int(value)


def _preset(config: Mapping[str, Any]) -> str | None:
    value = config.get("preset")
    if value is not None and value not in PRESETS:
        raise ValueError(f"config['preset'] must be None or one of {list(PRESETS)}, got {value!r}")
    return value


def _atari_members(ctx: ConnectorContext) -> list[AgentConnector]:
    """Grayscale -> Resize(84, 84) -> ClipReward -> FrameStack(4), skipping what is done."""
    space, config = ctx.observation_space, ctx.config
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (2, 3):
        raise ValueError(
            "preset='atari' needs image observations, a Box (H, W) or (H, W, 3), got "
            f"{describe_space(space)}"
        )
    if _observation_filter(config) != "NoFilter":
        raise ValueError(
            "preset='atari' keeps uint8 frames and cannot be combined with "
            "observation_filter='MeanStdFilter'"
        )
    members: list[AgentConnector] = []
    if len(space.shape) == 3:
        members.append(Grayscale(ctx))
    if tuple(space.shape[:2]) != ATARI_SCREEN:
        members.append(Resize(ctx, height=ATARI_SCREEN[0], width=ATARI_SCREEN[1]))
    clip, limit = _reward_limit(config)
    members.append(ClipReward(ctx, limit=limit if clip else None))
    members.append(FrameStack(ctx, num_frames=_framestack(config) or ATARI_FRAMESTACK))
    if ctx.initial_states:
        members.append(StateBuffer(ctx))
    return members


def default_agent_pipeline(ctx: ConnectorContext) -> AgentConnectorPipeline:
    """The standard agent pipeline for ``ctx`` (see the module docstring for the order)."""
    config = ctx.config
    if _preset(config) == "atari":
        return AgentConnectorPipeline(ctx, _atari_members(ctx))
    obs_filter = _observation_filter(config)
    freeze = _freeze_filter(config)
    clip_rewards, reward_limit = _reward_limit(config)
    framestack = _framestack(config)

    members: list[AgentConnector] = []
    if not isinstance(ctx.observation_space, gym.spaces.Box):
        members.append(FlattenObservations(ctx))
    if obs_filter == "MeanStdFilter":
        members.append(MeanStdFilter(ctx, freeze_between_syncs=freeze))
    if clip_rewards:
        members.append(ClipReward(ctx, limit=reward_limit))
    if framestack is not None:
        members.append(FrameStack(ctx, num_frames=framestack))
    if ctx.initial_states:
        members.append(StateBuffer(ctx))
    return AgentConnectorPipeline(ctx, members)


def default_action_pipeline(ctx: ConnectorContext) -> ActionConnectorPipeline:
    """The standard action pipeline for ``ctx`` (see the module docstring for the order)."""
    normalize = _bool(ctx.config, "normalize_actions", True)
    clip = _bool(ctx.config, "clip_actions", False)
    is_box = isinstance(ctx.action_space, gym.spaces.Box)
    members: list[ActionConnector] = [ConvertToNumpy(ctx)]
    if normalize and is_box:
        members.append(UnsquashActions(ctx))
    if clip and is_box:
        members.append(ClipActions(ctx))
    return ActionConnectorPipeline(ctx, members)
