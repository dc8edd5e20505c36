"""The sweep's progress lines: ``[name] round r/R, ETA ...`` for each run and for the whole sweep."""

from __future__ import annotations

import time
from collections.abc import Callable

from .runs import PreparedRun

Progress = Callable[[str], None]


def duration_text(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h07m``: an ETA as the board prints it."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class ProgressBoard:
    """Progress of a sweep's runs: ``[name] round r/R, ETA ...`` for the run and the sweep."""

    def __init__(self, jobs: list[PreparedRun], progress: Progress) -> None:
        self.progress, self.start = progress, time.monotonic()
        self.total = {job.name: job.num_rounds for job in jobs}
        self.done: dict[str, int] = {}
        self.first: dict[str, tuple[int, float]] = {}  # name -> (first round seen, when)
        self.finished: set[str] = set()
        self.rounds_seen = 0

    def round(self, name: str, rnd: int) -> None:
        if rnd <= self.done.get(name, 0):
            return
        now = time.monotonic()
        self.first.setdefault(name, (rnd, now))
        self.rounds_seen += 1
        self.done[name] = rnd
        total = self.total[name]
        line = f"[{name}] round {rnd}" + (f"/{total}" if total else "")
        first, since = self.first[name]
        if total and rnd > first:
            line += f", ETA {duration_text((total - rnd) * (now - since) / (rnd - first))}"
        left = sum((t or 1) - self.done.get(n, 0) for n, t in self.total.items() if n not in self.finished)
        rate = self.rounds_seen / max(now - self.start, 1e-9)
        line += f" (sweep: {len(self.finished)} of {len(self.total)} runs done"
        line += f", ETA {duration_text(left / rate)})" if self.rounds_seen > len(self.first) else ")"
        self.progress(line)

    def finish(self, name: str) -> None:
        self.finished.add(name)
        self.progress(f"[{name}] done ({len(self.finished)} of {len(self.total)} runs of the sweep)")


__all__ = ["ProgressBoard", "duration_text"]
