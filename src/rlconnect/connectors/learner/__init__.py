"""Learner connectors: from a policy's batch to the learning signal (returns, advantages,
bootstrap values, off-policy corrections), whole-batch and exact at every trajectory end.

Importing this package registers every built-in learner connector.
"""

from rlconnect.connectors.learner.base import LearnerConnector
from rlconnect.connectors.learner.gae import GAE
from rlconnect.connectors.learner.n_step import NStepReturns
from rlconnect.connectors.learner.normalize import NormalizeAdvantages
from rlconnect.connectors.learner.pipeline import LearnerConnectorPipeline
from rlconnect.connectors.learner.returns import DiscountedReturns
from rlconnect.connectors.learner.trajectories import Trajectories, find_trajectories
from rlconnect.connectors.learner.vtrace import VTrace

__all__ = [
    "GAE",
    "DiscountedReturns",
    "LearnerConnector",
    "LearnerConnectorPipeline",
    "NStepReturns",
    "NormalizeAdvantages",
    "Trajectories",
    "VTrace",
    "find_trajectories",
]
