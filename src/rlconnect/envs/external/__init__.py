"""External simulators that ask for actions: the one public face of the external env.

A simulator that cannot be stepped runs in an ``ExternalEnv`` (or
``ExternalMultiAgentEnv``) thread; a policy server feeds one from its requests. Everything
the rest of the package (the runner, envs/, serve/) uses of it is imported from here; the
modules inside are its parts:

- ``env`` and ``multi_agent``: ``ExternalEnv`` and ``ExternalMultiAgentEnv``, the user side;
- ``hub``: ``EpisodeHub``, the episodes shared by both sides behind one lock, where every
  call (an env's thread, a served request) is checked, once (``checks``: the episode
  errors and the checks); ``lanes``, ``limits`` (``HubLimits``) and ``replies``
  (``Reply``: how an answer comes back) are its parts;
- ``adapter``: the runner side, ``ExternalEnvAdapter`` (the BaseEnv face) and
  ``apply_logged_actions``.
"""

from rlconnect.envs.external.adapter import ExternalEnvAdapter, apply_logged_actions
from rlconnect.envs.external.checks import (
    BadActionError,
    BadObservationError,
    BadRewardError,
    EpisodeError,
    QueueFullError,
    TooManyEpisodesError,
    UnknownEpisodeError,
    check_episode_id,
    check_obs,
    check_rewards,
)
from rlconnect.envs.external.env import ExternalEnv
from rlconnect.envs.external.hub import NO_ACTION, EpisodeHub
from rlconnect.envs.external.limits import HubLimits
from rlconnect.envs.external.multi_agent import ExternalMultiAgentEnv
from rlconnect.envs.external.replies import Reply, notify_each

__all__ = [
    "NO_ACTION",
    "BadActionError",
    "BadObservationError",
    "BadRewardError",
    "EpisodeError",
    "EpisodeHub",
    "ExternalEnv",
    "ExternalEnvAdapter",
    "ExternalMultiAgentEnv",
    "HubLimits",
    "QueueFullError",
    "Reply",
    "TooManyEpisodesError",
    "UnknownEpisodeError",
    "apply_logged_actions",
    "check_episode_id",
    "check_obs",
    "check_rewards",
    "notify_each",
]
