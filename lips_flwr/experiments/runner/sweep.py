"""The one experiment runner: :func:`run_sweep` runs :class:`~.runs.RunSpec`\\ s into result files.

Before anything runs, every spec is resolved (:func:`~.runs.prepare`) and
each existing result file is checked:

- a finished ``<out>/<name>.json`` whose identity equals the spec's is
  **reused** (not run again);
- one whose identity differs **stops the sweep** before anything runs, each
  differing key named (``run_config.tau0: file 0.3, now 0.5``), unless
  ``recompute=True``, which runs it again and replaces it;
- a file of an earlier session (no identity) is compared by its embedded run
  config: equal, it is reused with a warning that its code, engine and
  environment cannot be checked; different, it is refused like any other;
- two specs with one result name, or names of which one is a folder of the
  other (``x`` and ``x/y``: their staging folders would nest), are an error.

Then ``<out>/.staging`` is tidied (:func:`~.store.prune_staging`) and the
runs run: on the batched Grid as Ray tasks (:func:`run_tasks`, :mod:`.dispatch`),
each claiming its staging folder as it starts (:func:`~.resume.claim_staging`:
a stopped run of the same identity is continued whole, or not at all); under
``flwr run`` one after another (:mod:`.flwr_runs`). ``<out>/.sweep.lock``
keeps a second sweep out of ``out`` while one runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .board import Progress, ProgressBoard
from .provenance import THREAD_VARIABLES
from .resume import claim_staging
from .runs import PreparedRun, RunSpec, identity_now, legacy_run_config, prepare
from .stall import StallWatch, stalled_failure
from .store import (
    STAGING,
    SweepLock,
    differences,
    log_tail,
    prune_staging,
    read_result,
    remove_empty,
    write_result,
)
from .worker import NO_LIPS, Place

if TYPE_CHECKING:
    from .dispatch import Outcome

STOPPED_EXIT = 130  # a sweep's exit status after a Ctrl-C (128 + SIGINT, as a shell reports it)
NODE_RETRIES = 3  # times a run whose node was lost runs again (then it fails, its staging kept)


class SweepFailed(RuntimeError):
    """A run of the sweep failed; the message names it and carries its error and first client error."""


class SweepStopped(KeyboardInterrupt):
    """A Ctrl-C stopped the sweep: every run stopped, its staging kept; the same sweep continues them.

    A ``KeyboardInterrupt`` (code that lets a Ctrl-C through still does); the
    CLI exits with :data:`STOPPED_EXIT`. ``runs``: the runs that were running.
    """

    def __init__(self, runs: list[str]) -> None:
        self.runs = runs
        names = ", ".join(runs) if runs else "none was running"
        super().__init__(f"stopped; run the same command to continue (runs stopped, their progress kept: "
                         f"{names})")


def run_environment(spec: RunSpec, threads: int) -> dict[str, str]:
    """A run process's environment additions: ``threads`` for OpenMP/BLAS where unset.

    The spec's own ``env`` wins, and so does a thread variable the sweep's
    caller set (``OMP_NUM_THREADS=1 lips-flwr compare ...``): its value then
    goes to the others the caller left unset too, so that numpy's BLAS does
    not run more threads than asked for.
    """
    given = [os.environ[name] for name in THREAD_VARIABLES if os.environ.get(name)]
    value = given[0] if given else str(threads)
    unset = [name for name in THREAD_VARIABLES if name not in os.environ]
    return {**{name: value for name in unset}, **dict(spec.env)}


def _duplicates(specs: list[RunSpec]) -> None:
    """``ValueError`` for two specs of one name, or of names one of which is a folder of the other."""
    seen: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        seen.setdefault(spec.name, []).append(i)
    repeated = {name: idx for name, idx in seen.items() if len(idx) > 1}
    if repeated:
        raise ValueError("two runs of one sweep would write one result file: " + "; ".join(
            f"{name!r} (runs {', '.join(map(str, idx))}: {', '.join(str(specs[i].app) for i in idx)})"
            for name, idx in repeated.items()))
    nested = [(name[:cut], name) for name in sorted(seen) for cut in range(len(name)) if name[cut] == "/"
              and name[:cut] in seen]
    if nested:
        raise ValueError("result names of one sweep would share a staging folder, one being a folder of the "
                         "other: " + "; ".join(f"{outer!r} and {inner!r}" for outer, inner in nested)
                         + " (rename one, e.g. 'x/all' beside 'x/y')")


def plan(prepared: list[PreparedRun], recompute: bool, progress: Progress) -> list[PreparedRun]:
    """The runs to do; reused ones logged; ``ValueError`` listing every refused file (see the module)."""
    to_run, refused = [], []
    for job in prepared:
        if not job.result.exists():
            to_run.append(job)
            continue
        try:
            found = read_result(job.result)
        except ValueError as err:
            differing = [str(err)]
        else:
            if found.identity is not None:
                differing = differences(found.identity, identity_now(job, found.identity))
            else:
                embedded = legacy_run_config(found.run_config, job.spec.location_keys)
                differing = differences({"run_config": embedded}, {"run_config": job.identity["run_config"]})
            if not differing:
                note = "" if found.identity is not None else (
                    " (written before the runner recorded identity: its run config matches; its code, engine "
                    "and environment cannot be checked)")
                progress(f"[{job.name}] reused {str(job.result)!r}{note}")
                continue
        if recompute:
            progress(f"[{job.name}] recomputing {str(job.result)!r}: " + "; ".join(differing))
            to_run.append(job)
        else:
            refused.append(f"{str(job.result)!r} was computed with other settings: " + "; ".join(differing))
    if refused:
        raise ValueError("refusing to run: " + "\n  ".join(["", *refused])
                         + "\n(recompute=True, or --recompute, runs them again and replaces those files)")
    return to_run


def _failure(job: PreparedRun, outcome: Outcome) -> str:
    """What to tell of a run that failed: its error and first client error, or how its process ended
    (whether its staging folder is kept is :func:`run_tasks`' rule; the message says which)."""
    if outcome.kind == "stopped":
        return (f"[{job.name}] its process was stopped (exit code {STOPPED_EXIT}, Ctrl-C); its staging "
                f"folder is kept for a later sweep to continue; the end of its log:\n{outcome.event[1]}")
    if outcome.kind == "lost":
        return (f"[{job.name}] its node was lost {NODE_RETRIES + 1} times ({outcome.error}); its staging "
                f"folder is kept for a later sweep to continue")
    if outcome.kind != "failed":
        return (f"[{job.name}] its process ended before reporting ({outcome.error}); the end of its "
                f"log:\n{log_tail(job.staging)}")
    _, error, detail, client_error = outcome.event
    text = f"[{job.name}] failed: {error}\n{detail.rstrip()}"
    if client_error:
        text += f"\n[{job.name}] the first client error:\n{client_error.rstrip()}"
    return text


def app_failure(event: tuple | None) -> bool:
    """Whether a run's ``("failed", error, detail, ...)`` outcome is the app's or its settings' fault.

    The app builds no LIPS strategy for a LIPS-off run (:data:`~.worker.NO_LIPS`),
    or the run ended with a :class:`~lips_flwr.errors.ConfigError` (its
    traceback, ``detail``, names its class by module): every other run of
    the sweep would meet it too, so they need not run on.
    """
    if not event or event[0] != "failed":
        return False
    error, detail = str(event[1]), str(event[2])
    return NO_LIPS in error or any(line.startswith("lips_flwr.errors.ConfigError")
                                   for line in detail.splitlines())


class _CtrlC:
    """A Ctrl-C (SIGINT) of the sweep's process, noted as well as raised: :meth:`check` raises it again.

    Seen once in a loaded CI: a Ctrl-C at round 2 left a sweep running to
    its end, the ``KeyboardInterrupt`` lost inside a Ray call. The handler
    is the main thread's only (Python runs signal handlers there alone).
    """

    def __init__(self) -> None:
        self.noted = False
        self.previous = signal.getsignal(signal.SIGINT)
        # (not where SIGINT is ignored, as for a `cmd &` of a script: the sweep keeps ignoring it)
        self.mine = (threading.current_thread() is threading.main_thread()
                     and self.previous is not signal.SIG_IGN)
        if self.mine:
            signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.noted = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.noted:
            raise KeyboardInterrupt

    def close(self) -> None:
        if self.mine:
            signal.signal(signal.SIGINT, self.previous if self.previous is not None else signal.SIG_DFL)


def run_tasks(jobs: list[PreparedRun], parallel: int | None, progress: Progress,
              stall_timeout: float | None = None, gpus_per_run: float = 0.0) -> None:
    """Each job as a Ray task (:mod:`.dispatch`); ``SweepFailed`` for the first that failed.

    ``parallel``: runs at once (``None``: :func:`~.slots.default_jobs` of the
    cluster's CPUs), each with ``cores // parallel`` CPUs and threads. A job
    claims its staging folder as its task starts: a sweep that stops early
    leaves none for runs it never started. The first failing run stops the
    sweep once the running runs end; one that every run would meet
    (:func:`app_failure`) stops them at once, their staging kept. A run
    silent for over ``stall_timeout`` seconds is stopped and fails
    (:mod:`.stall`). A run whose node is lost runs again
    (:data:`NODE_RETRIES`). A Ctrl-C stops every run, their staging kept:
    :class:`SweepStopped`. A run that ends done, failed, crashed (a signal,
    the OOM killer: Ray does not tell which) or stalled loses its staging.
    """
    from .dispatch import Plan, RayRuns

    plan = Plan.make(jobs, parallel, gpus_per_run)
    threads = os.environ.get("OMP_NUM_THREADS") or str(plan.threads)
    cores = round(plan.parallel * plan.slot)
    progress(f"running {len(jobs)} run(s), {plan.parallel} at a time on {cores} core(s) (a seed's runs on "
             f"one node), {threads} thread(s) each unless a run's env says otherwise")
    given = {name: os.environ[name] for name in THREAD_VARIABLES if os.environ.get(name)}
    cwd, path = os.getcwd(), tuple(sys.path)
    tasks = RayRuns(plan, lambda job: Place(cwd, path, {**given, **run_environment(job.spec, plan.threads)}),
                    lambda job: claim_staging(job, progress))
    board, watch, stalled = ProgressBoard(jobs, progress), StallWatch(stall_timeout), set()
    failure: str | None = None
    halt: str | None = None  # (a run's app-level failure: the running runs are cancelled now)

    def start(seat: Any, job: PreparedRun | None = None) -> PreparedRun | None:
        """Start ``job`` (else the seat's next run) unless the sweep is failing; the run started."""
        started = tasks.start(seat, job) if failure is None else None
        if started is not None:
            watch.heard(started.name)
            progress(f"[{started.name}] started ({started.identity['engine']})")
        return started

    ctrl_c = _CtrlC()
    try:
        while tasks.waiting or tasks.running:
            ctrl_c.check()
            for name, event in tasks.events():
                watch.heard(name)
                if event[0] == "round":
                    board.round(name, event[1])
                elif event[0] == "note":
                    progress(event[1])
            for ref in tasks.ended():
                if ref in tasks.waiting:  # a seed's group is placed: its seats start
                    for seat in tasks.waiting.pop(ref):
                        start(seat)
                    continue
                job, seat, outcome = tasks.outcome(ref)
                if outcome.kind == "lost" and tasks.lost[job.name] <= NODE_RETRIES and failure is None:
                    progress(f"[{job.name}] its node was lost ({outcome.error}): running it again")
                    start(seat, job)
                    continue
                if outcome.kind == "done":
                    write_result(job.result, **outcome.event[1])
                    board.finish(job.name)
                elif outcome.kind != "cancelled" and failure is None:
                    failure = _failure(job, outcome)
                    if app_failure(outcome.event):
                        halt = job.name
                    else:
                        progress(f"[{job.name}] failed: the sweep stops once its running runs end")
                if outcome.kind in ("done", "failed", "crashed") or job.name in stalled:
                    shutil.rmtree(job.staging, ignore_errors=True)  # (nothing left to continue)
                if start(seat) is None:
                    tasks.free(seat)
            if halt is not None and tasks.running:
                names = ", ".join(job.name for job, _seat in tasks.running.values())
                progress(f"[{halt}] failed, as every run of this app and settings would: stopping the "
                         f"running runs now, their progress kept ({names})")
                tasks.cancel()
            for job, _seat in list(tasks.running.values()):
                if job.name not in tasks.cancelled and watch.stalled([job.name]):
                    message = stalled_failure(job.name, float(stall_timeout or 0), log_tail(job.staging))
                    failure = failure or message
                    progress(message.splitlines()[0] + "; the sweep stops once its running runs end")
                    stalled.add(job.name)
                    tasks.cancel({job.name})
            if failure is not None and not tasks.running:
                break
    except BaseException as err:
        stopped = tasks.cancel()
        tasks.settle()
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, SweepStopped):
            raise SweepStopped(stopped) from err
        raise
    finally:
        ctrl_c.close()
    tasks.settle()
    if failure is not None:
        raise SweepFailed(failure)


