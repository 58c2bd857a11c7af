"""Messages on a worker's pipe, framed as ``multiprocessing.connection`` frames them (a
4-byte big-endian length, or ``-1`` and an 8-byte length, then the bytes), but written
and read with plain ``os.write``/``os.read`` calls on POSIX.

Why: a poll sends one small message each way per worker, and ``Connection`` spends
microseconds of Python around each system call (``recv_bytes`` goes through an
``io.BytesIO`` twice). On the poll's critical path, just after a process has woken up
with cold caches, that cost is several times what it is in a warm loop.
The framing is the same, so the rarer messages (hello, attach, close) still go through
``Connection.send_bytes``/``recv_bytes`` on the same pipe: ``Connection`` keeps no
buffer of its own, so both readers see every frame whole. Elsewhere (Windows' named
pipes have no file descriptor) these functions use the ``Connection`` methods.

Each direction has a pipe of its own (``Pipe(duplex=False)`` twice, see
``handle.WorkerHandle.start``), not one socket pair: a read from a Unix socket wakes the
process blocked reading the other end (the freed buffer space is signalled on the same
wait queue), so on one duplex pipe every answer the runner reads wakes the worker that
sent it for nothing, and every command a worker reads wakes the runner, which then
preempts that worker when they share a CPU. Plain pipes have a wait queue per direction.
"""

from __future__ import annotations

import os
import struct
import sys
from multiprocessing.connection import Connection

__all__ = ["frame", "read_frame", "write_frame"]

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_RAW = sys.platform != "win32"


def frame(data: bytes) -> bytes:
    """``data`` with its header, ready for one ``os.write``."""
    n = len(data)
    if n > 0x7FFFFFFF:
        return _SHORT.pack(-1) + _LONG.pack(n) + data
    return _SHORT.pack(n) + data


def write_frame(conn: Connection, framed: bytes) -> None:
    """Send bytes made by ``frame``; raises ``OSError`` when the other end is gone."""
    if not _RAW:
        conn.send_bytes(framed[_header_size(framed) :])
        return
    fd = conn.fileno()
    sent = os.write(fd, framed)
    if sent < len(framed):  # a pipe full of a large message: the rest in pieces
        view = memoryview(framed)
        while sent < len(framed):
            sent += os.write(fd, view[sent:])


def read_frame(conn: Connection) -> bytes:
    """The next message (blocks until one came); raises ``EOFError`` when the other end
    closed the pipe."""
    if not _RAW:
        return conn.recv_bytes()
    fd = conn.fileno()
    (size,) = _SHORT.unpack(_read_exactly(fd, 4))
    if size == -1:
        (size,) = _LONG.unpack(_read_exactly(fd, 8))
    return _read_exactly(fd, size) if size else b""


def _header_size(framed: bytes) -> int:
    return 12 if _SHORT.unpack_from(framed)[0] == -1 else 4


def _read_exactly(fd: int, n: int) -> bytes:
    data = os.read(fd, n)
    if len(data) == n:
        return data
    parts, got = [data], len(data)
    while got < n:
        if not data:
            raise EOFError("the pipe was closed")
        data = os.read(fd, n - got)
        parts.append(data)
        got += len(data)
    return b"".join(parts)
