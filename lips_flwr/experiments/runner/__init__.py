"""The one experiment runner every sweep uses (``lips-flwr compare``, the paper app's scripts).

A run is a :class:`~.runs.RunSpec` (a Flower App folder, run-config
overrides, a seed, a node count, an engine, LIPS forced off or not);
:func:`~.sweep.run_sweep` runs a list of them, each in a fresh process, and
writes one result file per run that records the run's identity (everything
that decides its numbers) and provenance (where and with what it was
computed). :mod:`.apps` reads a Flower App folder, :mod:`.runs` resolves a
spec and its identity, :mod:`.store` holds result files, staging folders and
the sweep's lock, :mod:`.worker` is one run's process on the batched Grid
and :mod:`.flwr_runs` one under the real ``flwr run``, :mod:`.observe` is what
the runner sees through the Grid, :mod:`.provenance` the code identity and
the machine.
"""

from .runs import RunSpec
from .store import Result, read_result
from .sweep import SweepFailed, SweepStopped, run_sweep

__all__ = ["Result", "RunSpec", "SweepFailed", "SweepStopped", "read_result", "run_sweep"]
