"""Waits that end a test gone wrong instead of hanging it: a forked child, a thread.

Shared by the tests that fork while a thread holds a lock
(``persistence/test_concurrent_saves.py``, ``strategies/resume/test_checkpoint_failures.py``)
and those that run a call that might never return (``experiments/batched/test_grid.py``,
``experiments/batched/test_grid_client_failures.py``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest


def child_status(pid: int, blocked_on: str, seconds: float = 60.0) -> int:
    """The wait status of the forked child ``pid``, polled until it exits or ``seconds`` pass.

    A child still running then is killed and reaped, and the test fails with
    "the forked child blocked on ``blocked_on``": a blocked child must fail,
    not hang.
    """
    deadline = time.monotonic() + seconds
    done, status = os.waitpid(pid, os.WNOHANG)
    while done == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
        done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail(f"the forked child blocked on {blocked_on}")
    return status


def finishes(fn: Callable[[], Any], seconds: float, hung: str) -> dict:
    """``fn()``'s result (``"result"``) or exception (``"error"``), run in a daemon thread that must
    end within ``seconds``; else the test fails with the message ``hung``."""
    out: dict = {}

    def target():
        try:
            out["result"] = fn()
        except BaseException as err:  # noqa: BLE001
            out["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), hung
    return out
