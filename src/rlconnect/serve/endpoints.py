"""The endpoints of a PolicyServer: episode calls, batched actions, reports, runner work.

An endpoint reads the fields of the wire (present, of a wire type) and hands their values
to the episode hub by agent id; the hub checks them (ids, observations, rewards, logged
actions, infos), as it checks an ExternalEnv's own calls: one check for every route.
Each takes a decoded body and a ``Call`` and runs on the server's event loop thread, so
requests never interleave: a check made at the start of a request (room in the queue,
free lanes) still holds when it is applied. ``get_action`` and ``get_actions`` queue their
observations in the episode hub and answer when the runner's step delivers the actions
(``PENDING``); everything else answers at once. Runner work (``checkpoint``, ``weights``)
waits in the default executor for a sampling step to do it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.checkpoints.files import read_folder
from rlconnect.envs.external import (
    NO_ACTION,
    EpisodeError,
    ExternalEnv,
    ExternalMultiAgentEnv,
    Reply,
)
from rlconnect.serve.envs import _Idle
from rlconnect.serve.handler import (
    PENDING,
    BadRequest,
    Call,
    RunnerFailed,
    TooLarge,
    field,
    plain,
)
from rlconnect.serve.shares import Shares
from rlconnect.serve.tasks import run_in_sampler

__all__ = ["Endpoints"]

_EID = (str, int)
_REPORTED = ("start_episode", "log_action", "log_returns", "end_episode")


def _eid(body: dict) -> Any:
    """The episode id a request names (the hub checks it is one, as for any call)."""
    return field(body, "episode_id", _EID)


class Endpoints:
    """The request handlers of one served env (``ops`` by endpoint name)."""

    def __init__(self, runner: Any, loop: asyncio.AbstractEventLoop, share: int) -> None:
        self.runner = runner
        self.env: ExternalEnv = runner.env.external
        self.hub = self.env.hub
        self.loop = loop
        self.shares = Shares(share, self.hub.max_concurrent, self.hub.forget_ended)
        self.multi = isinstance(self.env, ExternalMultiAgentEnv)
        self.ops: dict[str, Callable[[dict, Call], Any]] = {
            "start_episode": self.start_episode,
            "get_action": self.get_action,
            "get_actions": self.get_actions,
            "log_action": self.log_action,
            "log_returns": self.log_returns,
            "end_episode": self.end_episode,
            "report": self.report,
            "checkpoint": self.checkpoint,
            "weights": self.weights,
        }

    # -- what the server asks of the service it answers for --------------------------------
    def failure(self) -> str | None:
        """What failed for good (the runner's sample(), the served env), or None."""
        failed = self.runner.failure
        if failed is not None:
            return f"the runner's sample() raised {type(failed).__name__}: {failed}"
        if self.env.error is not None:
            return f"the served env raised {self.env.error!r}"
        return None

    @property
    def stopping(self) -> bool:
        """True once the episode hub is closed: the server answers no more calls."""
        return self.hub.closed

    def watch(self) -> None:
        """On the loop, a few times a second: once the runner (or the served env) has
        failed, every call waiting for it is answered at once (503 ``RunnerFailed``)."""
        failure = self.failure()
        if failure is not None and not self.hub.closed:
            self.hub.close(RunnerFailed(f"{failure}; nothing more will be served"))

    def status(self) -> dict[str, Any]:
        """What ``/v1/health`` reports of the served env and its runner."""
        return {
            "running_episodes": self.env.num_running_episodes,
            "max_concurrent": self.env.max_concurrent,
            "queued_steps": self.hub.queued,
            "seconds_since_poll": round(time.monotonic() - self.hub.last_poll, 3),
            "multi_agent": self.multi,
            "observation_space": self.env.observation_space,
            "action_space": self.env.action_space,
        }

    def close(self) -> None:
        """Fail the waiting calls and close the env (the runner stays usable)."""
        self.hub.set_delivery(None)  # the loop is going: nothing to hand over
        self.hub.close()
        if isinstance(self.env, _Idle):
            self.env.stop()

    # -- episode calls --------------------------------------------------------------------
    def start_episode(self, body: dict, call: Call) -> dict:
        """Start an episode (under the id sent, or a new one) and count it against this
        client's share of ``max_concurrent``."""
        eid = _eid(body) if body.get("episode_id") is not None else None
        training = field(body, "training_enabled", (bool,), True)
        self.shares.check(call.episodes, 1)
        eid = self.env.start_episode(eid, training)
        call.episodes.add(eid)
        return {"episode_id": eid}

    def _by_agent(self, value: Any) -> Any:
        """A request's observation, reward, action or info as the hub takes it, by agent
        id: a multi-agent env's as sent (the hub checks it is a dict of agents), a
        single-agent env's under ``DEFAULT_AGENT_ID``."""
        return value if self.multi else {DEFAULT_AGENT_ID: value}

    def _action(self, got: dict) -> Any:
        if self.multi:
            return {agent: plain(a) for agent, a in got.items()}
        return plain(got[DEFAULT_AGENT_ID])

    def get_action(self, body: dict, call: Call) -> Any:
        """Queue the episode's observation (and the reward since its previous action) for
        the runner; answered with the action once a step computes it."""
        eid = _eid(body)
        reward = body.get("reward")
        step = (eid, self._by_agent(field(body, "obs")), _maybe(self._by_agent, reward))

        def answered(reply: Reply) -> None:
            if reply.error is not None:
                call.finish(None, reply.error)
            else:
                call.finish({"action": self._action(reply.value)}, None)

        self.hub.act([step], answered)
        call.wait_s = self.hub.limits.get_action_timeout_s
        return PENDING

    def get_actions(self, body: dict, call: Call) -> Any:
        """Many episodes' observations (and previous rewards) in, all their actions out."""
        eids = field(body, "episode_ids", (list,))
        obs = field(body, "obs", (list, np.ndarray))
        rewards = field(body, "rewards", (list, np.ndarray, type(None)), None)
        n = len(eids)
        if len(obs) != n or (rewards is not None and len(rewards) != n):
            raise BadRequest("'episode_ids', 'obs' and 'rewards' must have the same length")
        if not n:
            return {"actions": []}
        for i, eid in enumerate(eids):
            if isinstance(eid, bool) or not isinstance(eid, _EID):
                raise BadRequest(f"episode_ids[{i}] must be a str or an int")
        steps = [
            (
                eid,
                self._by_agent(obs[i]),
                None if rewards is None else _maybe(self._by_agent, _scalar(rewards[i])),
            )
            for i, eid in enumerate(eids)
        ]
        gather = _Gather(call, self._action)
        # the replies are delivered on this (the event loop's) thread: not before this returns
        gather.expect(self.hub.act(steps, gather.notifier))
        call.wait_s = self.hub.limits.get_action_timeout_s
        return PENDING

    def log_action(self, body: dict, call: Call) -> dict:
        """Record an observation and the action the client took itself (off-policy)."""
        eid = _eid(body)
        obs, action = field(body, "obs"), field(body, "action")
        self.hub.observe(eid, self._by_agent(obs), self._by_agent(action))
        return {}

    def log_returns(self, body: dict, call: Call) -> dict:
        """Add a reward to the episode's current step and merge an info into it."""
        eid = _eid(body)
        reward = field(body, "reward")
        info = field(body, "info", (dict, type(None)), None)
        self.hub.add_returns(eid, self._by_agent(reward), _maybe(self._by_agent, info))
        return {}

    def end_episode(self, body: dict, call: Call) -> dict:
        """End the episode with its last observation; its lane is free for the client."""
        eid = _eid(body)
        self.hub.observe(eid, self._by_agent(field(body, "obs")), NO_ACTION, kind="end")
        call.episodes.discard(eid)
        return {}

    # -- local inference and runner work --------------------------------------------------
    def report(self, body: dict, call: Call) -> dict:
        """Experience a local-inference client collected: commands applied in order, once
        the queue has room for all of them (503 ``QueueFullError`` otherwise: retry)."""
        commands = field(body, "commands", (list,))
        for i, cmd in enumerate(commands):
            if not (isinstance(cmd, list) and len(cmd) == 2 and cmd[0] in _REPORTED):
                raise BadRequest(f"command {i} must be [name, args] with name in {_REPORTED}")
            if not isinstance(cmd[1], dict):
                raise BadRequest(f"command {i}: args must be a map")
        limit = self.hub.limits.max_queued_steps
        assert limit is not None  # resolved
        if len(commands) > limit:
            raise TooLarge(
                f"this report holds {len(commands)} commands and the server queues at most "
                f"{limit} steps (max_queued_steps): it can never fit; send at most {limit} "
                "per report (PolicyClient(report_size=...))"
            )
        peak = _peak_episodes(commands)
        self.shares.check(call.episodes, peak)
        self.hub.admit(len(commands), peak, "this report (PolicyClient retries it)")
        for i, (name, args) in enumerate(commands):
            try:
                self.ops[name](args, call)
            except (BadRequest, EpisodeError) as exc:
                raise type(exc)(
                    f"command {i} ({name}): {exc}; the {i} commands before it were applied"
                ) from None
        return {"applied": len(commands)}

    def checkpoint(self, body: dict, call: Call) -> Any:
        """The runner's checkpoint files, for a local-inference client to build its policy
        (single-agent only)."""
        if self.multi:
            raise BadRequest("local inference is not supported for multi-agent serving yet")
        runner = self.runner
        return self._in_runner(lambda: {"files": _checkpoint_files(runner)}, "checkpoint", call)

    def weights(self, body: dict, call: Call) -> Any:
        """The runner's current weights and connector states, for a local-inference client
        to refresh its copy."""
        runner = self.runner

        def weights() -> dict:
            return {
                "weights": runner.get_weights(),
                "connector_states": runner.get_connector_states(),
            }

        return self._in_runner(weights, "weights", call)

    def _in_runner(self, fn: Callable[[], Any], what: str, call: Call) -> Any:
        """``fn()`` (work on the runner) on the sampling thread, between two steps (see
        ``serve.tasks``); waited for in an executor thread, never on the event loop."""
        timeout_s = self.hub.limits.get_action_timeout_s
        wait = functools.partial(run_in_sampler, self.hub, fn, what, timeout_s)
        future = self.loop.run_in_executor(None, wait)

        def done(f: asyncio.Future) -> None:
            error = f.exception()
            call.finish(None if error else f.result(), error)

        future.add_done_callback(done)
        return PENDING


class _Gather:
    """The answer of a ``get_actions`` call: all its actions, once each has come."""

    def __init__(self, call: Call, convert: Callable[[dict], Any]) -> None:
        self.call, self.convert = call, convert
        self.left = 0
        self.actions: list[Any] = []
        self.index: dict[int, int] = {}
        self.failed = False

    def expect(self, replies: list[Reply]) -> None:
        self.index = {id(r): i for i, r in enumerate(replies)}
        self.left = len(replies)
        self.actions = [None] * len(replies)

    def notifier(self, reply: Reply) -> None:
        """Called once per reply, in any order."""
        if self.failed:
            return
        if reply.error is not None:
            self.failed = True
            self.call.finish(None, reply.error)
            return
        self.actions[self.index[id(reply)]] = self.convert(reply.value)
        self.left -= 1
        if not self.left:
            self.call.finish({"actions": _stacked(self.actions)}, None)


def _stacked(actions: list[Any]) -> Any:
    """One array of all actions when they are arrays of one shape and dtype, else a list."""
    if all(isinstance(a, np.ndarray | np.generic) for a in actions):
        arrays = [np.asarray(a) for a in actions]
        if len({(a.shape, a.dtype) for a in arrays}) == 1:
            return np.stack(arrays)
    return actions


def _maybe(fn: Callable[[Any], Any], value: Any) -> Any:
    """``fn(value)``, or None for a field that was not sent (None)."""
    return None if value is None else fn(value)


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _peak_episodes(commands: list) -> int:
    """Most episodes a report's commands run at once (starts minus ends so far)."""
    running = peak = 0
    for name, _ in commands:
        running += 1 if name == "start_episode" else -1 if name == "end_episode" else 0
        peak = max(peak, running)
    return peak


def _checkpoint_files(runner: Any) -> dict[str, bytes]:
    """The runner's checkpoint as ``{relative path: bytes}``, each file read bounded by
    ``checkpoints.files.MAX_FILE_BYTES`` (so it also fits one msgpack ``bin``)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt")
        runner.save_checkpoint(path)
        return read_folder(path)
