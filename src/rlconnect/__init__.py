"""rlconnect: fast, safe RL experience collection on composable connector pipelines.

The public names of the API contract; everything else lives in the subpackages.
"""

from rlconnect import spaces
from rlconnect.batches import (
    DEFAULT_AGENT_ID,
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    concat_samples,
)
from rlconnect.checkpoints import load_pipeline, save_pipeline
from rlconnect.connectors import (
    ActionConnector,
    ActionConnectorPipeline,
    ActionData,
    ActionLambda,
    AgentConnector,
    AgentConnectorPipeline,
    AgentData,
    AgentLambda,
    ClipActions,
    ClipReward,
    ColumnActionConnector,
    ConnectorContext,
    ConvertToNumpy,
    FlattenObservations,
    FrameStack,
    ImmutableActions,
    MeanStdFilter,
    ObservationConnector,
    PrevActionsRewards,
    RewardConnector,
    StateBuffer,
    UnsquashActions,
    default_action_pipeline,
    default_agent_pipeline,
    get_connector,
    register_connector,
    register_lambda,
    registered_connectors,
)
from rlconnect.connectors.checker import CheckReport, PipelineCheckError, check_pipeline
from rlconnect.envs import BaseEnv, EnvContext, MultiAgentEnv
from rlconnect.episodes import Episode
from rlconnect.errors import CheckpointError, EnvCheckError, EnvError, UnknownConnectorError
from rlconnect.offline import BatchWriter, read_batches, write_batches
from rlconnect.policy import MLPPolicy, Policy, RandomPolicy, TorchPolicy, register_policy
from rlconnect.runner import Callbacks, EnvRunner, RunnerConfig

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_AGENT_ID",
    "DEFAULT_POLICY_ID",
    "ActionConnector",
    "ActionConnectorPipeline",
    "ActionData",
    "ActionLambda",
    "AgentConnector",
    "AgentConnectorPipeline",
    "AgentData",
    "AgentLambda",
    "BaseEnv",
    "BatchWriter",
    "Callbacks",
    "CheckReport",
    "CheckpointError",
    "ClipActions",
    "ClipReward",
    "ColumnActionConnector",
    "ConnectorContext",
    "ConvertToNumpy",
    "EnvCheckError",
    "EnvContext",
    "EnvError",
    "EnvRunner",
    "Episode",
    "FlattenObservations",
    "FrameStack",
    "ImmutableActions",
    "MLPPolicy",
    "MeanStdFilter",
    "MultiAgentBatch",
    "MultiAgentEnv",
    "ObservationConnector",
    "PipelineCheckError",
    "Policy",
    "PrevActionsRewards",
    "RandomPolicy",
    "RewardConnector",
    "RunnerConfig",
    "SampleBatch",
    "StateBuffer",
    "TorchPolicy",
    "UnknownConnectorError",
    "UnsquashActions",
    "check_pipeline",
    "concat_samples",
    "default_action_pipeline",
    "default_agent_pipeline",
    "get_connector",
    "load_pipeline",
    "read_batches",
    "register_connector",
    "register_lambda",
    "register_policy",
    "registered_connectors",
    "save_pipeline",
    "spaces",
    "write_batches",
]
