"""rlconnect.checkpoints: every rlconnect file format, pickle-free, versioned, atomic.

- ``FileFormat`` and one record per file kind (``rlconnect.checkpoints.formats``):
  pipelines, exported policies, batch files, Parquet files, runner checkpoints, weights;
- ``save_pipeline(pipeline, path)`` / ``load_pipeline(path, ctx)`` / ``load_statistics(path)``
  for connector pipelines (format in ``rlconnect.checkpoints.pipelines``);
- ``save_nest`` / ``load_nest``: the same single-file container for any nest of JSON values
  and numpy arrays, in a given ``FileFormat``;
- ``encode_nest`` / ``decode_nest``: the ``{"__array__": key}`` convention on its own;
- ``atomic_write_bytes(path, data)``: temp file in the same folder, fsync, ``os.replace``;
- runner checkpoints: the folder layout and its verified reads (``runner_format``),
  ``load_checkpoint`` (``runner_load``), ``save_runner_checkpoint`` (``runner_save``) and
  fitting a checkpoint to live policies (``runner_restore``).
"""

from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.container import load_nest, save_nest
from rlconnect.checkpoints.formats import (
    BATCH_FILE,
    PARQUET_FILE,
    PIPELINE_FILE,
    POLICY_FILE,
    RUNNER_CHECKPOINT,
    WEIGHTS_FILE,
    FileFormat,
)
from rlconnect.checkpoints.nest import decode_nest, encode_nest
from rlconnect.checkpoints.pipelines import load_pipeline, load_statistics, save_pipeline
from rlconnect.checkpoints.runner_format import CheckpointNotFoundError
from rlconnect.checkpoints.runner_load import LoadedCheckpoint, PolicyRecord, load_checkpoint
from rlconnect.checkpoints.runner_restore import CheckpointMismatchError

__all__ = [
    "BATCH_FILE",
    "PARQUET_FILE",
    "PIPELINE_FILE",
    "POLICY_FILE",
    "RUNNER_CHECKPOINT",
    "WEIGHTS_FILE",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "FileFormat",
    "LoadedCheckpoint",
    "PolicyRecord",
    "atomic_write_bytes",
    "decode_nest",
    "encode_nest",
    "load_checkpoint",
    "load_nest",
    "load_pipeline",
    "load_statistics",
    "save_nest",
    "save_pipeline",
]
