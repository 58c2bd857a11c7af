"""The endpoints of a PolicyServer: episode calls, batched actions, reports, runner work.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.external import EpisodeError, ExternalEnv, TooManyEpisodesError
from rlconnect.envs.external_checks import check_agent_dict, check_episode_id
from rlconnect.envs.external_hub import NO_ACTION
from rlconnect.envs.external_multi_agent import ExternalMultiAgentEnv
from rlconnect.envs.external_replies import Reply
from rlconnect.serve.handler import PENDING, BadRequest, Call, TooLarge, field
from rlconnect.serve.tasks import run_in_sampler

__all__ = ["Endpoints"]

_EID = (str, int)
_REPORTED = ("start_episode", "log_action", "log_returns", "end_episode")


def _eid(body: dict, name: str = "episode_id") -> Any:
    eid = field(body, name, _EID)
    try:
        check_episode_id(eid)
    except ValueError as exc:
        raise BadRequest(f"field {name!r}: {exc}") from None
    return eid


class Endpoints:
    """The request handlers of one served env (``ops`` by endpoint name)."""

    def __init__(self, env: ExternalEnv, loop: asyncio.AbstractEventLoop, share: int) -> None:
        self.env = env
        self.hub = env.hub
        self.loop = loop
        self.share = share  # episodes one client may run at once
        self.clients: dict[str, set[Any]] = {}  # the episodes each client runs
        self.multi = isinstance(env, ExternalMultiAgentEnv)
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

    # -- episode calls --------------------------------------------------------------------
    def start_episode(self, body: dict, call: Call) -> dict:
        eid = _eid(body) if body.get("episode_id") is not None else None
        training = field(body, "training_enabled", (bool,), True)
        self._check_share(call, 1)
        eid = self.env.start_episode(eid, training)
        call.episodes.add(eid)
        return {"episode_id": eid}

    def episodes_of(self, client: str) -> set[Any]:
        """The episodes ``client`` runs (a set its requests share). Clients that run none
        are forgotten once there are more than twice as many clients as lanes, so the
        table stays bounded whoever connects."""
        if client not in self.clients and len(self.clients) > 2 * self.hub.max_concurrent:
            for key, running in list(self.clients.items()):
                self.hub.forget_ended(running)
                if not running:
                    del self.clients[key]
        return self.clients.setdefault(client, set())

    def _check_share(self, call: Call, more: int) -> None:
        """TooManyEpisodesError when the client would run more than its share."""
        if len(call.episodes) + more <= self.share:
            return
        self.hub.forget_ended(call.episodes)  # those that ended (or timed out) since
        if len(call.episodes) + more > self.share:
            raise TooManyEpisodesError(
                f"this client already runs {len(call.episodes)} episodes, its share "
                f"(max_episodes_per_client={self.share}); end some first, or ask the "
                "server's owner for a larger share"
            )

    def _obs(self, obs: Any, eid: Any) -> dict:
        if self.multi:
            return dict(check_agent_dict(obs, "observations", eid))
        return {DEFAULT_AGENT_ID: obs}

    def _rewards(self, reward: Any, eid: Any) -> dict:
        if reward is None:
            return {}
        if self.multi:
            return dict(check_agent_dict(reward, "rewards", eid))
        if isinstance(reward, bool) or not isinstance(
            reward, int | float | np.integer | np.floating
        ):
            raise BadRequest("field 'reward' must be a number")
        return {DEFAULT_AGENT_ID: reward}

    def _action(self, got: dict) -> Any:
        return dict(got) if self.multi else got[DEFAULT_AGENT_ID]

    def get_action(self, body: dict, call: Call) -> Any:
        eid = _eid(body)
        step = (eid, self._obs(field(body, "obs"), eid), self._rewards(body.get("reward"), eid))

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
                self._obs(obs[i], eid),
                self._rewards(None if rewards is None else _scalar(rewards[i]), eid),
            )
            for i, eid in enumerate(eids)
        ]
        gather = _Gather(call, self._action)
        # the replies are delivered on this (the event loop's) thread: not before this returns
        gather.expect(self.hub.act(steps, gather.notifier))
        call.wait_s = self.hub.limits.get_action_timeout_s
        return PENDING

    def log_action(self, body: dict, call: Call) -> dict:
        eid = _eid(body)
        obs, action = field(body, "obs"), field(body, "action")
        if self.multi:
            self.env.log_action(eid, obs, action)
        else:
            self.hub.observe(eid, {DEFAULT_AGENT_ID: obs}, {DEFAULT_AGENT_ID: action})
        return {}

    def log_returns(self, body: dict, call: Call) -> dict:
        eid = _eid(body)
        reward = field(body, "reward")
        info = field(body, "info", (dict, type(None)), None)
        rewards = self._rewards(reward, eid)
        self.hub.add_returns(eid, rewards, None if info is None else self._infos(info))
        return {}

    def _infos(self, info: dict) -> dict:
        return dict(info) if self.multi else {DEFAULT_AGENT_ID: info}

    def end_episode(self, body: dict, call: Call) -> dict:
        eid = _eid(body)
        self.hub.observe(eid, self._obs(field(body, "obs"), eid), NO_ACTION, kind="end")
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
        self._check_share(call, peak)
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
        if self.multi:
            raise BadRequest("local inference is not supported for multi-agent serving yet")
        return self._in_runner(lambda r: {"files": _checkpoint_files(r)}, "checkpoint", call)

    def weights(self, body: dict, call: Call) -> Any:
        def weights(runner: Any) -> dict:
            return {
                "weights": runner.get_weights(),
                "connector_states": runner.get_connector_states(),
            }

        return self._in_runner(weights, "weights", call)

    def _in_runner(self, fn: Callable[[Any], Any], what: str, call: Call) -> Any:
        """``fn(runner)`` on the sampling thread, between two steps (see ``serve.tasks``);
        waited for in an executor thread, never on the event loop."""
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
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt"
        runner.save_checkpoint(path)
        return {
            str(p.relative_to(path)).replace(os.sep, "/"): p.read_bytes()
            for p in sorted(path.rglob("*"))
            if p.is_file()
        }
