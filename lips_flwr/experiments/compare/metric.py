"""Which metric a comparison reads, from the clients' evaluation or the ServerApp's own, and its series.

A run's result file holds two kinds of evaluate metrics (:mod:`..runner.observe`):

- the clients' (``rounds[r].evaluate.metrics``, averaged with ``num-examples``
  weights; ``evaluate_keys``: the lowest node's first reply's, in its order);
- the ServerApp's own (``rounds[r].server_evaluate.metrics``: its strategy's
  ``evaluate_fn`` on a central test set; round 0, the initial model, is not
  an evaluated round of the endpoint).

:func:`choose_metric`: a named metric is the clients' when they report it,
else the ServerApp's; the default is the first clients' metric whose name
contains ``acc``, else the ServerApp's first. The summary and report say
which (``metric_source``). :class:`MetricWatch` refuses an unknown metric once
the first run has evaluated a round, not after the whole sweep.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..runner.store import Result

SOURCES = ("clients", "server")
PART = {"clients": "evaluate", "server": "server_evaluate"}  # where a source's metrics are in a round


def server_keys(observed: dict | None) -> list[str]:
    """The ServerApp's own evaluate metrics in a run's observations (first evaluated round's order)."""
    for key, entry in sorted((observed or {}).get("rounds", {}).items(), key=lambda item: int(item[0])):
        metrics = (entry.get("server_evaluate") or {}).get("metrics")
        if int(key) >= 1 and metrics:
            return list(metrics)
    return []


def client_keys(observed: dict | None) -> list[str]:
    """The clients' evaluate metrics in a run's observations: ``evaluate_keys``, then the rest of the union.

    ``evaluate_keys`` are the lowest node's first reply's only; a metric that
    only some clients report is in the rounds' aggregated metrics (what
    :func:`evaluate_series` reads), added here in round order.
    """
    keys = list((observed or {}).get("evaluate_keys") or [])
    for _, entry in sorted((observed or {}).get("rounds", {}).items(), key=lambda item: int(item[0])):
        keys += [k for k in ((entry.get("evaluate") or {}).get("metrics") or {}) if k not in keys]
    return keys


def _reported(observed: dict | None) -> str:
    clients = (observed or {}).get("evaluate_keys") or "no evaluate metrics"
    server = server_keys(observed)
    return f"the clients report {clients}" + (f", the ServerApp's evaluate_fn {server}" if server else "")


def choose_metric(observed: dict | None, metric: str | None, file: str = "the first run") -> tuple[str, str]:
    """``(metric, source)`` as the module docstring says; ``ConfigError`` when none fits a default."""
    clients, server = (observed or {}).get("evaluate_keys") or [], server_keys(observed)
    if metric is not None:
        return metric, "server" if metric not in clients and metric in server else "clients"
    for source, keys in (("clients", clients), ("server", server)):
        found = next((k for k in keys if "acc" in k), None)
        if found is not None:
            return found, source
    raise ConfigError(f"no evaluate metric of {file} has 'acc' in its name ({_reported(observed)}): name one "
                      "with --metric")


def default_metric(result: Result) -> str:
    """The first evaluate metric whose name contains ``acc``: the clients', else the ServerApp's."""
    return choose_metric(result.observed, None, result.path.name)[0]


def evaluate_series(result: Result, metric: str, source: str = "clients") -> dict[int, float]:
    """Round -> evaluate metric ``metric`` of ``source`` (rounds from 1 that have it)."""
    part = PART[source]
    rounds = (result.observed or {}).get("rounds", {})
    return {int(r): float(entry[part]["metrics"][metric]) for r, entry in rounds.items()
            if int(r) >= 1 and metric in (entry.get(part) or {}).get("metrics", {})}


def unknown_metric(metric: str, observed: dict | None, names: list[str]) -> ConfigError:
    """The error for a metric that runs ``names`` do not have, naming what they report."""
    return ConfigError(f"evaluate metric {metric!r} is in no round of {names}; {_reported(observed)}")


ROUND_LINE = re.compile(r"^\[(?P<name>[^\]]+)\] round (?P<round>\d+)")


class MetricWatch:
    """A sweep's progress callback that refuses an unknown metric after the first run's first evaluation.

    It passes each line on to ``progress``; on a ``[first] round r`` line of
    run ``first`` (sent once round ``r``'s train replies are in), it reads
    that run's partial observations (its staging folder's ``observed.json``)
    of the rounds before ``r`` and, once they hold an evaluated round, checks
    the metric there (:func:`choose_metric`) once: a name in none of the
    rounds' aggregated clients' metrics (:func:`client_keys`, as
    :func:`evaluate_series` reads them) nor the ServerApp's raises
    ``ConfigError``, which stops the sweep. (The file is saved before the
    line is sent, but read when the line arrives: the run may have evaluated
    round ``r`` meanwhile. Rounds from ``r`` on wait for the next line, so
    the check, and where the sweep stops, depend on the line alone.)
    """

    def __init__(self, metric: str | None, first: str, staging: Path,
                 progress: Callable[[str], None]) -> None:
        self.metric, self.first, self.staging, self.progress = metric, first, staging, progress
        self.checked = False

    def __call__(self, line: str) -> None:
        self.progress(line)
        found = ROUND_LINE.match(line)
        if self.checked or found is None or found["name"] != self.first:
            return
        try:
            saved: dict[str, Any] = json.loads((self.staging / "observed.json").read_text())
        except (OSError, ValueError):
            return
        before = int(found["round"])
        observed = {**saved, "rounds": {r: e for r, e in saved.get("rounds", {}).items() if int(r) < before}}
        if not any(int(r) >= 1 and ((e.get("evaluate") or {}).get("metrics")
                                    or (e.get("server_evaluate") or {}).get("metrics"))
                   for r, e in observed["rounds"].items()):
            return
        self.checked = True
        metric, source = choose_metric(observed, self.metric, self.first)
        if metric not in client_keys(observed) and metric not in server_keys(observed):
            raise unknown_metric(metric, observed, [self.first])


__all__ = ["MetricWatch", "SOURCES", "choose_metric", "client_keys", "default_metric", "evaluate_series",
           "server_keys", "unknown_metric"]
