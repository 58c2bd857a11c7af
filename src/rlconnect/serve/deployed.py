"""The endpoints of a PolicyServer that serves a ``DeployedPolicy`` exactly as exported.

Each episode is one session of the deployed policy: ``get_action`` is
``policy.compute_action(obs, session=episode_id, reward=...)`` with the rewards sent since
the episode's previous action (``reward`` of ``get_action`` and ``log_returns``), and
``end_episode`` ends the session. Nothing explores, the statistics stay frozen, nothing is
recorded: there is no runner and no sampling loop to drive. The actions are computed in one
inference thread of the server's, one call after another, so the event loop never waits
for a forward pass. The episode limits are the server's settings: ``max_concurrent``
sessions at once, ``max_episodes_per_client`` of them per client, and a session idle for
``episode_timeout_s`` is ended.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
import uuid
from collections.abc import Callable
from typing import Any

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.external import (
    BadObservationError,
    EpisodeError,
    TooManyEpisodesError,
    UnknownEpisodeError,
    check_episode_id,
    check_obs,
    check_rewards,
)
from rlconnect.errors import EnvCheckError
from rlconnect.serve.handler import PENDING, BadRequest, Call, field, plain
from rlconnect.serve.settings import ServerSettings
from rlconnect.serve.shares import Shares

__all__ = ["DeployedEndpoints"]

_MAX_IDS = 100_000  # ids of ended sessions remembered (a reused id is refused), oldest dropped
_RECORDING = ("log_action", "report", "checkpoint", "weights")


class _Session:
    __slots__ = ("busy", "reward", "touched")

    def __init__(self) -> None:
        self.reward: float | None = None  # rewards since the episode's previous action
        self.busy = False  # a get_action is being computed
        self.touched = time.monotonic()


class DeployedEndpoints:
    """The request handlers of a server of one ``DeployedPolicy`` (``ops`` by name)."""

    def __init__(
        self, policy: Any, settings: ServerSettings, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.loop = loop
        self.sessions: dict[Any, _Session] = {}
        self.ended: collections.OrderedDict[Any, None] = collections.OrderedDict()
        lanes = settings.max_concurrent
        self.shares = Shares(settings.share(lanes), lanes, self._forget_ended)
        self.worker = concurrent.futures.ThreadPoolExecutor(1, "PolicyServer-inference")
        self._closed = False
        self.ops: dict[str, Callable[[dict, Call], Any]] = {
            "start_episode": self.start_episode,
            "get_action": self.get_action,
            "get_actions": self.get_actions,
            "log_returns": self.log_returns,
            "end_episode": self.end_episode,
            **dict.fromkeys(_RECORDING, self._records_nothing),
        }

    # -- what the server asks of the service it answers for --------------------------------
    def failure(self) -> str | None:
        """Always None: with no runner to fail, a failed call fails alone."""
        return None

    @property
    def stopping(self) -> bool:
        """True once ``close`` was called."""
        return self._closed

    def watch(self) -> None:
        """End the sessions idle for longer than ``episode_timeout_s``."""
        limit = self.settings.episode_timeout_s
        if limit is None:
            return
        now = time.monotonic()
        for eid, session in list(self.sessions.items()):
            if not session.busy and now - session.touched > limit:
                self._end(eid)

    def status(self) -> dict[str, Any]:
        """What ``/v1/health`` reports: the open sessions and the policy's spaces (no queue,
        no poll)."""
        return {
            "running_episodes": len(self.sessions),
            "max_concurrent": self.settings.max_concurrent,
            "queued_steps": 0,
            "seconds_since_poll": None,
            "multi_agent": False,
            "observation_space": self.policy.observation_space,
            "action_space": self.policy.action_space,
        }

    def close(self) -> None:
        """Stop the inference thread; actions not yet computed are cancelled."""
        self._closed = True
        self.worker.shutdown(wait=False, cancel_futures=True)

    # -- episode calls --------------------------------------------------------------------
    def start_episode(self, body: dict, call: Call) -> dict:
        """Open a session (under the id sent, or a new one); an id in use or ended is
        refused, as are sessions past ``max_concurrent`` or the client's share."""
        eid = _eid(body) if body.get("episode_id") is not None else uuid.uuid4().hex
        field(body, "training_enabled", (bool,), True)  # nothing is trained either way
        if eid in self.sessions or eid in self.ended:
            raise EpisodeError(f"episode id {eid!r} is already in use; ids must be unique")
        if len(self.sessions) >= self.settings.max_concurrent:
            raise TooManyEpisodesError(
                f"max_concurrent={self.settings.max_concurrent} episodes are already "
                "running; end one first"
            )
        self.shares.check(call.episodes, 1)
        self.sessions[eid] = _Session()
        call.episodes.add(eid)
        return {"episode_id": eid}

    def get_action(self, body: dict, call: Call) -> Any:
        """The session's action for ``obs``, given the rewards since its previous action,
        computed in the inference thread."""
        eid = _eid(body)
        steps = [self._step(eid, field(body, "obs"), body.get("reward"))]
        return self._compute(steps, call, lambda actions: {"action": plain(actions[0])})

    def get_actions(self, body: dict, call: Call) -> Any:
        """Many episodes' observations (and previous rewards) in, all their actions out;
        each computed as its own ``compute_action`` call."""
        eids = field(body, "episode_ids", (list,))
        obs = field(body, "obs")
        rewards = field(body, "rewards", None, None)
        if len(obs) != len(eids) or (rewards is not None and len(rewards) != len(eids)):
            raise BadRequest("'episode_ids', 'obs' and 'rewards' must have the same length")
        if len(set(map(repr, eids))) < len(eids):
            raise EpisodeError("an episode can ask for one action at a time, not two at once")
        steps = [
            self._step(_checked_eid(e), obs[i], None if rewards is None else rewards[i])
            for i, e in enumerate(eids)
        ]
        return self._compute(steps, call, lambda actions: {"actions": actions})

    def log_returns(self, body: dict, call: Call) -> dict:
        """Add a reward, handed to the policy with the session's next action."""
        eid = _eid(body)
        session = self._get(eid)
        reward = check_rewards({DEFAULT_AGENT_ID: field(body, "reward")}, eid)
        field(body, "info", (dict, type(None)), None)
        session.reward = (session.reward or 0.0) + reward[DEFAULT_AGENT_ID]
        return {}

    def end_episode(self, body: dict, call: Call) -> dict:
        """End the session (its last observation is checked, not used)."""
        eid = _eid(body)
        self._get(eid)
        check_obs(self.policy.observation_space, field(body, "obs"), f"episode {eid!r}")
        self._end(eid)
        call.episodes.discard(eid)
        return {}

    def _records_nothing(self, body: dict, call: Call) -> Any:
        raise BadRequest(
            "this server serves a DeployedPolicy, which records nothing and has no runner: "
            "log_action, report, checkpoint and weights (local inference) need a training "
            "server (PolicyServer(runner) or PolicyServer.from_checkpoint(path))"
        )

    # -- inference ------------------------------------------------------------------------
    def _get(self, eid: Any) -> _Session:
        session = self.sessions.get(eid)
        if session is None:
            why = "has ended" if eid in self.ended else "was never started"
            raise UnknownEpisodeError(f"episode {eid!r} {why}; start one with start_episode()")
        session.touched = time.monotonic()
        return session

    def _step(self, eid: Any, obs: Any, reward: Any) -> tuple[Any, Any, _Session, float | None]:
        """A checked (id, observation, session, reward) of one episode's action request."""
        session = self._get(eid)
        if session.busy:
            raise EpisodeError("an episode can ask for one action at a time, not two at once")
        obs = check_obs(self.policy.observation_space, obs, f"episode {eid!r}")
        total = session.reward
        if reward is not None:
            total = (total or 0.0) + check_rewards({DEFAULT_AGENT_ID: reward}, eid)[
                DEFAULT_AGENT_ID
            ]
        return eid, obs, session, total

    def _compute(self, steps: list, call: Call, answer: Callable[[list], dict]) -> Any:
        """The actions of ``steps`` computed in the inference thread, then answered."""
        for _, _, session, _ in steps:
            session.busy, session.reward = True, None
        policy = self.policy

        def run() -> list:
            return [policy.compute_action(o, session=e, reward=r) for e, o, _, r in steps]

        def done(future: concurrent.futures.Future) -> None:
            for _, _, session, _ in steps:
                session.busy = False
                session.touched = time.monotonic()
            error = future.exception()
            if isinstance(error, EnvCheckError):
                error = BadObservationError(str(error))
            call.finish(None if error else answer(future.result()), error)

        future = self.worker.submit(run)
        future.add_done_callback(lambda f: self.loop.call_soon_threadsafe(done, f))
        call.wait_s = self.settings.get_action_timeout_s
        return PENDING

    def _end(self, eid: Any) -> None:
        """End ``eid``'s session (in the inference thread: after its pending action)."""
        self.sessions.pop(eid, None)
        self.ended[eid] = None
        while len(self.ended) > _MAX_IDS:
            self.ended.popitem(last=False)
        if not self._closed:
            self.worker.submit(self.policy.end_session, eid)

    def _forget_ended(self, ids: set) -> None:
        ids.intersection_update(self.sessions)


def _eid(body: dict) -> Any:
    return _checked_eid(field(body, "episode_id", (str, int)))


def _checked_eid(eid: Any) -> Any:
    """``eid`` when it can be an episode's id, else ``EpisodeError`` (409), as a training
    server's episode hub answers."""
    check_episode_id(eid)
    return eid
