"""One run on the batched Grid, in a process of its own: what the sweep's run processes execute.

:func:`run_process` is the entry of a fresh process (``multiprocessing``
spawn): its output goes to the run's log in the staging folder, progress
and the outcome go to the sweep through a pipe. The app is imported in this
process (inside ``forced_options(tau0=0.0)`` for a LIPS-off arm, so that a
LIPS strategy built at import time is forced too), so no module state of one
run (an app's caches, ``torch.set_num_threads``, a module-level strategy)
reaches another. The process dies with the sweep (Linux: ``PR_SET_PDEATHSIG``).

The sweep computed the run's identity before its runs; this process, started
later, imports whatever code is on disk then. Once the app's components are
imported, the app's digest and ``lips_flwr``'s code identity are read again:
a run whose code changed fails, naming what changed. A LIPS-off run fails
before its first train instruction reaches a client when the app built no
LIPS strategy under the forcing (it would run as written).

The process works in the run's staging folder (its ``cwd``), with the
threads the sweep set in its environment (:func:`_settle_in`).

A run that fails (an exception, ``SystemExit`` included) sends its error and
the first client error, and removes its staging folder; a signal or a
Ctrl-C (exit status :data:`STOPPED_EXIT`) leaves the folder for a
later sweep to resume.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Message, MessageType

from ..results import write_json_atomic
from .apps import app_digest, loaded_modules, with_modules
from .observe import RunFailed, RunObserver
from .provenance import code_identity_now, now_utc, provenance
from .resume import ClientContexts
from .runs import LIPS_OFF, MANAGED_KEYS, MODULES, PreparedRun
from .stall import heartbeat
from .store import write_result

if TYPE_CHECKING:
    from ...strategies.options import Forcing

SEGMENTS = "segments.json"  # the provenance of each process that worked on a resumed run
STOPPED_EXIT = 130  # a run process's exit status after a Ctrl-C (128 + SIGINT, as a shell reports it)


def _die_with_parent(parent: int) -> None:
    """Be killed when the sweep's process dies (Linux); exit at once if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _redirect_output(log: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``log``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _app_record(job: PreparedRun) -> dict[str, Any] | None:
    """The app's own results JSON (its results-path in the staging folder), if it wrote one."""
    path = job.run_config.get("results-path")
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        print(f"runner: the app wrote no readable results file at {path!r}", flush=True)
        return None


def _segments(job: PreparedRun, resuming: bool, started: str) -> list[dict[str, Any]]:
    """The provenance of the earlier processes of a resumed run; this one's is added for a later one.

    A process that was stopped never learnt its wall time: its ``wall_seconds`` is ``None``.
    """
    path = job.staging / SEGMENTS
    earlier: list[dict[str, Any]] = []
    if resuming:
        with contextlib.suppress(OSError, ValueError, KeyError):
            earlier = list(json.loads(path.read_text())["segments"])
    mine = provenance(job.identity["engine"], started, None, **_extra(job))
    write_json_atomic(path, {"segments": [*earlier, mine]})
    return earlier


def _extra(job: PreparedRun) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if job.locations:
        extra["locations"] = job.locations
    if job.spec.chunk_size is not None:
        extra["chunk_size"] = job.spec.chunk_size
    return extra


def check_code(job: PreparedRun) -> None:
    """``RunFailed`` naming each part of the run's code that differs on disk from its identity's."""
    now = {"app.digest": app_digest(job.app), **{f"code.{k}": v for k, v in code_identity_now().items()}}
    then = {"app.digest": job.identity["app"]["digest"],
            **{f"code.{k}": v for k, v in job.identity["code"].items()}}
    changed = [f"{key}: {then.get(key)} when the sweep started, {value} now" for key, value in now.items()
               if then.get(key) != value]
    if changed:
        raise RunFailed("the code changed on disk since the sweep started (" + "; ".join(changed) + "): this "
                        "run would not be what its identity says; run the sweep again")


NO_LIPS = ("no LIPS strategy was built by the app: the LIPS-off arm would be the app as written; give each "
           "arm its settings with --a/--b")


class LipsOffCheck:
    """The Grid's observer for a LIPS-off run: the :class:`RunObserver`, and a check before training.

    When the first train instruction is pushed, a LIPS strategy must have been
    built under the forcing (``forcing.strategies_built``), else ``RunFailed``
    (:data:`NO_LIPS`) before any client trains. :meth:`check` is the same
    check, for the end of a run (a legacy app's strategy swallows an error
    raised in its message threads).
    """

    def __init__(self, observer: RunObserver, forcing: Forcing) -> None:
        self.observer, self.forcing = observer, forcing

    def check(self) -> None:
        if self.forcing.strategies_built == 0:
            raise RunFailed(NO_LIPS)

    def pushed(self, messages: Sequence[Message]) -> None:
        if any(m.metadata.message_type.split(".")[0] == MessageType.TRAIN for m in messages):
            self.check()
        self.observer.pushed(messages)

    def replied(self, replies: Sequence[Message]) -> None:
        self.observer.replied(replies)


