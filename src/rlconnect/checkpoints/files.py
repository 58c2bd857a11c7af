"""Reading a file that came from elsewhere: a regular file only, and never more than a limit.

A path handed to a loader may name anything: a folder, a FIFO whose reader blocks until
someone writes, a character device or a symlink to one (``/dev/zero`` never ends), or a
sparse file of a terabyte. ``read_regular_file`` opens the path without blocking, checks on
the open descriptor (so the name cannot be swapped between the check and the read) that it
is a regular file of at most ``max_bytes``, and reads at most that many bytes. Anything
else is the caller's ``CheckpointError`` (or its own error type), raised before a byte is
read; a missing file stays ``FileNotFoundError`` and an unreadable one ``PermissionError``.

``read_folder`` / ``write_folder`` carry a whole checkpoint folder as ``{relative path:
bytes}`` (to a Ray actor, or over the policy server's ``checkpoint`` endpoint), reading each
file the same bounded way and writing nothing outside the target folder.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping

from rlconnect.errors import CheckpointError

__all__ = [
    "MAX_FILE_BYTES",
    "open_regular_file",
    "read_folder",
    "read_regular_file",
    "write_folder",
]

MAX_FILE_BYTES = 1 << 32
"""The default size limit of a file a loader reads whole (4 GiB): larger is refused unread."""

Fail = Callable[[str], Exception]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def _default_fail(path: str) -> Fail:
    return lambda msg: CheckpointError(f"cannot load {path!r}: {msg}")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


@contextlib.contextmanager
def open_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, fail: Fail | None = None
) -> Iterator[tuple[int, int]]:
    """``(descriptor, size)`` of the regular file at ``path`` (symlinks followed), open for
    reading while the block runs; ``fail(message)`` is raised for anything else (a folder,
    a FIFO, a device, a socket) and for a file over ``max_bytes``."""
    source = os.fspath(path)
    fail = fail or _default_fail(source)
    try:
        fd = os.open(source, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError:  # a socket cannot be opened, nor a folder on Windows: say what it is
        try:
            mode = os.stat(source).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise fail(f"it is {_kind(mode)}, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise fail(f"it is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise fail(f"it holds {st.st_size:,} bytes, more than the limit of {max_bytes:,}")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        yield fd, st.st_size
    finally:
        os.close(fd)


def read_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES, fail: Fail | None = None
) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them (see the
    module docstring); ``fail(message)`` is raised otherwise, and for a file that grew
    while being read. Memory: the file's size, allocated once."""
    fail = fail or _default_fail(os.fspath(path))
    with (
        open_regular_file(path, max_bytes=max_bytes, fail=fail) as (fd, size),
        os.fdopen(fd, "rb", closefd=False) as f,
    ):
        data = f.read(size + 1)  # one byte more than it holds: a file that grew shows
    if len(data) > size:
        raise fail("it grew while being read (is something still writing it?)")
    return data


def read_folder(
    path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES
) -> dict[str, bytes]:
    """The regular files under ``path`` by '/'-separated relative path (symlinks and other
    kinds skipped), each read by ``read_regular_file``: a file over ``max_bytes`` raises
    ``CheckpointError`` naming it, its size and the limit, before it is read."""
    root = os.fspath(path)
    out: dict[str, bytes] = {}
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
        for name in sorted(files):
            full = os.path.join(base, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            out[rel] = read_regular_file(full, max_bytes=max_bytes)
    return out


def write_folder(files: Mapping[str, bytes], root: str | os.PathLike[str]) -> None:
    """Write what ``read_folder`` returned under ``root``; a path that would land outside
    it, or an entry that is not ``str -> bytes``, raises ``ValueError`` (the files may come
    from another machine)."""
    real_root = os.path.realpath(root)
    for rel, data in files.items():
        if not isinstance(rel, str) or not isinstance(data, bytes):
            raise ValueError(
                f"checkpoint file {rel!r}: expected a str path and bytes, "
                f"got {type(rel).__name__} -> {type(data).__name__}"
            )
        full = os.path.realpath(os.path.join(real_root, *rel.split("/")))
        if os.path.commonpath([full, real_root]) != real_root or full == real_root:
            raise ValueError(f"checkpoint file {rel!r} lies outside the checkpoint folder")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
