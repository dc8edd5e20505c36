"""``lips-flwr compare``: does LIPS (or any change of run config) help on this Flower App?

Two arms of the same App over paired seeds, on the batched Grid, through the
one runner (:func:`~lips_flwr.experiments.runner.sweep.run_sweep`):

- by default arm A is the app with LIPS off (every LIPS strategy built in it
  is forced to ``tau0 = 0``, bit for bit its wrapped strategy; client mods
  then mask nothing) and arm B the app as written;
- with ``a``/``b`` overrides, each arm is the app with its own run-config
  overrides (nothing forced).

The runs go to ``<out>/runs/<a|b>-seed<k>.json``, after the checks of
:mod:`.out`. The **endpoint** of a run is the mean over its last
``K`` evaluated rounds (default ``min(10, rounds)``) of evaluate metric
``NAME``: the clients' (averaged with ``num-examples`` weights) or the
ServerApp's own (:mod:`.metric`; default: the first whose name
contains ``acc``). Which way is better is the **goal** (``max``, or ``min``
by default for a name with ``loss``, ``error`` or ``err``). Per seed,
``B - A``; over seeds, the paired t-test with its 95% CI (ddof = 1) and the
exact sign test (:mod:`lips_flwr.experiments.stats`), and a verdict in plain words that follow the
goal: *B better*, *B worse* or *no difference detected* (no t-test, CI or
verdict from one seed, nor when every seed gave the same difference). The
**inertia verdict** of arm A applies the protocol's rule to the relative
steps of the global models the runner saw. The summary also flags the rounds
that did not move a run's global model, says what LIPS did in each arm
(:mod:`.lips`), and names the code and libraries that made it and
each run's code (``provenance``). ``<out>/summary.json``, ``<out>/report.md``,
``<out>/curves.png`` and ``<out>/inertia.png`` hold it all
(:mod:`.report`).

The room: :mod:`.cli` (the command) -> :mod:`.run` (the sweep, then the
outputs) -> :mod:`.out` (checks of ``out``), :mod:`.summary` and
:mod:`.report` -> :mod:`.comparison`, :mod:`.metric` and :mod:`.lips`
(readings of result files). The report reads only the summary and the
result files; nothing here imports its importer (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# The public names, each with the module of the room that defines it. They load on first use, so that
# the command (cli.py) starts without the summary's scipy: cli.main names every missing extra in one
# line, and `--help` works without them.
_EXPORTS = {"Comparison": "comparison", "default_goal": "comparison", "default_metric": "metric",
            "evaluate_series": "metric", "run_compare": "run", "endpoint": "summary", "summarize": "summary"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = sorted(_EXPORTS)