def execute(job: PreparedRun, resuming: bool, observer: RunObserver,
            on_call: Callable[[], None] | None = None) -> None:
    """Run ``job`` on the batched Grid, write its result file; ``RunFailed`` or the app's error on failure.

    ``on_call``: the Grid's, called as each client call ends (the heartbeat of :mod:`.stall`).
    A resumable run's clients' state is kept by :class:`~.resume.ClientContexts`
    (and given back to a continued run); the result's provenance says from
    which round a continued run went on (``resumed_from_round``, ``None``
    for a run done in one go).
    """
    from ...strategies import forced_options
    from ..batched import run_batched
    from .apps import import_components

    started, start = now_utc(), time.perf_counter()
    earlier = _segments(job, resuming, started)
    if resuming:
        observer.resume_from(job.staging)
    with forced_options(**LIPS_OFF) if job.spec.lips_off else contextlib.nullcontext() as forcing:
        server_app, client_app = import_components(job.app)
        check_code(job)
        imported = loaded_modules(job.app)  # (their code as imported, whatever is edited during the run)
        write_json_atomic(job.staging / MODULES, imported)  # (a stopped run's code, for claim_staging)
        watcher: Any = LipsOffCheck(observer, forcing) if forcing is not None else observer
        contexts = ClientContexts(watcher, job.staging, resuming) if job.resumable else None
        run_batched(server_app, client_app, run_config=dict(job.run_config), num_nodes=job.spec.num_nodes,
                    engine=job.identity["engine"], chunk_size=job.spec.chunk_size,
                    observer=contexts or watcher, seed=job.spec.seed, on_call=on_call,
                    on_grid=contexts.attach if contexts else None)
    if isinstance(watcher, LipsOffCheck):
        watcher.check()
    observer.check(job.spec.require_evaluate)
    record = provenance(job.identity["engine"], started, time.perf_counter() - start, **_extra(job))
    restored = contexts.restored_from if contexts else None
    record["resumed_from_round"] = None if restored is None else restored + 1
    if earlier:
        record["earlier_segments"] = earlier
    identity = with_modules(job.identity, {**loaded_modules(job.app), **imported})
    write_result(job.result, identity, record, {**observer.record(), "first_error": observer.first_error},
                 _app_record(job))


def inputs_made_absolute(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``config`` with each relative path that exists under ``folder`` made absolute.

    A run works in its staging folder, not in the folder the sweep was
    started from: ``data-path='data/train.npz'`` still reads that file. Only
    a string with a path separator counts as a path (``"data/train.npz"``,
    ``"./mnist"``): a bare word is a setting (``dataset = "mnist"`` beside a
    folder ``mnist/`` stays ``"mnist"``). A relative path that does not exist
    there (an output, ``"out/model.pt"``) is left as it is: it lands in the
    run's own folder. Runner-managed keys are the runner's.
    """
    def absolute(value: Any) -> Any:
        if (not isinstance(value, str) or not value.strip() or os.path.isabs(value) or "://" in value
                or not any(sep in value for sep in {"/", os.sep})):
            return value
        try:
            return str((folder / value).resolve()) if (folder / value).exists() else value
        except (OSError, ValueError):  # a name too long, a NUL character: not a path
            return value

    return {key: value if key in MANAGED_KEYS else absolute(value) for key, value in config.items()}


def _settle_in(job: PreparedRun) -> PreparedRun:
    """Work in the run's staging folder, with the threads the sweep gave it, before the app is imported.

    The staging folder as the working directory keeps what an app writes to
    a relative path (``torch.save(model, "final_model.pt")``) with its run,
    never shared by two runs; inputs named in the run config still resolve
    (:func:`inputs_made_absolute`): the job is returned with that run config.
    The sweep sets ``OMP_NUM_THREADS`` (and its kin) in this process's
    environment; torch reads it as it is imported, and is told again here in
    case an earlier import read it differently.
    """
    caller = Path.cwd()
    sys.path[:] = [str(caller / entry) if entry in ("", ".") else entry for entry in sys.path]
    job = dataclasses.replace(job, run_config=inputs_made_absolute(job.run_config, caller))
    os.chdir(job.staging)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    return job


def run_process(job: PreparedRun, resuming: bool, conn: Connection, parent: int) -> None:
    """The entry of a run's process (see the module docstring)."""
    _die_with_parent(parent)
    _redirect_output(job.staging / "log")
    job = _settle_in(job)

    lock = threading.Lock()  # (the heartbeat comes from the stacked engine's client threads too)

    def send(event: tuple) -> None:
        with lock, contextlib.suppress(OSError):
            conn.send(event)

    observer = RunObserver(job.staging, keep_model=job.resumable, on_round=lambda r: send(("round", r)))
    try:
        execute(job, resuming, observer, on_call=heartbeat(lambda: send(("alive",))))
    except KeyboardInterrupt:  # stopped (Ctrl-C reaches every process of the sweep): resumable
        _exit(STOPPED_EXIT)
    except BaseException as err:  # noqa: BLE001 - SystemExit too: a run that fails, reported
        detail = "".join(traceback.format_exception(err))[-4000:]
        send(("failed", f"{type(err).__name__}: {err}", detail, observer.first_error))
        conn.close()
        shutil.rmtree(job.staging, ignore_errors=True)
        _exit(1)
    shutil.rmtree(job.staging, ignore_errors=True)
    send(("done",))
    conn.close()
    _exit(0)


def _exit(code: int) -> None:
    """End the process now, output flushed (not waiting for the app's threads or atexit hooks)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["NO_LIPS", "LipsOffCheck", "check_code", "execute", "inputs_made_absolute", "run_process"]
