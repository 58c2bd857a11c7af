"""Every rlconnect file format, as one record: its name and the version it writes.

A file says what it is in two header entries, ``format`` (the name) and ``format_version``
(the version): in a runner checkpoint's ``manifest.json`` the version is a JSON integer,
in the header of a single-file container (``rlconnect.checkpoints.container``; pipelines,
policy files, batch files, weights) a decimal string, as safetensors metadata holds
strings only; a Parquet file's metadata document names it ``version``.
``FileFormat.header`` writes the two entries and ``FileFormat.check`` reads them back;
nothing else spells those keys.

    >>> PIPELINE_FILE.header()
    {'format': 'rlconnect.pipeline', 'format_version': 1}
    >>> PIPELINE_FILE.check({"format": "rlconnect.pipeline", "format_version": "1"},
    ...                     where="'p'", text=True)
    1
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from rlconnect.errors import CheckpointError

__all__ = [
    "BATCH_FILE",
    "FORMAT_KEY",
    "PARQUET_FILE",
    "PIPELINE_FILE",
    "POLICY_FILE",
    "RUNNER_CHECKPOINT",
    "VERSION_KEY",
    "WEIGHTS_FILE",
    "FileFormat",
]

FORMAT_KEY = "format"
"""The header entry naming a file's format."""
VERSION_KEY = "format_version"
"""The header entry holding a file's format version."""

_MAX_VERSION_DIGITS = 9


def _readable_default(self: FileFormat) -> frozenset[int]:
    return frozenset({self.version})


@attrs.frozen
class FileFormat:
    """A file format: its ``name``, the ``version`` written, the versions ``readable``
    (by default the written one only), and the header entry holding the version."""

    name: str
    version: int
    readable: frozenset[int] = attrs.field(
        default=attrs.Factory(_readable_default, takes_self=True), converter=frozenset
    )
    version_key: str = VERSION_KEY

    def header(self, *, text: bool = False) -> dict[str, Any]:
        """The two header entries of a file in this format (the version as a decimal
        string with ``text=True``, for a safetensors header)."""
        return {
            FORMAT_KEY: self.name,
            self.version_key: str(self.version) if text else self.version,
        }

    def check(
        self,
        header: Mapping[str, Any],
        *,
        where: str,
        text: bool = False,
        fail: Callable[[str], Exception] | None = None,
    ) -> int:
        """The format version ``header`` declares, once it names this format and a version
        it reads; else ``fail(message)`` (default: ``CheckpointError`` naming ``where``),
        the message naming the format and version found and the ones supported.

        ``text``: the version is a decimal string (a safetensors header), else a JSON
        integer (a manifest)."""
        fail = fail or (lambda msg: CheckpointError(f"cannot load {where}: {msg}"))
        found = header.get(FORMAT_KEY)
        if found != self.name:
            raise fail(f"its format is {_short(found)}, expected {self.name!r}")
        raw = header.get(self.version_key)
        supported = f"supported versions: {self.supported()}"
        if text and isinstance(raw, str) and raw.isdecimal() and len(raw) <= _MAX_VERSION_DIGITS:
            version = int(raw)
        elif not text and type(raw) is int:
            version = raw
        else:
            raise fail(f"malformed {self.name} format version {_short(raw)}; {supported}")
        if version not in self.readable:
            newer = "; a newer rlconnect wrote it: upgrade to read it" * (version > self.version)
            raise fail(f"{self.name} format version {version} is not supported; {supported}{newer}")
        return version

    def supported(self) -> str:
        """The readable versions, for messages: ``"1, 2"``."""
        return ", ".join(str(v) for v in sorted(self.readable))


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


PIPELINE_FILE = FileFormat("rlconnect.pipeline", 1)
"""A saved connector pipeline (``save_pipeline``), alone or inside a runner checkpoint."""
POLICY_FILE = FileFormat("rlconnect.policy", 1)
"""An exported policy (``export_policy``)."""
BATCH_FILE = FileFormat("rlconnect.batch", 1)
"""A file of sample batches (``BatchWriter``, ``.rlb``)."""
RUNNER_CHECKPOINT = FileFormat("rlconnect.runner_checkpoint", 1)
"""A runner checkpoint folder's ``manifest.json``."""
WEIGHTS_FILE = FileFormat("rlconnect.weights", 1)
"""A policy's weights inside a runner checkpoint."""
PARQUET_FILE = FileFormat("rlconnect.parquet", 1, version_key="version")
"""A Parquet file of sample batches (``ParquetBatchWriter``): its ``rlconnect`` metadata."""
