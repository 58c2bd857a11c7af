"""External simulators that ask for actions, adapted to the BaseEnv the runner drives.

A simulator that cannot be stepped (a game server, a robot, a web service) runs in an
``ExternalEnv`` thread and calls, per episode::

    eid = self.start_episode()
    action = self.get_action(eid, obs)        # on-policy: the runner's policy decides
    self.log_returns(eid, reward)            # summed until the next action
    self.log_action(eid, obs, action)        # off-policy: the logged action is recorded
    self.end_episode(eid, obs)               # the last transition is terminated

``ExternalEnvAdapter`` is the BaseEnv face: each running episode holds one *lane* (a
sub-env id, ``0 .. max_concurrent - 1``); ``poll()`` hands out at most one queued event per
lane, so every lane is a sequence of episodes exactly like a stepped sub-env.

Every call is checked by the episode hub (``hub``), whichever side makes it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from rlconnect.batches import DEFAULT_AGENT_ID
from rlconnect.envs.external.hub import NO_ACTION, EpisodeHub
from rlconnect.envs.external.limits import HubLimits

__all__ = ["ExternalEnv"]


class ExternalEnv(threading.Thread):
    """A simulator that asks for actions; override ``run()`` (see the module doc).

    The runner starts the thread (a daemon) at its first poll. Episodes started with
    ``training_enabled=False`` are served by the runner's policies in eval mode (between
    sampling steps) but make no rows and no metrics.

    Args:
        action_space, observation_space: the spaces of the (single) agent.
        max_concurrent: episodes that may run at once; ``start_episode`` beyond it raises
            ``TooManyEpisodesError``.
        get_action_timeout_s: how long ``get_action`` waits for the runner.
        episode_timeout_s: an episode without calls for this long is closed as truncated
            (its last transition repeats the last observation; ``infos`` say
            ``episode_timeout``); None keeps episodes open forever.
    """

    _ids = itertools.count()

    def __init__(
        self,
        action_space: gym.Space,
        observation_space: gym.Space,
        max_concurrent: int = 100,
        *,
        get_action_timeout_s: float = 300.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"ExternalEnv-{next(self._ids)}")
        self.action_space = action_space
        self.observation_space = observation_space
        self.max_concurrent = max_concurrent
        limits = HubLimits(
            get_action_timeout_s=get_action_timeout_s, episode_timeout_s=episode_timeout_s
        )
        self._hub = EpisodeHub(
            self.agent_observation_space, max_concurrent, self.agent_action_space, limits
        )
        self._launched = False
        self._error: BaseException | None = None
        user_run = self.run
        self.run = lambda: self._guarded(user_run)  # type: ignore[method-assign]

    def _guarded(self, run: Callable[[], Any]) -> None:
        try:
            run()
        except BaseException as exc:  # reported by the runner's next poll
            self._error = exc
            self._hub.wake()

    @property
    def hub(self) -> EpisodeHub:
        """The episodes in flight between ``run()`` and the runner (what a server answers
        requests from)."""
        return self._hub

    def launch(self) -> None:
        """Start ``run()`` in this thread, once (the runner's first poll does)."""
        if not self._launched:
            self._launched = True
            self.start()

    @property
    def error(self) -> BaseException | None:
        """What ``run()`` raised, or None while it runs (or returned)."""
        return self._error

    def run(self) -> None:
        """Drive the simulator: override this."""
        raise NotImplementedError("override ExternalEnv.run() to drive your simulator")

    # spaces by agent id, for the adapter
    def agent_observation_space(self, agent_id: Any) -> gym.Space:
        """Every agent of a single-agent external env sees ``observation_space``."""
        return self.observation_space

    def agent_action_space(self, agent_id: Any) -> gym.Space:
        """Every agent of a single-agent external env acts in ``action_space``."""
        return self.action_space

    @property
    def timed_out_episodes(self) -> list[Any]:
        """Ids of episodes closed because they had no call for ``episode_timeout_s`` (the
        latest 100 000)."""
        return self._hub.timed_out_ids()

    @property
    def num_running_episodes(self) -> int:
        """Episodes started and not yet ended."""
        return self._hub.running

    def start_episode(self, episode_id: Any = None, training_enabled: bool = True) -> Any:
        """Start an episode; returns its id (a new uuid hex string when None is given)."""
        return self._hub.start(episode_id, bool(training_enabled))

    def get_action(self, episode_id: Any, observation: Any) -> Any:
        """Record ``observation`` and return the policy's action for it (blocks)."""
        reply = self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, NO_ACTION)
        assert reply is not None  # asking for an action always gets a reply
        got = reply.wait(self._hub.limits.get_action_timeout_s, f"episode {episode_id!r}")
        return got[DEFAULT_AGENT_ID]

    def log_action(self, episode_id: Any, observation: Any, action: Any) -> None:
        """Record ``observation`` and the ``action`` taken by someone else (off-policy)."""
        self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, {DEFAULT_AGENT_ID: action})

    def log_returns(self, episode_id: Any, reward: float, info: dict | None = None) -> None:
        """Add ``reward`` to the current step (summed until the next action)."""
        self._hub.add_returns(
            episode_id,
            {DEFAULT_AGENT_ID: reward},
            None if info is None else {DEFAULT_AGENT_ID: info},
        )

    def end_episode(self, episode_id: Any, observation: Any) -> None:
        """End the episode: ``observation`` is the last one, the transition is terminated."""
        self._hub.observe(episode_id, {DEFAULT_AGENT_ID: observation}, NO_ACTION, kind="end")
