"""CallsInTurn: a delivery's calls one after another in one thread, each with its own deadline."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from lips_flwr.experiments.batched.calls import CallsInTurn

_VAR = contextvars.ContextVar("var")


def _names(index: int) -> str:
    return f"call {index}"


def test_calls_run_in_order_in_one_thread_that_is_not_the_callers():
    threads, order = [], []

    def call(i):
        def run():
            threads.append(threading.current_thread())
            order.append(i)
            return i * 10
        return run

    abandoned = []
    results = CallsInTurn([call(i) for i in range(5)], 30.0, _names).run(
        lambda index, thread: abandoned.append(index))
    assert results == [0, 10, 20, 30, 40] and order == [0, 1, 2, 3, 4] and abandoned == []
    assert len(set(threads)) == 1 and threads[0] is not threading.current_thread()
    assert threads[0].name == "call 0" and threads[0].daemon


def test_a_call_past_its_deadline_is_abandoned_and_the_rest_go_on_in_a_new_thread():
    release, threads, ended = threading.Event(), {}, []

    def call(i, hang=False, sleep=0.0):
        def run():
            threads[i] = threading.current_thread()
            if hang:
                release.wait(60)
                ended.append(i)
            time.sleep(sleep)
            return i
        return run

    abandoned = []
    start = time.monotonic()
    try:
        # Each call has 0.5 s from its own start: 2 and 3 together take longer, and are in time.
        results = CallsInTurn([call(0), call(1, hang=True), call(2, sleep=0.3), call(3, sleep=0.3)], 0.5,
                              _names).run(lambda index, thread: abandoned.append((index, thread)))
        took = time.monotonic() - start
    finally:
        release.set()
    assert results == [0, None, 2, 3] and took >= 1.1
    assert [index for index, _ in abandoned] == [1] and abandoned[0][1] is threads[1]
    assert threads[0] is threads[1] and threads[2] is threads[3] and threads[2] is not threads[1]
    assert threads[2].name == "call 2"
    threads[1].join(10)
    assert ended == [1] and not threads[1].is_alive()  # it ended after its call, running no other


def test_the_last_call_abandoned_ends_the_run_at_its_deadline():
    release = threading.Event()
    abandoned = []
    start = time.monotonic()
    try:
        results = CallsInTurn([lambda: 0, lambda: release.wait(60)], 0.3, _names).run(
            lambda index, thread: abandoned.append(index))
    finally:
        release.set()
    assert results == [0, None] and abandoned == [1] and time.monotonic() - start < 5


def test_the_first_call_to_raise_stops_the_calls_after_it_and_is_raised_in_the_caller():
    ran = []

    def fail():
        ran.append(1)
        raise ZeroDivisionError("division by zero")

    with pytest.raises(ZeroDivisionError, match="division by zero"):
        CallsInTurn([lambda: ran.append(0), fail, lambda: ran.append(2)], 30.0, _names).run(lambda *a: None)
    assert ran == [0, 1]


def test_each_call_runs_in_its_own_copy_of_the_callers_context():
    seen = []

    def call(i):
        def run():
            seen.append(_VAR.get(None))
            _VAR.set(f"call {i}'s")
            return i
        return run

    token = _VAR.set("the caller's")
    try:
        CallsInTurn([call(i) for i in range(3)], 30.0, _names).run(lambda *a: None)
        assert _VAR.get() == "the caller's"
    finally:
        _VAR.reset(token)
    assert seen == ["the caller's"] * 3


def test_no_calls():
    assert CallsInTurn([], 1.0, _names).run(lambda *a: None) == []


def test_no_call_is_abandoned_before_it_starts_even_with_no_time_at_all():
    # A call past its deadline is abandoned only once it runs: with timeout 0 each call starts (in a
    # thread of its own, each abandoned at once) and none is skipped.
    ran, release = [], threading.Event()

    def call(i):
        def run():
            ran.append(i)
            release.wait(10)
            return i
        return run

    abandoned = []
    try:
        results = CallsInTurn([call(i) for i in range(4)], 0.0, _names).run(
            lambda index, thread: abandoned.append((index, thread)))
    finally:
        release.set()
    assert results == [None] * 4 and [index for index, _ in abandoned] == [0, 1, 2, 3]
    for _, thread in abandoned:
        thread.join(10)
    assert sorted(ran) == [0, 1, 2, 3]
