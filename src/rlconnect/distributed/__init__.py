"""Scale out on Ray: ``RunnerGroup`` with weight and filter sync and fault tolerance.

Importing this package does not import Ray; a group with ``num_runners > 0`` does.
"""

from rlconnect.distributed.faults import FaultTolerance, RunnerFailedError, RunnerFailure
from rlconnect.distributed.group import RunnerGroup

__all__ = ["FaultTolerance", "RunnerFailedError", "RunnerFailure", "RunnerGroup"]
