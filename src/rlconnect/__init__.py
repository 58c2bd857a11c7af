"""rlconnect: fast, safe RL experience collection on composable connector pipelines.

The public names of the API contract; everything else lives in the subpackages.
"""

from typing import TYPE_CHECKING, Any

from rlconnect import interop, loggers, serve, spaces
from rlconnect._version import __version__ as __version__
from rlconnect.batches import (
    DEFAULT_AGENT_ID,
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    SequenceBatch,
    chop_into_sequences,
    concat_samples,
)
from rlconnect.checker import CheckReport, PipelineCheckError, check_pipeline
from rlconnect.checkpoints import load_pipeline, save_pipeline
from rlconnect.connectors import (
    GAE,
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
    CropObservations,
    DiscountedReturns,
    FlattenObservations,
    FrameStack,
    Grayscale,
    ImmutableActions,
    LearnerConnector,
    LearnerConnectorPipeline,
    MeanStdFilter,
    NormalizeAdvantages,
    NStepReturns,
    ObservationConnector,
    PrevActionsRewards,
    Resize,
    RewardConnector,
    ScalePixels,
    StateBuffer,
    TransposeImage,
    UnsquashActions,
    VTrace,
    default_action_pipeline,
    default_agent_pipeline,
    get_connector,
    register_connector,
    register_lambda,
    registered_connectors,
)
from rlconnect.deploy import DeployedPolicy, export_onnx, export_policy, load_policy
from rlconnect.distributed import FaultTolerance, RunnerFailedError, RunnerGroup
from rlconnect.envs import BaseEnv, EnvContext, ExternalEnv, ExternalMultiAgentEnv, MultiAgentEnv
from rlconnect.episodes import Episode
from rlconnect.errors import (
    CallbackError,
    CheckpointError,
    EnvCheckError,
    EnvError,
    EnvTimeoutError,
    ExportError,
    LoggerError,
    PolicyError,
    RunnerStateError,
    UnknownConnectorError,
)
from rlconnect.offline import (
    BadFileWarning,
    BatchWriter,
    OfflineConfig,
    OfflineDataError,
    estimate_off_policy,
    read_batches,
    write_batches,
)
from rlconnect.policy import Policy, RandomPolicy, UnknownPolicyError, register_policy
from rlconnect.runner import Callbacks, EnvRunner, RunnerConfig

if TYPE_CHECKING:
    from rlconnect.policy import LSTMPolicy, MLPPolicy, TorchPolicy


__all__ = [
    "DEFAULT_AGENT_ID",
    "DEFAULT_POLICY_ID",
    "GAE",
    "ActionConnector",
    "ActionConnectorPipeline",
    "ActionData",
    "ActionLambda",
    "AgentConnector",
    "AgentConnectorPipeline",
    "AgentData",
    "AgentLambda",
    "BadFileWarning",
    "BaseEnv",
    "BatchWriter",
    "CallbackError",
    "Callbacks",
    "CheckReport",
    "CheckpointError",
    "ClipActions",
    "ClipReward",
    "ColumnActionConnector",
    "ConnectorContext",
    "ConvertToNumpy",
    "CropObservations",
    "DeployedPolicy",
    "DiscountedReturns",
    "EnvCheckError",
    "EnvContext",
    "EnvError",
    "EnvRunner",
    "EnvTimeoutError",
    "Episode",
    "ExportError",
    "ExternalEnv",
    "ExternalMultiAgentEnv",
    "FaultTolerance",
    "FlattenObservations",
    "FrameStack",
    "Grayscale",
    "ImmutableActions",
    "LSTMPolicy",
    "LearnerConnector",
    "LearnerConnectorPipeline",
    "LoggerError",
    "MLPPolicy",
    "MeanStdFilter",
    "MultiAgentBatch",
    "MultiAgentEnv",
    "NStepReturns",
    "NormalizeAdvantages",
    "ObservationConnector",
    "OfflineConfig",
    "OfflineDataError",
    "PipelineCheckError",
    "Policy",
    "PolicyError",
    "PrevActionsRewards",
    "RandomPolicy",
    "Resize",
    "RewardConnector",
    "RunnerConfig",
    "RunnerFailedError",
    "RunnerGroup",
    "RunnerStateError",
    "SampleBatch",
    "ScalePixels",
    "SequenceBatch",
    "StateBuffer",
    "TorchPolicy",
    "TransposeImage",
    "UnknownConnectorError",
    "UnknownPolicyError",
    "UnsquashActions",
    "VTrace",
    "check_pipeline",
    "chop_into_sequences",
    "concat_samples",
    "default_action_pipeline",
    "default_agent_pipeline",
    "estimate_off_policy",
    "export_onnx",
    "export_policy",
    "get_connector",
    "interop",
    "load_pipeline",
    "load_policy",
    "loggers",
    "read_batches",
    "register_connector",
    "register_lambda",
    "register_policy",
    "registered_connectors",
    "save_pipeline",
    "serve",
    "spaces",
    "write_batches",
]


def __getattr__(name: str) -> Any:
    """``rc.MLPPolicy``, ``rc.LSTMPolicy`` and ``rc.TorchPolicy`` import torch on first
    access only."""
    if name in ("LSTMPolicy", "MLPPolicy", "TorchPolicy"):
        from rlconnect import policy

        return getattr(policy, name)
    from rlconnect.errors import did_you_mean

    raise AttributeError(
        f"module 'rlconnect' has no attribute {name!r}{did_you_mean(name, __all__)}"
    )


def __dir__() -> list[str]:
    """The public names (``__all__``, the lazily imported policies among them), not the
    typing helpers and submodules this file happens to hold."""
    return sorted(__all__)
