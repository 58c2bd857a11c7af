"""Built-in action connectors: what the policy output, shaped for the env."""

from rlconnect.connectors.action.action_lambda import ActionLambda
from rlconnect.connectors.action.clip_actions import ClipActions
from rlconnect.connectors.action.convert_to_numpy import ConvertToNumpy, to_numpy
from rlconnect.connectors.action.immutable_actions import ImmutableActions
from rlconnect.connectors.action.unsquash_actions import UnsquashActions

__all__ = [
    "ActionLambda",
    "ClipActions",
    "ConvertToNumpy",
    "ImmutableActions",
    "UnsquashActions",
    "to_numpy",
]
