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

from ..._extras import require

require("lips-flwr compare", ["scipy"])  # (the paired tests; one line naming the extra, not a traceback)

from .comparison import Comparison, default_goal  # noqa: E402
from .metric import default_metric, evaluate_series  # noqa: E402
from .run import run_compare  # noqa: E402
from .summary import endpoint, summarize  # noqa: E402

__all__ = ["Comparison", "default_goal", "default_metric", "endpoint", "evaluate_series", "run_compare",
           "summarize"]
