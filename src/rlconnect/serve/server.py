"""PolicyServer: an ExternalEnv fed over HTTP, so served episodes become training batches.

Every endpoint is ``POST /v1/<name>`` with a msgpack body (``rlconnect.serve.wire``) and a
msgpack answer; errors are HTTP 4xx/5xx with ``{"error": kind, "message": text}``:

=================  ==========================================  ======================
endpoint           body                                        answer
=================  ==========================================  ======================
start_episode      episode_id (optional), training_enabled     episode_id
get_action         episode_id, obs, reward (optional)          action
get_actions        episode_ids, obs, rewards (optional)        actions
log_action         episode_id, obs, action                     {}
log_returns        episode_id, reward, info (optional)         {}
end_episode        episode_id, obs                             {}
report             commands: [[name, {args}], ...]             applied (count)
checkpoint         {}                                          files: {path: bytes}
weights            {}                                          weights, connector_states
=================  ==========================================  ======================

``GET /v1/health`` answers ``{"ok": ..., ...}`` in JSON (``POST /v1/health`` in msgpack).
The server is one asyncio event loop in its own thread (``serve.http``: httptools'
parser, whole-request deadlines, body limits); the runner's sampling thread takes the
queued observations in batches (``max_batch``, ``batch_wait_s``) and hands every step's
actions back to the loop at once. The modules: ``serve.http`` (connections),
``serve.decoder`` (large bodies, peers in turn), ``serve.endpoints`` (what each request does),
``serve.handler`` (fields and statuses), ``serve.tasks`` (runner work a request needs),
``serve.envs`` (the ServingEnvs).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from rlconnect.envs.external import ExternalEnvAdapter, QueueFullError, Reply, notify_each
from rlconnect.policy import Policy
from rlconnect.serve.decoder import FairDecoder
from rlconnect.serve.deployed import DeployedEndpoints
from rlconnect.serve.endpoints import Endpoints
from rlconnect.serve.envs import ServingEnv, ServingMultiAgentEnv
from rlconnect.serve.handler import (
    PENDING,
    BadRequest,
    Call,
    NoEndpoint,
    RunnerFailed,
    kind_of,
    status_of,
)
from rlconnect.serve.http import HttpConnection, Listener
from rlconnect.serve.settings import ServerSettings
from rlconnect.serve.tasks import RunnerUnavailable
from rlconnect.serve.wire import INLINE_BYTES, decode
from rlconnect.spaces import space_to_json

__all__ = ["PolicyServer", "ServerSettings", "ServingEnv", "ServingMultiAgentEnv"]

log = logging.getLogger("rlconnect.serve.server")


def _is_deployed(source: Any) -> bool:
    from rlconnect.deploy import DeployedPolicy

    return isinstance(source, DeployedPolicy)


def _runner_of(runner_or_policy: Any, spaces: tuple, max_concurrent: int, config: Any) -> Any:
    """The runner to serve: the one given, or one built on a ServingEnv for a policy."""
    from rlconnect.runner import EnvRunner

    if isinstance(runner_or_policy, Policy):
        observation_space, action_space = spaces
        env = ServingEnv(
            action_space or runner_or_policy.action_space,
            observation_space or runner_or_policy.observation_space,
            max_concurrent,
        )
        return EnvRunner(env, runner_or_policy, config=config)
    if not isinstance(runner_or_policy, EnvRunner):
        raise TypeError(
            f"PolicyServer takes an rc.EnvRunner, an rc.Policy or an rc.DeployedPolicy "
            "(rc.load_policy), got "
            f"{type(runner_or_policy).__name__}"
        )
    if not isinstance(runner_or_policy.env, ExternalEnvAdapter):
        raise TypeError(
            "PolicyServer needs a runner built on an ExternalEnv (e.g. "
            f"rc.serve.ServingEnv), but this runner's env is {type(runner_or_policy.env).__name__}"
        )
    return runner_or_policy


class PolicyServer:
    """Serve a runner's policies over HTTP; the episodes it serves fill the runner's batches.

    Args:
        runner_or_policy: an ``rc.EnvRunner`` built on an ExternalEnv (e.g. a
            ``ServingEnv``), or an ``rc.Policy``: the server then builds a ``ServingEnv``
            (spaces from ``observation_space`` / ``action_space``, default the policy's) and
            ``rc.EnvRunner(env, policy, config=config)``. Sample from ``server.runner``;
            its policy explores and its filters learn unless its config says otherwise.
            Or an ``rc.DeployedPolicy`` (``rc.load_policy(path)``), served exactly as
            exported: each episode a session of ``compute_action`` (no exploration,
            statistics frozen, nothing recorded), answered by the server itself with no
            runner (``server.runner`` is None) and no sampling loop to drive. To go on
            training from a run, use ``PolicyServer.from_checkpoint``.
        address, port: where to listen (port 0 picks a free one; see ``server.port``).
        settings: the server's limits, a ``ServerSettings`` (how many episodes, per
            connection too, the batching window, the queue bound, the timeouts, the body
            size, the listen backlog). Each of its fields may also be given as a keyword
            argument (``PolicyServer(policy, max_concurrent=16, batch_wait_s=0.005)``),
            which wins over ``settings``; ``server.settings`` holds the ones in force.
    """

    def __init__(
        self,
        runner_or_policy: Any,
        address: str = "127.0.0.1",
        port: int = 9900,
        *,
        config: Any = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        settings: ServerSettings | None = None,
        **limits: Any,
    ) -> None:
        self.settings = settings = ServerSettings.of(settings, limits)
        self.requests = 0
        self._listener = Listener(self._dispatch, settings.http_limits(), self._watch)
        self._decoder = FairDecoder(decode)
        self._endpoints: Endpoints | DeployedEndpoints
        #: the runner whose batches the served episodes fill (None for a DeployedPolicy)
        self.runner: Any = None
        #: the ExternalEnv the requests feed (None for a DeployedPolicy)
        self.env: Any = None
        if _is_deployed(runner_or_policy):
            loop = self._listener.loop
            self._endpoints = DeployedEndpoints(runner_or_policy, settings, loop)
        else:
            spaces = (observation_space, action_space)
            self.runner = _runner_of(runner_or_policy, spaces, settings.max_concurrent, config)
            self.env = self.runner.env.external
            hub = self.env.hub
            hub.set_limits(settings.hub_limits())
            share = settings.share(hub.max_concurrent)
            self._endpoints = Endpoints(self.runner, self._listener.loop, share)
            hub.set_delivery(self._deliver)
        self.address, self.port = self._listener.start(address, port, settings.backlog)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike[str],
        address: str = "127.0.0.1",
        port: int = 9900,
        *,
        policy_id: str = "default_policy",
        config_overrides: Mapping[str, Any] | None = None,
        settings: ServerSettings | None = None,
        **limits: Any,
    ) -> PolicyServer:
        """Serve the runner of a checkpoint (or a ``rlconnect sample --out`` run folder),
        rebuilt on a ``ServingEnv`` of ``policy_id``'s env spaces, and go on training it:
        its policy explores (``explore`` of its config) and its filters keep learning, as
        in sampling. Sample from ``server.runner``."""
        from rlconnect.checkpoints.runner_load import load_checkpoint
        from rlconnect.deploy.sources import find_checkpoint
        from rlconnect.runner import EnvRunner

        settings = ServerSettings.of(settings, limits)
        folder = find_checkpoint(path)
        records = load_checkpoint(folder).policies
        if policy_id not in records:
            raise KeyError(f"no policy {policy_id!r} in {str(path)!r}; it has {sorted(records)}")
        record = records[policy_id]
        env = ServingEnv(
            record.env_action_space, record.env_observation_space, settings.max_concurrent
        )
        overrides = {"num_envs": 1, **(config_overrides or {})}  # the served env's lanes
        runner = EnvRunner.from_checkpoint(folder, env=env, config_overrides=overrides)
        return cls(runner, address, port, settings=settings)

    def _watch(self) -> None:
        self._endpoints.watch()

    @property
    def url(self) -> str:
        """Where clients reach the server, ``http://address:port``."""
        return f"http://{self.address}:{self.port}"

    @property
    def disconnects(self) -> int:
        """Clients that vanished, stalled or trickled mid-request and were cut."""
        return self._listener.disconnects

    @property
    def errors(self) -> int:
        """Requests answered with an error status."""
        return self._listener.errors

    def stop(self) -> None:
        """Stop listening, fail waiting calls and close the env (the runner stays usable)."""
        self._listener.stop()
        self._decoder.stop()
        self._endpoints.close()

    close = stop

    def __enter__(self) -> PolicyServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _deliver(self, replies: list[Reply]) -> None:
        """A sampling step's actions: handed to the event loop in one wake-up."""
        self._listener.call_soon(notify_each, replies)

    # -- requests ---------------------------------------------------------------------------
    def _dispatch(self, conn: HttpConnection, method: str, path: str, body: bytes) -> None:
        """Answer one HTTP request (on the event loop thread). A body above
        ``wire.INLINE_BYTES`` is walked and decoded in the decoder thread, one at a time and
        peers in turn (``serve.decoder``), so a costly body never holds the loop and one
        peer's bodies never hold another's (its bytes stay charged to the body budget
        until it is answered)."""
        name = path.split("?", 1)[0].removeprefix("/v1/").strip("/")
        if method == "GET":  # JSON, for curl, load balancers and probes
            if name == "health":
                conn.respond(200, self.health(), as_json=True)
            else:
                message = f"no endpoint GET {path}; GET /v1/health answers JSON"
                conn.respond(404, {"error": "NotFound", "message": message}, as_json=True)
            return
        if method != "POST":
            conn.respond(501, {"error": "NotImplemented", "message": f"no {method} requests"})
            return
        self.requests += 1
        call = self._call(conn, name)
        if len(body) <= INLINE_BYTES:
            self._run(conn, name, call, lambda: decode(body) if body else {})
            return
        seq = conn.seq

        def decoded(value: Any, error: BaseException | None) -> None:
            if conn.seq != seq:  # the client is gone: nothing to do for it
                return
            if error is not None:
                call.finish(None, error)
            else:
                self._run(conn, name, call, lambda: value)

        def done(value: Any, error: BaseException | None) -> None:  # in the decoder thread
            self._listener.call_soon(decoded, value, error)

        self._decoder.submit(conn.peer, body, done)

    def _call(self, conn: HttpConnection, name: str) -> Call:
        """The answer channel of the request ``conn`` is receiving now."""
        seq = conn.seq

        def finish(answer: Any, error: BaseException | None) -> None:
            if conn.seq != seq:  # answered already (e.g. 504), or the client is gone
                return
            if error is None:
                conn.respond(200, answer)
                return
            status = status_of(error)
            if status is None:
                log.error("PolicyServer: %s failed", name, exc_info=error)
                status = 500
            elif isinstance(error, QueueFullError):
                self._listener.busy(str(error))  # reported by /health
            conn.respond(status, {"error": kind_of(error), "message": str(error)})

        return Call(self._endpoints.shares.of(self._client(conn)), finish)

    def _client(self, conn: HttpConnection) -> str:
        """Who sends ``conn``'s requests, as ``settings.client_key`` says (its share)."""
        if self.settings.client_key == "token" and conn.token is not None:
            return "token:" + conn.token
        return "peer:" + conn.peer

    def _run(self, conn: HttpConnection, name: str, call: Call, read: Callable[[], Any]) -> None:
        """Answer a request whose body ``read()`` returns decoded (on the loop thread)."""
        try:
            answer = self._handle(name, read(), call)
        except Exception as exc:
            call.finish(None, exc)
            return
        if answer is not PENDING:
            call.finish(answer, None)
        elif call.wait_s is not None:
            message = f"{name}: no answer within {call.wait_s:g} s (is the runner sampling?)"
            conn.answer_deadline = (time.monotonic() + call.wait_s, message)

    def _handle(self, name: str, body: Any, call: Call) -> Any:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a map")
        if name == "health":
            return self.health()
        op = self._endpoints.ops.get(name)
        if op is None:
            known = sorted([*self._endpoints.ops, "health"])
            raise NoEndpoint(f"no endpoint POST /v1/{name}; known: {known}")
        problem = self._problem()
        if problem is not None:  # it would never reach a batch nor get an action: 503 now
            if self._endpoints.failure() is not None:
                raise RunnerFailed(f"{name}: {problem}")
            raise RunnerUnavailable(f"{name}: {problem}")
        return op(body, call)

    def handle(self, name: str, body: Any) -> Any:
        """Answer one decoded request from this thread, as HTTP would (raises the errors
        that map to HTTP statuses); it runs on the event loop like any request."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def finish(answer: Any, error: BaseException | None) -> None:
            if error is None:
                done.set_result(answer)
            else:
                done.set_exception(error)

        call = Call(set(), finish)
        waits: concurrent.futures.Future = concurrent.futures.Future()  # its deadline or None

        def run() -> None:
            try:
                answer = self._handle(name, body, call)
            except Exception as exc:
                done.set_exception(exc)
            else:
                if answer is not PENDING:
                    done.set_result(answer)
            waits.set_result(call.wait_s)

        self._listener.call_soon(run)
        timeout = waits.result()
        try:
            return done.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{name}: no answer within {timeout:g} s") from None

    def health(self) -> dict[str, Any]:
        """Whether the server can serve (``ok``), and why not (``problem``)."""
        problem = self._problem()
        status = self._endpoints.status()
        return {
            "ok": problem is None,
            "problem": problem,
            **status,
            "connections": len(self._listener.connections),
            "refusing": self._listener.refusing(),
            "refused_for_capacity": self._listener.refused_for_capacity,
            "max_body_bytes": self._listener.limits.max_body_bytes,
            "observation_space": _space_json(status["observation_space"]),
            "action_space": _space_json(status["action_space"]),
        }

    def _problem(self) -> str | None:
        """Why no action can come (the runner or the env failed, the server stops), or None."""
        failure = self._endpoints.failure()
        if failure is None and self._endpoints.stopping:
            return "the server is stopping"
        return failure


def _space_json(space: Any) -> Any:
    return space_to_json(space) if isinstance(space, gym.Space) else None
