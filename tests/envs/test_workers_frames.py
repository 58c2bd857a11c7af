"""Framed messages on a worker's pipe (``envs.workers.frames``): the framing of
``multiprocessing.connection``, read and written with plain system calls."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

import pytest

from rlconnect.envs.workers.frames import frame, read_frame, set_read_timeout, write_frame

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="Connection fds are POSIX")


@pytest.fixture
def pipe():
    a, b = multiprocessing.Pipe()
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("data", [b"", b"p", bytes(range(256)) * 3])
def test_frames_and_connection_read_each_other(pipe, data):
    a, b = pipe
    write_frame(a, frame(data))
    assert b.recv_bytes() == data
    b.send_bytes(data)
    assert read_frame(a) == data


def test_a_message_larger_than_the_pipe_goes_through_whole(pipe):
    a, b = pipe
    data = bytes(range(256)) * 40_000  # ~10 MB: many times a socket's buffer
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_frame(b)))
    reader.start()
    write_frame(a, frame(data))
    reader.join(10)
    assert got == [data]


def test_messages_in_a_row_stay_apart(pipe):
    a, b = pipe
    for data in (b"one", b"", b"three"):
        write_frame(a, frame(data))
    b.send_bytes(b"four")  # a Connection write between framed ones
    assert [read_frame(b) for _ in range(3)] == [b"one", b"", b"three"]
    assert read_frame(a) == b"four"


def test_a_closed_pipe_is_end_of_file(pipe):
    a, b = pipe
    b.close()
    with pytest.raises(EOFError):
        read_frame(a)


def test_a_closed_pipe_mid_message_is_end_of_file(pipe):
    a, b = pipe
    b.send_bytes(b"x" * 10)
    os.write(b.fileno(), frame(b"abcdef")[:6])  # the header and two bytes of six
    assert read_frame(a) == b"x" * 10
    b.close()
    with pytest.raises(EOFError):
        read_frame(a)


@posix_only
def test_a_read_timeout_gives_up_without_a_message_and_waits_for_the_rest_of_one(pipe):
    a, b = pipe
    assert set_read_timeout(a, 0.05)
    start = time.monotonic()
    with pytest.raises(BlockingIOError):
        read_frame(a)
    assert 0.04 <= time.monotonic() - start < 2.0
    # a message begun is read to its end, however long the rest takes
    framed = frame(b"slow message")
    os.write(b.fileno(), framed[:7])
    later = threading.Timer(0.2, lambda: os.write(b.fileno(), framed[7:]))
    later.start()
    assert read_frame(a) == b"slow message"
    later.join()
    # the option stays on the socket: still no message, still gives up
    with pytest.raises(BlockingIOError):
        read_frame(a)


def test_workers_whose_pipes_have_no_read_timeout_wait_with_poll(monkeypatch):
    """Where a pipe cannot have a read timeout, synchronous polls wait with ``poll``
    first, with the same batches."""
    from env_cases import assert_same_batches, make_indexed, runner_for

    from rlconnect.envs.workers import handle

    def draw() -> list:
        runner = runner_for(make_indexed, make_indexed, n=4, frag=10, seed=21, num_env_workers=2)
        try:
            return [runner.sample() for _ in range(2)]
        finally:
            runner.stop()

    timed = draw()
    waits: list[int] = []

    def counted(workers, timeout_s):
        waits.append(len(list(workers)))
        return ready(workers, timeout_s)

    ready = handle.ready_workers
    monkeypatch.setattr(handle, "set_read_timeout", lambda conn, seconds: False)
    monkeypatch.setattr(handle, "ready_workers", counted)
    assert_same_batches(timed, draw())
    assert waits and set(waits) == {1}  # one worker at a time, each waited for first
