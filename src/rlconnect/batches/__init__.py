"""Column batches of experience: `SampleBatch`, `MultiAgentBatch` and `concat_samples`.

A `SampleBatch` maps column names to columns. A column is a numpy array whose first axis
is the row axis, or a nest (dicts and tuples) of such arrays for structured spaces; every
leaf has the same number of rows. Row operations (slicing, `take`, concatenation, splitting
by episode) act on all leaves at once with numpy, never row by row in Python.

>>> import numpy as np
>>> b = SampleBatch({"obs": np.zeros((4, 2), np.float32), "eps_id": [7, 7, 9, 9]})
>>> len(b), len(b[1:3])
(4, 2)
>>> [len(e) for e in b.split_by_episode()]
[2, 2]
>>> len(concat_samples([b, b]))
8
"""

from __future__ import annotations

from rlconnect.batches.multi_agent import MultiAgentBatch, batches_equal, concat_samples
from rlconnect.batches.sample_batch import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID, SampleBatch
from rlconnect.batches.sample_batch import Column as Column
from rlconnect.batches.sequences import SequenceBatch, chop_into_sequences

__all__ = [
    "DEFAULT_AGENT_ID",
    "DEFAULT_POLICY_ID",
    "MultiAgentBatch",
    "SampleBatch",
    "SequenceBatch",
    "batches_equal",
    "chop_into_sequences",
    "concat_samples",
]
