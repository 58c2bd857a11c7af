"""``RecvPacer`` learns how long to wait after a send before blocking in a receive, and
never changes what is received (``rlconnect.envs.recv_pacer``)."""

from __future__ import annotations

import os
import time

import pytest

from rlconnect.envs.recv_pacer import DOWN_S, MAX_WAIT_S, REACH_S, SLEPT_S, UP_S, RecvPacer

FAST = 4e-6  # a receive whose results were ready


def test_a_receive_that_slept_makes_the_next_wait_longer_up_to_the_cap():
    pacer = RecvPacer()
    pacer.learn(FAST)
    pacer.learn(FAST + SLEPT_S + 10e-6)
    assert pacer.wait_s == pytest.approx(UP_S)
    for _ in range(1000):
        pacer.learn(FAST + SLEPT_S + 10e-6)
    assert pacer.wait_s == pytest.approx(MAX_WAIT_S)


def test_a_receive_that_did_not_sleep_makes_the_next_wait_shorter_down_to_0():
    pacer = RecvPacer()
    pacer.wait_s = 3 * DOWN_S
    pacer.learn(FAST)
    assert pacer.wait_s == pytest.approx(2 * DOWN_S)
    pacer.learn(FAST + SLEPT_S / 2)  # caught by the engine's own spin: no sleep either
    assert pacer.wait_s == pytest.approx(DOWN_S)
    for _ in range(5):
        pacer.learn(FAST)
    assert pacer.wait_s == 0.0


def test_a_step_far_beyond_a_wake_up_stops_the_waiting():
    pacer = RecvPacer()
    pacer.learn(FAST)
    pacer.wait_s = MAX_WAIT_S
    pacer.learn(FAST + REACH_S + 1e-3)  # e.g. an Atari step
    assert pacer.wait_s == 0.0


def test_the_delay_settles_where_few_receives_sleep():
    """Receives sleep while the wait is under the step's 60 us: the learned wait ends
    near it, and about DOWN_S / (UP_S + DOWN_S) of the receives slept."""
    pacer = RecvPacer()
    pacer.learn(FAST)
    slept = 0
    for _ in range(2000):
        sleeps = pacer.wait_s < 60e-6
        slept += sleeps
        pacer.learn(FAST + (40e-6 if sleeps else 0.0))
    assert 60e-6 - UP_S <= pacer.wait_s <= 60e-6 + UP_S
    assert slept / 2000 == pytest.approx(DOWN_S / (UP_S + DOWN_S), abs=0.05)


@pytest.mark.skipif(not hasattr(os, "sched_yield"), reason="no sched_yield")
def test_recv_calls_the_receive_once_the_delay_after_the_send_has_passed():
    pacer = RecvPacer()
    pacer.wait_s = 0.02  # (beyond what it would learn: the test's own clock is coarse)
    calls: list[float] = []
    pacer.sent()
    sent = time.perf_counter()
    out = pacer.recv(lambda: calls.append(time.perf_counter()) or "rows")
    assert out == "rows" and len(calls) == 1
    assert calls[0] - sent >= 0.02 - 1e-4
    pacer.wait_s = 0.0  # no delay: at once
    pacer.sent()
    t0 = time.perf_counter()
    pacer.recv(lambda: None)
    assert time.perf_counter() - t0 < 0.015
