"""Framed messages on a worker's pipes (``envs.workers.frames``): the framing of
``multiprocessing.connection``, read and written with plain system calls, on one pipe
each way."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from pathlib import Path

import pytest

from rlconnect.envs.workers.frames import frame, read_frame, write_frame

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="Connection fds are POSIX")


@pytest.fixture
def pipe():
    """``(reader, writer)`` of a one-way pipe, as between the runner and a worker."""
    r, w = multiprocessing.Pipe(duplex=False)
    yield r, w
    r.close()
    w.close()


@pytest.mark.parametrize("data", [b"", b"p", bytes(range(256)) * 3])
def test_frames_and_connection_read_each_other(pipe, data):
    r, w = pipe
    write_frame(w, frame(data))
    assert r.recv_bytes() == data
    w.send_bytes(data)
    assert read_frame(r) == data


def test_a_message_larger_than_the_pipe_goes_through_whole(pipe):
    r, w = pipe
    data = bytes(range(256)) * 40_000  # ~10 MB: many times a pipe's buffer
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(read_frame(r)))
    reader.start()
    write_frame(w, frame(data))
    reader.join(10)
    assert got == [data]


def test_messages_in_a_row_stay_apart(pipe):
    r, w = pipe
    for data in (b"one", b"", b"three"):
        write_frame(w, frame(data))
    w.send_bytes(b"four")  # a Connection write between framed ones
    assert [read_frame(r) for _ in range(4)] == [b"one", b"", b"three", b"four"]


def test_a_closed_pipe_is_end_of_file(pipe):
    r, w = pipe
    w.close()
    with pytest.raises(EOFError):
        read_frame(r)


@posix_only
def test_a_closed_pipe_mid_message_is_end_of_file(pipe):
    r, w = pipe
    w.send_bytes(b"x" * 10)
    os.write(w.fileno(), frame(b"abcdef")[:6])  # the header and two bytes of six
    assert read_frame(r) == b"x" * 10
    w.close()
    with pytest.raises(EOFError):
        read_frame(r)


@pytest.mark.skipif(
    not Path("/proc/self/status").exists() or multiprocessing.get_start_method() != "fork",
    reason="needs Linux's /proc, and workers that inherit the patch below by fork",
)
def test_a_poll_wakes_each_worker_once():
    """Each worker sleeps once per poll, waiting for its command on its pipe. On one socket
    pair per worker, the runner's read of an answer also woke the worker that sent it (a
    second sleep per poll), and the worker's read of its command woke the runner."""
    from env_cases import sleeps_per_worker

    polls = 200
    sleeps = sleeps_per_worker(polls)
    assert all(polls * 0.5 <= s <= polls * 1.2 for s in sleeps), (sleeps, polls)


def test_a_synchronous_poll_waits_for_one_worker_at_a_time(monkeypatch):
    """A synchronous poll waits on the workers' answer pipes in worker order, one at a
    time (so the runner wakes once when the first one it waits for finishes last); the
    batches are those of a run that is not watched."""
    from env_cases import assert_same_batches, make_indexed, runner_for

    from rlconnect.envs.workers import answers

    def draw() -> list:
        runner = runner_for(make_indexed, make_indexed, n=4, frag=10, seed=21, num_env_workers=2)
        try:
            return [runner.sample() for _ in range(2)]
        finally:
            runner.stop()

    from rlconnect.envs.workers.handle import WorkerHandle

    plain = draw()
    waits: list[int] = []  # how many workers each wait watches

    def counted(workers, timeout_s):
        workers = list(workers)
        waits.append(len(workers))
        return ready(workers, timeout_s)

    def counted_one(self, timeout_s):
        waits.append(1)
        return answered(self, timeout_s)

    ready, answered = answers.ready_workers, WorkerHandle.answered
    monkeypatch.setattr(answers, "ready_workers", counted)
    monkeypatch.setattr(WorkerHandle, "answered", counted_one)
    assert_same_batches(plain, draw())
    assert waits and set(waits) == {1}  # one worker at a time, each waited for first
