"""The runner side of an ``ExternalEnv``: the BaseEnv adapter, its rows, logged actions.

``ExternalEnvAdapter`` is the BaseEnv face: each running episode holds one *lane* (a
sub-env id, ``0 .. max_concurrent - 1``); ``poll()`` hands out at most one queued event per
lane, so every lane is a sequence of episodes exactly like a stepped sub-env. The rows it
returns are ``ExternalRows``, carrying the actions logged with ``log_action``, which the
runner's step kernel puts in place of the policy's with ``apply_logged_actions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import tree

from rlconnect.envs.base import BaseEnv, EnvRows, ServedInference
from rlconnect.envs.external.hub import NO_ACTION, EpisodeHub, _Event
from rlconnect.envs.rows import EnvRowsBuilder, ExternalRows
from rlconnect.errors import EnvError

__all__ = ["ExternalEnvAdapter", "apply_logged_actions"]


class _NoInference:
    """The inference of an adapter no runner drives: served episodes cannot be answered."""

    def compute_actions(
        self, obs_by_agent: Mapping[Any, Any], *, explore: bool, env_id: int
    ) -> dict[Any, Any]:
        raise EnvError(
            "no runner drives this ExternalEnv: build an rc.EnvRunner on it to serve "
            "episodes started with training_enabled=False"
        )

    def reset(self, env_id: int) -> None:
        """Nothing is kept without a runner."""


def _unstack(actions: Any, n: int) -> list[Any]:
    if isinstance(actions, list):
        return actions
    return [tree.map_structure(lambda a, i=i: a[i], actions) for i in range(n)]


class ExternalEnvAdapter(BaseEnv):
    """The BaseEnv face of an ExternalEnv: one lane (sub-env id) per running episode.

    Counts as one env when the runner sizes batches (``fragment_envs``); a
    ``truncate_episodes`` batch holds ``rollout_fragment_length`` steps over all lanes.
    """

    fragment_envs = 1
    poll_timeout_s = 1.0

    def __init__(self, external: Any, *, multi_agent: bool = False) -> None:
        self.external = external
        self.hub: EpisodeHub = external.hub
        self.num_envs = self.hub.max_concurrent
        self.is_multi_agent = multi_agent
        self.possible_agents = tuple(getattr(external, "possible_agents", ()) or ())
        self._awaiting: dict[int, tuple[_Event, dict]] = {}
        self._inference: ServedInference = _NoInference()

    def observation_space(self, agent_id: Any) -> gym.Space:
        """The observation space of ``agent_id`` (the external env's, by agent)."""
        return self.external.agent_observation_space(agent_id)

    def action_space(self, agent_id: Any) -> gym.Space:
        """The action space of ``agent_id`` (the external env's, by agent)."""
        return self.external.agent_action_space(agent_id)

    def attach_inference(self, inference: ServedInference) -> None:
        """What serves the episodes that are not recorded: the runner's inference."""
        self._inference = inference

    def _check_thread(self) -> None:
        ext = self.external
        ext.launch()
        if ext.error is not None:
            raise EnvError(f"the ExternalEnv thread raised {ext.error!r}") from ext.error
        if self.hub.closed and not self.hub.has_events:
            raise EnvError("the ExternalEnv was closed: no more episodes will come")
        if not ext.is_alive() and not self.hub.running and not self.hub.has_events:
            raise EnvError("the ExternalEnv thread's run() returned: no more episodes will come")

    def poll(self) -> EnvRows:
        """One batch: at most one event per lane, after the work queued with it (served
        inference, a server's checkpoints) ran here, between two steps."""
        self._check_thread()
        events, tasks = self.hub.take_batch(self.poll_timeout_s, self.external.is_alive)
        for fn, reply in tasks:
            try:
                reply.value = fn(self._inference)
            except Exception as exc:  # handed to the waiting simulator call
                reply.error = exc
        self.hub.complete([reply for _, reply in tasks])
        return self._rows(events)

    def _rows(self, events: list[_Event]) -> ExternalRows:
        rows = EnvRowsBuilder()
        logged: dict[tuple[int, Any], Any] = {}
        for ev in events:
            lane = ev.ep.lane
            te, tr = {"obs": (False, False), "end": (True, False), "timeout": (False, True)}[
                ev.kind
            ]
            if not ev.first:
                rows.mark_stepped(lane)
            if ev.kind != "obs":
                rows.end_episode(lane, te, tr)
            for a, o in ev.obs.items():
                info = dict(ev.infos.get(a, {}))
                if ev.kind == "timeout":
                    info["episode_timeout"] = True
                rows.add_row(lane, a, o, ev.rewards.get(a, 0.0), te, tr, info, first=ev.first)
                if ev.logged is not NO_ACTION:
                    logged[(lane, a)] = ev.logged[a]
            if not ev.first:
                for a, r in ev.rewards.items():
                    if a not in ev.obs:
                        rows.add_extra_reward(lane, a, r)
            if ev.kind == "obs":
                self._awaiting[lane] = (ev, {})
        return rows.build(logged_actions=logged)

    def send_actions(self, env_ids: np.ndarray, agent_ids: tuple, actions: Any) -> None:
        """Gather each lane's actions; an event whose agents all have one is answered."""
        answered = []
        for lane, agent, act in zip(env_ids.tolist(), agent_ids, _unstack(actions, len(env_ids))):
            pending = self._awaiting.get(lane)
            if pending is None:
                continue
            ev, got = pending
            got[agent] = act
            if len(got) == len(ev.obs):
                del self._awaiting[lane]
                answered.append((ev, got))
        self.hub.answer(answered)

    def try_reset(self, env_id: int, *, seed: int | None = None) -> None:
        """Nothing to do: the lane's next episode starts when its simulator says so."""
        self._awaiting.pop(env_id, None)

    def close(self) -> None:
        """Close the hub: waiting callers get an error instead of blocking."""
        self.hub.close()


def apply_logged_actions(
    policy: Any,
    logged: dict[tuple[int, Any], Any],
    env_ids: np.ndarray,
    agent_ids: tuple,
    actions: Any,
    fetches: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """Replace the policy's actions by logged ones; ``action_logp`` becomes their log-prob.

    Rows without a logged action keep the policy's output. When the policy cannot score an
    action (no distribution), a logged row's ``action_logp`` is NaN.
    """
    rows = [i for i, k in enumerate(zip(env_ids.tolist(), agent_ids)) if k in logged]
    if not rows:
        return actions, fetches
    leaves = [np.array(x, copy=True) for x in tree.flatten(actions)]
    for i in rows:
        given = tree.flatten(logged[(int(env_ids[i]), agent_ids[i])])
        for leaf, val in zip(leaves, given):
            leaf[i] = np.asarray(val, dtype=leaf.dtype)
    actions = tree.unflatten_as(actions, leaves)
    fetches = dict(fetches)
    if "action_logp" in fetches:
        logp = np.array(fetches["action_logp"], copy=True)
        logp[rows] = _logp(policy, fetches, actions, np.asarray(rows))
        fetches["action_logp"] = logp
    return actions, fetches


def _logp(policy: Any, fetches: dict[str, Any], actions: Any, rows: np.ndarray) -> np.ndarray:
    dist, inputs = getattr(policy, "dist", None), fetches.get("action_dist_inputs")
    if dist is None or inputs is None or not isinstance(actions, np.ndarray):
        return np.full(len(rows), np.nan, dtype=np.float32)
    import torch

    with torch.inference_mode():
        out = dist.logp_torch(
            torch.as_tensor(np.asarray(inputs)[rows], dtype=torch.float32),
            torch.as_tensor(actions[rows]),
        )
    return out.numpy().astype(np.float32)
