"""Policy serving over HTTP: external simulators drive episodes, the runner records them.

- ``PolicyServer(runner_or_policy, address, port)``: an ExternalEnv fed over HTTP, its
  limits a ``ServerSettings`` (or its fields as keyword arguments).
- ``PolicyClient(url, inference_mode="remote" | "local", update_interval=10.0)``.
- ``ServingEnv`` / ``ServingMultiAgentEnv``: the ExternalEnvs a server feeds.
- ``rlconnect.serve.wire``: the msgpack wire format (no pickle).
"""

from rlconnect.serve.client import (
    AnswerTooLargeError,
    BadRequestError,
    InternalServerError,
    NotFoundError,
    PolicyClient,
    RequestTooLargeError,
    RunnerFailedError,
    ServerBusyError,
    ServerError,
    ServerTimeoutError,
)
from rlconnect.serve.envs import ServingEnv, ServingMultiAgentEnv
from rlconnect.serve.server import PolicyServer
from rlconnect.serve.settings import ServerSettings
from rlconnect.serve.wire import WireError

__all__ = [
    "AnswerTooLargeError",
    "BadRequestError",
    "InternalServerError",
    "NotFoundError",
    "PolicyClient",
    "PolicyServer",
    "RequestTooLargeError",
    "RunnerFailedError",
    "ServerBusyError",
    "ServerError",
    "ServerSettings",
    "ServerTimeoutError",
    "ServingEnv",
    "ServingMultiAgentEnv",
    "WireError",
]
