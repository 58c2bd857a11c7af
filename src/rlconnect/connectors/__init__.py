"""rlconnect.connectors: connector interfaces, pipelines, the registry and the built-ins.

Importing this package registers every built-in connector.
"""

from rlconnect.connectors.action import (
    ActionLambda,
    ClipActions,
    ConvertToNumpy,
    ImmutableActions,
    UnsquashActions,
)
from rlconnect.connectors.agent import (
    AgentLambda,
    ClipReward,
    CropObservations,
    FlattenObservations,
    FrameStack,
    Grayscale,
    MeanStdFilter,
    PrevActionsRewards,
    Resize,
    ScalePixels,
    StateBuffer,
    TransposeImage,
    merge_statistics,
)
from rlconnect.connectors.base import (
    ActionConnector,
    ActionData,
    AgentConnector,
    AgentData,
    ColumnActionConnector,
    Connector,
    ConnectorContext,
    ObservationConnector,
    RewardConnector,
    RowKey,
)
from rlconnect.connectors.defaults import default_action_pipeline, default_agent_pipeline
from rlconnect.connectors.learner import LearnerConnector, LearnerConnectorPipeline
from rlconnect.connectors.pipeline import (
    ActionConnectorPipeline,
    AgentConnectorPipeline,
    ConnectorPipeline,
)
from rlconnect.connectors.registry import (
    get_connector,
    get_connector_class,
    get_lambda,
    register_connector,
    register_lambda,
    registered_connectors,
    registered_lambdas,
)
from rlconnect.connectors.settings import ConnectorSettings

__all__ = [
    "ActionConnector",
    "ActionConnectorPipeline",
    "ActionData",
    "ActionLambda",
    "AgentConnector",
    "AgentConnectorPipeline",
    "AgentData",
    "AgentLambda",
    "ClipActions",
    "ClipReward",
    "ColumnActionConnector",
    "Connector",
    "ConnectorContext",
    "ConnectorPipeline",
    "ConnectorSettings",
    "ConvertToNumpy",
    "CropObservations",
    "FlattenObservations",
    "FrameStack",
    "Grayscale",
    "ImmutableActions",
    "LearnerConnector",
    "LearnerConnectorPipeline",
    "MeanStdFilter",
    "ObservationConnector",
    "PrevActionsRewards",
    "Resize",
    "RewardConnector",
    "RowKey",
    "ScalePixels",
    "StateBuffer",
    "TransposeImage",
    "UnsquashActions",
    "default_action_pipeline",
    "default_agent_pipeline",
    "get_connector",
    "get_connector_class",
    "get_lambda",
    "merge_statistics",
    "register_connector",
    "register_lambda",
    "registered_connectors",
    "registered_lambdas",
]
