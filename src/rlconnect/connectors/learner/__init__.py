"""Learner connectors: from a policy's batch to the learning signal (returns, advantages,
bootstrap values, off-policy corrections), whole-batch and exact at every trajectory end.

Importing this package registers every built-in learner connector.
"""

from rlconnect.connectors.learner.base import LearnerConnector
from rlconnect.connectors.learner.pipeline import LearnerConnectorPipeline
from rlconnect.connectors.learner.trajectories import Trajectories, find_trajectories

__all__ = [
    "LearnerConnector",
    "LearnerConnectorPipeline",
    "Trajectories",
    "find_trajectories",
]
