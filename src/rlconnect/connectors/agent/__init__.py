"""Built-in agent connectors: what the env returned, shaped for the policy."""

from rlconnect.connectors.agent.agent_lambda import AgentLambda
from rlconnect.connectors.agent.clip_reward import ClipReward
from rlconnect.connectors.agent.flatten_observations import FlattenObservations
from rlconnect.connectors.agent.frame_stack import FrameStack
from rlconnect.connectors.agent.mean_std_filter import (
    MeanStdFilter,
    empty_statistics,
    merge_statistics,
)
from rlconnect.connectors.agent.pixels import (
    CropObservations,
    Grayscale,
    ScalePixels,
    TransposeImage,
)
from rlconnect.connectors.agent.pixels_resize import Resize
from rlconnect.connectors.agent.prev_actions_rewards import PrevActionsRewards
from rlconnect.connectors.agent.state_buffer import StateBuffer

__all__ = [
    "AgentLambda",
    "ClipReward",
    "CropObservations",
    "FlattenObservations",
    "FrameStack",
    "Grayscale",
    "MeanStdFilter",
    "PrevActionsRewards",
    "Resize",
    "ScalePixels",
    "StateBuffer",
    "TransposeImage",
    "empty_statistics",
    "merge_statistics",
]
