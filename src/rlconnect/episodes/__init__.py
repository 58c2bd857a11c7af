"""Episodes: the bookkeeping of every sub-env's running episode.

- ``Episode``: one episode, what callbacks and metrics see;
- ``EpisodeTracker`` (built from ``EpisodeSettings``): opens, advances and ends episodes,
  over one ``EpisodeTable`` of ids, lengths and returns, the ``TrajectoryIds`` and the
  multi-agent ``AgentSlots``; what ends comes back as an ``EpisodeEnds`` record for the
  collectors;
- ``EpisodeHooks``: the episode callbacks with the arguments every call passes;
- ``tensor_episodes``: the same table as tensors, for the tensor path (needs torch),
  with ``finite_marks``, its deferred finite check.
"""

from rlconnect.episodes.agents import AgentSlots
from rlconnect.episodes.ends import ClosingRow, EpisodeEnds
from rlconnect.episodes.episode import Episode
from rlconnect.episodes.hooks import EpisodeHooks
from rlconnect.episodes.table import EpisodeTable, PollRows
from rlconnect.episodes.tracker import MAX_METRICS, EpisodeSettings, EpisodeTracker
from rlconnect.episodes.trajectories import TrajectoryIds

__all__ = [
    "MAX_METRICS",
    "AgentSlots",
    "ClosingRow",
    "Episode",
    "EpisodeEnds",
    "EpisodeHooks",
    "EpisodeSettings",
    "EpisodeTable",
    "EpisodeTracker",
    "PollRows",
    "TrajectoryIds",
]