def run_sweep(specs: Iterable[RunSpec], out: str | Path, jobs: int | None = None, recompute: bool = False,
              progress: Progress = print, flwr_timeout: float = 3600.0,
              stall_timeout: float | None = None, lock: SweepLock | None = None, address: str | None = None,
              gpus_per_run: float = 0.0) -> list[Path]:
    """Run ``specs`` into ``out`` (see the module docstring); the result files, in the specs' order.

    ``jobs``: runs at once on the batched Grid, each with ``cores // jobs``
    CPUs and threads; ``None``: :func:`~.slots.default_jobs` for the runs to do.
    ``address``: the Ray cluster to run them on (:func:`~.dispatch.ray_session`;
    ``None``: ``RAY_ADDRESS``, else a local Ray); ``gpus_per_run``: the GPUs
    each run reserves (fractions allowed).
    ``stall_timeout``: a batched run that shows no progress for that many
    seconds fails (:mod:`.stall`); ``None``: no limit.
    ``lock``: the :class:`~.store.SweepLock` of ``out`` that the caller holds
    already (compare takes it before it checks and tidies its output
    folder); ``None``: the sweep takes it, and frees it at its end.
    ``ValueError`` before anything runs (an unknown run-config key, a managed
    key overridden, a result file of other settings, two specs of one name,
    another sweep in ``out``); :class:`SweepFailed` when a run failed;
    :class:`SweepStopped` on a Ctrl-C (every run stopped, its progress kept).
    """
    specs = list(specs)
    out = Path(out).resolve()
    _duplicates(specs)
    if lock is not None and lock.path.parent != out:
        raise ValueError(f"the lock held, {str(lock.path)!r}, is not the lock of {str(out)!r}")
    with contextlib.nullcontext() if lock is not None else SweepLock(out):
        prepared = [prepare(spec, out) for spec in specs]
        to_run = plan(prepared, recompute, progress)
        prune_staging(out, {job.name for job in to_run}, log=progress)
        try:
            flwr = [job for job in to_run if job.identity["engine"] == "flwr"]
            if flwr:
                from .flwr_runs import flower_for, run_with_flwr

                with flower_for(out, sorted({job.app.folder for job in flwr})) as flower:
                    for job in flwr:
                        claim_staging(job, progress)
                        try:
                            run_with_flwr(job, flower, flwr_timeout, progress)
                        except Exception as err:
                            shutil.rmtree(job.staging, ignore_errors=True)
                            raise SweepFailed(str(err)) from err
                        shutil.rmtree(job.staging, ignore_errors=True)
            batched = [job for job in to_run if job.identity["engine"] != "flwr"]
            if batched:
                from .dispatch import ray_session

                with ray_session(address, progress):
                    run_tasks(batched, jobs, progress, stall_timeout, gpus_per_run)
        except KeyboardInterrupt as err:  # (a Ctrl-C outside run_tasks: a flwr run, a claim)
            if isinstance(err, SweepStopped):
                raise
            raise SweepStopped([]) from err
        finally:
            remove_empty(out / STAGING)
    return [job.result for job in prepared]


__all__ = ["NODE_RETRIES", "STOPPED_EXIT", "SweepFailed", "SweepStopped", "app_failure", "plan",
           "run_environment", "run_sweep", "run_tasks"]
