"""Column roles: which columns of a batch, or of a collector's row store, play which part.

One declaration read by the collectors (building transitions), the frame-stack and
compression code, the offline readers and writers, and the runner. A new column that
belongs to one of these roles is added here, and every user follows.

A collector stores one *row* per observation an agent receives; a transition is two
consecutive rows of one agent trajectory:

- its ``obs``, ``actions`` and the policy's other outputs come from the first row;
- the :data:`NEXT_ROW_COLUMNS` (what the env answered to the action) come from the second;
- the second row's ``obs`` becomes the transition's ``new_obs`` (:data:`NEXT_OBS_OF`), and
  its other policy inputs that a connector adds (``prev_actions``, ``prev_rewards``) become
  ``new_prev_actions`` / ``new_prev_rewards`` (:data:`NEXT_INPUTS_OF`): what the policy is
  fed at the step after the transition, which learner connectors bootstrap from.

>>> import numpy as np
>>> from rlconnect.batches import SampleBatch
>>> b = SampleBatch({"eps_id": [5, 5, 5, 6], "agent_index": [0, 1, 0, 0]})
>>> trajectory_keys(b).tolist() == [5 * 4096, 5 * 4096 + 1, 5 * 4096, 6 * 4096]
True
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from rlconnect.batches.sample_batch import SampleBatch

__all__ = [
    "EMPTY_INFO",
    "IMAGE_COLUMNS",
    "NEXT_INPUTS_OF",
    "NEXT_OBS_OF",
    "NEXT_ROW_COLUMNS",
    "OBSERVATION_COLUMNS",
    "ROW_ID_COLUMNS",
    "STORE_COLUMNS",
    "STORE_LAST",
    "STORE_POLL",
    "STORE_TRAJ",
    "trajectory_keys",
]

OBS, NEXT_OBS, RAW_OBS = SampleBatch.OBS, SampleBatch.NEXT_OBS, SampleBatch.RAW_OBS

NEXT_ROW_COLUMNS: tuple[str, ...] = (
    SampleBatch.REWARDS,
    SampleBatch.TERMINATEDS,
    SampleBatch.TRUNCATEDS,
    SampleBatch.INFOS,
)
"""Columns a transition takes from the row that followed its observation."""


class _EmptyInfo(dict):
    """The type of ``EMPTY_INFO``: an empty dict that refuses changes, and that pickles
    and copies as the one shared instance (batches holding it pickle, deep-copy and cross
    processes like any other)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "EMPTY_INFO is the info of every row whose env gave an empty one and cannot be "
            "changed; make a dict of your own (dict(info)) to change it"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = setdefault = pop = popitem = clear = _refuse

    def __reduce__(self) -> str:
        return "EMPTY_INFO"  # pickled as a reference to this module's global

    def __copy__(self) -> _EmptyInfo:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _EmptyInfo:
        return self


EMPTY_INFO: Mapping[str, Any] = _EmptyInfo()
"""The ``infos`` entry of every row whose env gave an empty info dict: one shared empty
dict that cannot be changed, not a dict per row (the env adapters and the runner make it
so)."""


NEXT_OBS_OF: Mapping[str, str] = MappingProxyType({OBS: NEXT_OBS})
"""Column of the following row -> the transition column that holds it (``new_obs[t] ==
obs[t + 1]`` within a trajectory)."""

NEXT_INPUTS_OF: Mapping[str, str] = MappingProxyType(
    {
        SampleBatch.PREV_ACTIONS: "new_prev_actions",
        SampleBatch.PREV_REWARDS: "new_prev_rewards",
    }
)
"""Policy inputs (besides ``obs`` and the recurrent state) of the following row -> the
transition column that holds them: ``new_prev_rewards[t] == prev_rewards[t + 1]``, exactly
what the policy was, or will be, fed at that step (for a trajectory cut at the end of a
batch: the first row of the next one). Not ``rewards[t]``: a connector after
``PrevActionsRewards`` (``ClipReward``) changes the recorded reward, not what the policy
saw."""

OBSERVATION_COLUMNS: tuple[str, ...] = (OBS, NEXT_OBS, RAW_OBS)
"""Columns that hold observations: ``obs`` and ``new_obs`` what the agent pipeline output,
``raw_obs`` what the env gave. Readers of offline files check them against the recorded
observation spaces."""

IMAGE_COLUMNS: tuple[str, ...] = OBSERVATION_COLUMNS
"""Columns that may hold images (at least 2 dims per row): frame-shared and, with
``compress_observations``, LZ4-compressed in built batches and output files."""

ROW_ID_COLUMNS: tuple[str, ...] = (
    SampleBatch.EPS_ID,
    SampleBatch.ENV_ID,
    SampleBatch.AGENT_INDEX,
    SampleBatch.T,
)
"""Where a row comes from: its episode, sub-env, agent (index within the episode) and env
step. Every batch the runner builds has them."""

STORE_TRAJ, STORE_POLL, STORE_LAST = "_traj", "_poll", "_last"
"""A collector's row-store bookkeeping: the row's trajectory id, the poll that produced it,
and whether it closes its trajectory."""

STORE_COLUMNS: tuple[str, ...] = (STORE_TRAJ, STORE_POLL, STORE_LAST)
"""Columns only a collector's row store has; they never enter a built batch."""

_AGENTS_PER_EPISODE = 4096  # agent_index < 4096 keeps keys of different episodes apart


def trajectory_keys(batch: SampleBatch) -> np.ndarray:
    """One int64 per row, equal exactly for the rows of one agent trajectory: the
    ``eps_id``, combined with ``agent_index`` when the batch has it."""
    key = np.asarray(batch[SampleBatch.EPS_ID]).astype(np.int64)
    if SampleBatch.AGENT_INDEX in batch:
        key = key * _AGENTS_PER_EPISODE + np.asarray(batch[SampleBatch.AGENT_INDEX]).astype(
            np.int64
        )
    return key
