"""rlconnect.offline: experience written to disk and read back.

- ``BatchWriter(dir)`` / ``write_batches(batches, dir)``: one pickle-free file per batch
  (format ``"rlconnect.batch"``, described in ``rlconnect.offline.batch_files``);
- ``read_batches(path_or_dir_or_glob)``: the batches back, in the order written.
"""

from rlconnect.offline.batch_files import (
    BATCH_FORMAT,
    BATCH_FORMAT_VERSION,
    BATCH_FORMAT_VERSIONS,
    BatchWriter,
    list_batch_files,
    read_batch_file,
    read_batches,
    summarize_batches,
    write_batches,
)

__all__ = [
    "BATCH_FORMAT",
    "BATCH_FORMAT_VERSION",
    "BATCH_FORMAT_VERSIONS",
    "BatchWriter",
    "list_batch_files",
    "read_batch_file",
    "read_batches",
    "summarize_batches",
    "write_batches",
]
