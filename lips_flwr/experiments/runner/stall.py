"""The stall timeout: a run that shows no progress for that long fails, with the end of its log.

A run's process tells the sweep of its progress: each round the Grid
observes, and a heartbeat as client calls end (:func:`heartbeat`, at most
one a second, from the Grid's ``on_call``). A run that sends nothing for
``seconds`` (from its start, or from its last word) is stalled
(:class:`StallWatch`): it waits for something that will not come (a
ServerApp that waits for nodes, a deadlock) or one client call, or a
ServerApp's work between rounds, takes longer than the timeout. The sweep
then ends its process and fails, the end of its log in the error
(:func:`stalled_failure`). ``None`` (the default of :func:`~.sweep.run_sweep`)
waits without end; ``lips-flwr compare --stall-timeout`` defaults to
:data:`DEFAULT_STALL_TIMEOUT`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

DEFAULT_STALL_TIMEOUT = 300.0  # seconds: compare's default; a round of many slow clients still has calls end


class StallWatch:
    """When each running run last showed progress, and which have been silent for over ``seconds``."""

    def __init__(self, seconds: float | None) -> None:
        if seconds is not None and not seconds > 0:
            raise ValueError(f"the stall timeout must be a number of seconds > 0 or None, got {seconds!r}")
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def heard(self, name: str) -> None:
        """``name`` started, or showed progress, now."""
        self._last[name] = time.monotonic()

    def stalled(self, names: Iterable[str]) -> list[str]:
        """Those of ``names`` silent for longer than the timeout (none without one)."""
        if self.seconds is None:
            return []
        now = time.monotonic()
        return [name for name in names if now - self._last.get(name, now) > self.seconds]


def stalled_failure(name: str, seconds: float, tail: str) -> str:
    """The error of the run ``name`` silent for ``seconds``: what it means, then its log's ``tail``."""
    return (f"[{name}] made no progress for {seconds:.0f} s (no round ended, no client call ended): it waits "
            f"for something that does not come, or one step takes longer than that; --stall-timeout "
            f"(stall_timeout) sets the limit; the end of its log:\n{tail}")


def heartbeat(send: Callable[[], None], every: float = 1.0) -> Callable[[], None]:
    """A callable, safe from any thread, that calls ``send`` at most once each ``every`` seconds."""
    lock = threading.Lock()
    last = [float("-inf")]

    def beat() -> None:
        with lock:
            now = time.monotonic()
            if now - last[0] >= every:
                last[0] = now
                send()

    return beat


__all__ = ["DEFAULT_STALL_TIMEOUT", "StallWatch", "heartbeat", "stalled_failure"]
