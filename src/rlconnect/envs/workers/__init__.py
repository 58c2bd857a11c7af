"""Sub-envs in worker processes, exchanged with the runner through shared memory."""

from rlconnect.envs.workers.pool import WorkerEnvs, split_evenly

__all__ = ["WorkerEnvs", "split_evenly"]
