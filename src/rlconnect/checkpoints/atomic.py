"""Atomic file writes: a crash mid-write leaves the previous file intact and no temp file.

The bytes go to a fresh temp file in the target's directory (same filesystem, so the final
rename is atomic), are flushed and fsynced, and ``os.replace`` moves them onto the target.
On any error, including ``KeyboardInterrupt``, the temp file is removed and the error
re-raised.
"""

from __future__ import annotations

import contextlib
import os
import uuid

__all__ = ["atomic_write_bytes"]

_CHUNK = 1 << 24


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to exactly ``path``, atomically (all of it or nothing)."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(directory, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    # O_EXCL: never reuse or follow an existing name; mode 0o666 lets the umask apply.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        try:
            _write_fully(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _write_fully(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view[:_CHUNK])
        view = view[written:]


def _fsync_directory(directory: str) -> None:
    """Make the rename itself durable where the OS allows it (POSIX); best effort."""
    if os.name != "posix":
        return
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
