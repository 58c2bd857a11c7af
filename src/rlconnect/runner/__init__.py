"""The runner: RunnerConfig, Callbacks and the EnvRunner sampling loop."""

from rlconnect.runner.callbacks import Callbacks
from rlconnect.runner.config import BatchMode, CountStepsBy, RunnerConfig
from rlconnect.runner.runner import EnvRunner

__all__ = ["BatchMode", "Callbacks", "CountStepsBy", "EnvRunner", "RunnerConfig"]
