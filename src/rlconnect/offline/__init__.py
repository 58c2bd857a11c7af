"""rlconnect.offline: experience written to disk, read back, mixed in, evaluated off-policy.

- ``ParquetBatchWriter(dir)``: batches to Apache Parquet files (format
  ``"rlconnect.parquet"``, schema in ``rlconnect.offline.parquet_writer``), rolled at a
  size limit; ``RunnerConfig(output=DIR)`` uses it while sampling;
- ``BatchWriter(dir)`` / ``write_batches(batches, dir)``: one pickle-free ``.rlb`` file per
  batch (format ``"rlconnect.batch"``, described in ``rlconnect.offline.batch_files``);
- ``read_batches(path_or_dir_or_glob, batch_size=None, on_bad_file="fail")``: the batches
  back from either format, in the order written (``rlconnect.offline.reader``);
- ``OfflineConfig``: a runner's offline settings, ``RunnerConfig(offline=OfflineConfig(...))``
  (or ``RunnerConfig(output=DIR)``, ``RunnerConfig(input=...)``: offline data as the
  runner's input; ``rlconnect.offline.runner_io``);
- ``estimate_off_policy(batches, target)``: importance sampling and weighted importance
  sampling estimates of a target policy's value (``rlconnect.offline.estimators``).

Parquet support needs pyarrow (``pip install 'rlconnect[offline]'``); the ``.rlb`` format
does not.
"""

from typing import Any

from rlconnect.offline._common import OfflineDataError
from rlconnect.offline.batch_files import (
    BatchWriter,
    read_batch_file,
    write_batches,
)
from rlconnect.offline.config import OfflineConfig
from rlconnect.offline.estimators import (
    ImportanceSampling,
    WeightedImportanceSampling,
    estimate_off_policy,
)
from rlconnect.offline.reader import (
    BadFileWarning,
    BatchReader,
    list_batch_files,
    read_batches,
    summarize_batches,
)


def __getattr__(name: str) -> Any:
    """``ParquetBatchWriter``, imported on first use (pyarrow is an optional extra)."""
    if name == "ParquetBatchWriter":
        from rlconnect.offline._common import import_parquet_module

        module = import_parquet_module("rlconnect.offline.parquet_writer", "ParquetBatchWriter")
        return module.ParquetBatchWriter
    raise AttributeError(f"module 'rlconnect.offline' has no attribute {name!r}")


__all__ = [
    "BadFileWarning",
    "BatchReader",
    "BatchWriter",
    "ImportanceSampling",
    "OfflineConfig",
    "OfflineDataError",
    "ParquetBatchWriter",
    "WeightedImportanceSampling",
    "estimate_off_policy",
    "list_batch_files",
    "read_batch_file",
    "read_batches",
    "summarize_batches",
    "write_batches",
]
