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

Action pipeline: ``ConvertToNumpy`` (left out when ``ctx.device`` is set: on the tensor
path the env takes tensors); then ``UnsquashActions`` when
``normalize_actions=True`` (the default) and the action space is a Box; then
``ClipActions`` when ``clip_actions=True`` (default False) and it is a Box.

The keys, their defaults and what each allows are declared once, in
``rlconnect.connectors.settings.ConnectorSettings``; other config keys are ignored (the
config is shared with the runner). A bad value of one of these keys raises ValueError
naming the key, the value and what is allowed.
"""

from __future__ import annotations

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
from rlconnect.connectors.settings import (
    OBSERVATION_FILTER_SYNCS,
    OBSERVATION_FILTERS,
    PRESETS,
    ConnectorSettings,
)
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

ATARI_SCREEN = (84, 84)
"""Height and width of the frames the Atari preset outputs."""
ATARI_FRAMESTACK = 4
"""Frames the Atari preset stacks unless ``framestack`` says otherwise."""


def _atari_members(ctx: ConnectorContext, settings: ConnectorSettings) -> list[AgentConnector]:
    """Grayscale -> Resize(84, 84) -> ClipReward -> FrameStack(4), skipping what is done."""
    space = ctx.observation_space
    if not isinstance(space, gym.spaces.Box) or len(space.shape) not in (2, 3):
        raise ValueError(
            "preset='atari' needs image observations, a Box (H, W) or (H, W, 3), got "
            f"{describe_space(space)}"
        )
    if settings.observation_filter != "NoFilter":
        raise ValueError(
            "preset='atari' keeps uint8 frames and cannot be combined with "
            "observation_filter='MeanStdFilter'"
        )
    members: list[AgentConnector] = []
    if len(space.shape) == 3:
        members.append(Grayscale(ctx))
    if tuple(space.shape[:2]) != ATARI_SCREEN:
        members.append(Resize(ctx, height=ATARI_SCREEN[0], width=ATARI_SCREEN[1]))
    clip, limit = settings.reward_limit
    members.append(ClipReward(ctx, limit=limit if clip else None))
    members.append(FrameStack(ctx, num_frames=settings.framestack or ATARI_FRAMESTACK))
    if ctx.initial_states:
        members.append(StateBuffer(ctx))
    return members


def default_agent_pipeline(ctx: ConnectorContext) -> AgentConnectorPipeline:
    """The standard agent pipeline for ``ctx`` (see the module docstring for the order)."""
    settings = ConnectorSettings.from_config(ctx.config)
    if settings.preset == "atari":
        return AgentConnectorPipeline(ctx, _atari_members(ctx, settings))
    members: list[AgentConnector] = []
    if not isinstance(ctx.observation_space, gym.spaces.Box):
        members.append(FlattenObservations(ctx))
    if settings.observation_filter == "MeanStdFilter":
        freeze = settings.observation_filter_sync == "frozen"
        members.append(MeanStdFilter(ctx, freeze_between_syncs=freeze))
    clip_rewards, reward_limit = settings.reward_limit
    if clip_rewards:
        members.append(ClipReward(ctx, limit=reward_limit))
    if settings.framestack is not None:
        members.append(FrameStack(ctx, num_frames=settings.framestack))
    if ctx.initial_states:
        members.append(StateBuffer(ctx))
    return AgentConnectorPipeline(ctx, members)


def default_action_pipeline(ctx: ConnectorContext) -> ActionConnectorPipeline:
    """The standard action pipeline for ``ctx`` (see the module docstring for the order)."""
    settings = ConnectorSettings.from_config(ctx.config)
    is_box = isinstance(ctx.action_space, gym.spaces.Box)
    members: list[ActionConnector] = [] if ctx.device is not None else [ConvertToNumpy(ctx)]
    if settings.normalize_actions and is_box:
        members.append(UnsquashActions(ctx))
    if settings.clip_actions and is_box:
        members.append(ClipActions(ctx))
    return ActionConnectorPipeline(ctx, members)
