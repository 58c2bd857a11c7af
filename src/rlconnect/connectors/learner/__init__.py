"""Learner connectors: from a policy's batch to the learning signal (returns, advantages,
bootstrap values, off-policy corrections), whole-batch and exact at every trajectory end.

Importing this package registers every built-in learner connector. Each also runs on a
batch of torch tensors on one device (``takes_tensors``; :mod:`.torch_connectors`), with
no host read inside ``deferred_checks()`` (:mod:`.torch_checks`).
"""

from rlconnect.connectors.learner.base import LearnerConnector
from rlconnect.connectors.learner.gae import GAE
from rlconnect.connectors.learner.n_step import NStepReturns
from rlconnect.connectors.learner.normalize import NormalizeAdvantages
from rlconnect.connectors.learner.pipeline import LearnerConnectorPipeline
from rlconnect.connectors.learner.returns import DiscountedReturns
from rlconnect.connectors.learner.torch_checks import PendingChecks, deferred_checks
from rlconnect.connectors.learner.trajectories import Trajectories, find_trajectories
from rlconnect.connectors.learner.vtrace import VTrace

__all__ = [
    "GAE",
    "DiscountedReturns",
    "LearnerConnector",
    "LearnerConnectorPipeline",
    "NStepReturns",
    "NormalizeAdvantages",
    "PendingChecks",
    "Trajectories",
    "VTrace",
    "deferred_checks",
    "find_trajectories",
]
