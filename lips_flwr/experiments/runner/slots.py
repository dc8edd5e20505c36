"""How many runs at once, on how many cores: a sweep's slots, for the sweep and its Ray dispatch alike."""

from __future__ import annotations

import math
import os


def default_jobs(runs: int, cores: int) -> int:
    """The runs at once that finish ``runs`` equal runs soonest on ``cores`` cores, never later than one.

    ``gcd(runs, cores)``, the largest number that divides both: every process
    then does ``runs / jobs`` runs with ``cores / jobs`` threads, so no core
    idles, ever (a divisor of ``runs`` alone, e.g. 6 of 12 runs on 8 cores,
    would leave 2 cores idle for the whole sweep; see docs/simulation.md,
    "Threads and jobs").
    """
    return math.gcd(max(1, runs), max(1, cores))


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


__all__ = ["available_cores", "default_jobs"]
