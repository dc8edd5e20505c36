"""The one experiment runner every sweep uses (``lips-flwr compare``, the paper app's scripts).

A run is a :class:`~.runs.RunSpec` (a Flower App folder, run-config
overrides, a seed, a node count, an engine, LIPS forced off or not);
:func:`~.sweep.run_sweep` runs a list of them, each in a fresh process, and
writes one result file per run that records the run's identity (everything
that decides its numbers) and provenance (where and with what it was
computed). docs/layout.md says what each module of the package does.
"""

from .runs import RunSpec
from .store import Result, read_result
from .sweep import SweepFailed, SweepStopped, run_sweep

__all__ = ["Result", "RunSpec", "SweepFailed", "SweepStopped", "read_result", "run_sweep"]
