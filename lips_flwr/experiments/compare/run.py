"""Run a comparison: both arms through the one runner (reusing finished runs), then the summary,
report and figures into ``out``, under the sweep's lock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..runner.stall import DEFAULT_STALL_TIMEOUT
from ..runner.store import SweepLock, read_result, staging_path
from ..runner.sweep import run_sweep
from .comparison import Comparison
from .metric import MetricWatch
from .out import check_out, made_folders, prepared_sweep, remove_made
from .report import write_report
from .summary import summarize


def run_compare(comparison: Comparison, out: str | Path, jobs: int | None = None, recompute: bool = False,
                progress: Callable[[str], None] = print,
                stall_timeout: float | None = DEFAULT_STALL_TIMEOUT, address: str | None = None,
                gpus_per_run: float = 0.0) -> dict:
    """Run both arms (reusing finished runs), then write the summary, report and figures into ``out``.

    ``stall_timeout``: a run without progress for that many seconds fails (:mod:`..runner.stall`);
    ``address`` and ``gpus_per_run``: the Ray cluster and each run's GPUs
    (:func:`~..runner.sweep.run_sweep`).
    """
    out = Path(out).resolve()
    specs = comparison.specs()
    made = made_folders(out / "runs")
    try:
        check_out(out)  # (before the lock makes runs/: a file in the way is named, not an OS error)
        # The sweep's lock, held before anything in `out` is removed (a result file under --recompute,
        # the old report) and until the report is written: a second compare into `out` is refused
        # before it touches the first one's files.
        with SweepLock(out / "runs") as lock:
            prepared_sweep(specs, out, recompute, progress)
            first = specs[0].name  # (its first evaluated round tells whether the metric is there)
            watch = MetricWatch(comparison.metric, first, staging_path(out / "runs", first), progress)
            paths = run_sweep(specs, out / "runs", jobs=jobs, recompute=recompute, progress=watch,
                              stall_timeout=stall_timeout, lock=lock, address=address,
                              gpus_per_run=gpus_per_run)
            results = {spec.name: read_result(path) for spec, path in zip(specs, paths)}
            summary = summarize(comparison, results)
            write_report(comparison, summary, results, out)
    except BaseException:
        remove_made(made)  # (a refused sweep leaves no empty runs/; a stopped run's staging stays)
        raise
    return summary


__all__ = ["run_compare"]
