"""rlconnect.checkpoints: pickle-free, versioned, atomic saving of pipelines and nests.

- ``save_pipeline(pipeline, path)`` / ``load_pipeline(path, ctx)`` / ``load_statistics(path)``
  for connector pipelines (format in ``rlconnect.checkpoints.pipelines``);
- ``save_nest`` / ``load_nest``: the same single-file container for any nest of JSON values
  and numpy arrays, under a caller-chosen format name and version (runner checkpoints);
- ``encode_nest`` / ``decode_nest``: the ``{"__array__": key}`` convention on its own;
- ``atomic_write_bytes(path, data)``: temp file in the same folder, fsync, ``os.replace``.
"""

from rlconnect.checkpoints.atomic import atomic_write_bytes
from rlconnect.checkpoints.container import load_nest, save_nest
from rlconnect.checkpoints.nest import decode_nest, encode_nest
from rlconnect.checkpoints.pipelines import (
    PIPELINE_FORMAT,
    PIPELINE_FORMAT_VERSIONS,
    load_pipeline,
    load_statistics,
    save_pipeline,
)

__all__ = [
    "PIPELINE_FORMAT",
    "PIPELINE_FORMAT_VERSIONS",
    "atomic_write_bytes",
    "decode_nest",
    "encode_nest",
    "load_nest",
    "load_pipeline",
    "load_statistics",
    "save_nest",
    "save_pipeline",
]
