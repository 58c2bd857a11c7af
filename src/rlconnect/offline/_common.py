"""Names of the Parquet format that need no pyarrow: constants, file names, the error."""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

from rlconnect.errors import CheckpointError

__all__ = [
    "AGENT_ID_COLUMN",
    "METADATA_KEY",
    "PARQUET_FILE_RE",
    "POLICY_ID_COLUMN",
    "RESERVED_COLUMNS",
    "Malformed",
    "OfflineDataError",
    "expect",
    "import_parquet_module",
    "name_value_pairs",
    "parquet_file_name",
]

PYARROW_INSTALL = "pip install 'rlconnect[offline]'"

METADATA_KEY = "rlconnect"
POLICY_ID_COLUMN = "policy_id"
AGENT_ID_COLUMN = "agent_id"
RESERVED_COLUMNS = frozenset({POLICY_ID_COLUMN, AGENT_ID_COLUMN})
PARQUET_FILE_RE = re.compile(r"^part-(\d{3,})-(\d{6,})\.parquet$")


def parquet_file_name(worker_index: int, number: int) -> str:
    """``part-000-000042.parquet`` for worker 0, file 42."""
    return f"part-{int(worker_index):03d}-{int(number):06d}.parquet"


class OfflineDataError(CheckpointError):
    """An offline data file cannot be read; names the file, the row group and the defect.

    Attributes ``path``, ``row_group`` (None when the defect is not in one row group) and
    ``problem`` hold the parts of the message.
    """

    def __init__(self, path: str, problem: str, row_group: int | None = None) -> None:
        self.path, self.problem, self.row_group = path, problem, row_group
        where = "" if row_group is None else f", row group {row_group}"
        super().__init__(f"cannot read offline data file {path!r}{where}: {problem}")


class Malformed(Exception):
    """What a file holds contradicts its own metadata or format; the reader turns it into
    an error naming the file (``OfflineDataError`` for Parquet, ``CheckpointError`` for
    ``.rlb`` batch files)."""


def expect(cond: bool, msg: str) -> None:
    """Raise ``Malformed(msg)`` unless ``cond``: the readers' one way to refuse a file."""
    if not cond:
        raise Malformed(msg)


def name_value_pairs(value: Any, where: str, *, unique: bool = False) -> list[tuple[str, Any]]:
    """A JSON list of ``[name, value]`` pairs as tuples (``unique``: no name twice)."""
    expect(isinstance(value, list), f"{where} is not a list")
    out = []
    for i, item in enumerate(value):
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
        expect(ok, f"{where}[{i}] is not a [name, value] pair")
        out.append((item[0], item[1]))
    if unique:
        names = [k for k, _ in out]
        expect(len(set(names)) == len(names), f"{where} repeats a name")
    return out


def import_parquet_module(name: str, what: str) -> ModuleType:
    """Import one of the Parquet modules; without pyarrow, an ImportError that names the
    ``offline`` extra and the pip command (``what`` says what needed it)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if (getattr(exc, "name", None) or "").partition(".")[0] != "pyarrow":
            raise
        raise ImportError(
            f"{what} needs pyarrow, the offline extra: {PYARROW_INSTALL}", name="pyarrow"
        ) from None
