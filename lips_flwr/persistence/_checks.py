"""Checks on values read back from a file's JSON metadata, shared by the checkpoint and its sidecars.

A checkpoint, its metrics history (:mod:`.history`) and the run's identity
(:mod:`.identity`) are JSON written by this package, but read back from a file
that may be damaged or not ours: each field is checked for its type when it is
read, so that a bad file fails on loading with a ``ValueError`` rather than in
the middle of a run. The checks live here, not in :mod:`.checkpoint`, so that
the sidecar modules need not import the checkpoint module that imports them.
"""

from __future__ import annotations

import math
from typing import Any


def checked_int(value: Any) -> int:
    """``value`` when it is an ``int`` (a ``bool`` is not); ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def json_scalar(value: Any) -> str | None:
    """``"none"``, ``"bool"``, ``"number"`` (finite) or ``"str"``; ``None`` for anything else."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return "number"
    return "str" if isinstance(value, str) else None


def check_settings(settings: Any, what: str) -> None:
    """LIPS settings: a dict of JSON scalars and lists of them (``layers``), nothing nested."""
    if not isinstance(settings, dict):
        raise ValueError(f"malformed {what}")
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        if not all(json_scalar(v) is not None for v in values):
            raise ValueError(f"malformed {what}: {key!r} is {value!r}")


def check_metrics(key: Any, metrics: Any) -> None:
    """One round's metrics (round ``key``): a dict of numbers or lists of numbers, no ``bool``."""
    if not isinstance(metrics, dict):
        raise ValueError(f"the metrics of round {key} are not a record: {metrics!r}")
    for value in metrics.values():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"a metric of round {key} is not a number: {value!r}")


__all__ = ["check_metrics", "check_settings", "checked_int", "json_scalar"]
