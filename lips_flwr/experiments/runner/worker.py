"""One run on the batched Grid, in a Ray worker process of its own: what each task of a sweep executes.

:func:`run_task` is the body of a sweep's Ray task (:mod:`.dispatch`), in a
fresh worker process (``max_calls=1``): its output goes to the run's log in
the staging folder, progress goes to the sweep through ``send`` (an actor's
mailbox), and the outcome is what it returns: the result file's contents
for the sweep's process to write (it alone writes the output folder), or
the run's error. The app is imported in this process (inside
``forced_options(tau0=0.0)`` for a LIPS-off arm, so that a LIPS strategy
built at import time is forced too), so no module state of one run (an
app's caches, ``torch.set_num_threads``, a module-level strategy) reaches
another.

The sweep computed the run's identity before its runs; this process, started
later, imports whatever code is on disk then: :func:`check_code` fails a run
whose code changed.

The staging folder is the sweep's process's to remove (a finished or failed
run's), never the run's: a worker that dies with the sweep (its raylet
gone, an exception on the way out) leaves its progress for the next sweep
to continue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
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
from .store import IDENTITY, LOG, SEGMENTS, log_tail

if TYPE_CHECKING:
    from ...strategies.options import Forcing


@dataclasses.dataclass(frozen=True)
class Place:
    """Where the sweep's process stands, for a run to resolve what it names: its folder, paths and threads.

    ``cwd`` and ``sys_path``: the sweep process's working directory and
    import path (a run's relative inputs and modules resolve as there);
    ``env``: thread variables (and the spec's ``env``) to set before the
    app's imports.
    """

    cwd: str
    sys_path: tuple[str, ...]
    env: dict[str, str]


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


def _segments(job: PreparedRun, resuming: bool, started: str, where: dict[str, Any]) -> list[dict[str, Any]]:
    """The provenance of the earlier processes of a resumed run; this one's is added for a later one.

    A process that was stopped never learnt its wall time: its ``wall_seconds`` is ``None``.
    """
    path = job.staging / SEGMENTS
    earlier: list[dict[str, Any]] = []
    if resuming:
        with contextlib.suppress(OSError, ValueError, KeyError):
            earlier = list(json.loads(path.read_text())["segments"])
    mine = provenance(job.identity["engine"], started, None, **_extra(job), **where)
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
    """``RunFailed`` naming each part of the run's code (the app's digest, ``lips_flwr``'s code identity)
    that differs on disk, once the app's components are imported, from its identity's."""
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
            on_call: Callable[[], None] | None = None, **where: Any) -> dict[str, Any]:
    """Run ``job`` on the batched Grid; its result file's contents, or ``RunFailed`` or the app's error.

    ``where``: what the provenance adds of where the run ran (its node).
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
    earlier = _segments(job, resuming, started, where)
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
    record = provenance(job.identity["engine"], started, time.perf_counter() - start, **_extra(job), **where)
    restored = contexts.restored_from if contexts else None
    record["resumed_from_round"] = None if restored is None else restored + 1
    if earlier:
        record["earlier_segments"] = earlier
    identity = with_modules(job.identity, {**loaded_modules(job.app), **imported})
    return {"identity": identity, "provenance": record,
            "observed": {**observer.record(), "first_error": observer.first_error}, "app": _app_record(job)}


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


def _settle_in(job: PreparedRun, place: Place) -> PreparedRun:
    """Work in the run's staging folder, with the threads the sweep gave it, before the app is imported.

    The staging folder as the working directory keeps what an app writes to
    a relative path (``torch.save(model, "final_model.pt")``) with its run,
    never shared by two runs; inputs named in the run config still resolve
    from the sweep's folder (:func:`inputs_made_absolute`), and modules from
    its import path: the job is returned with that run config. Ray starts
    the worker with ``OMP_NUM_THREADS`` at the task's CPUs (numpy reads it as
    ``lips_flwr`` loads); the others are set here, before torch is imported,
    and torch is told again in case an earlier import read them differently.
    """
    caller = Path(place.cwd)
    sys.path[:0] = [str(caller / entry) if entry in ("", ".") else entry for entry in place.sys_path
                    if entry not in sys.path]
    os.environ.update(place.env)
    job = dataclasses.replace(job, run_config=inputs_made_absolute(job.run_config, caller))
    os.chdir(job.staging)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    return job


def _on_this_node(job: PreparedRun) -> tuple[PreparedRun, str | None]:
    """``job``, or a copy working in a temporary folder where this node does not see its staging folder.

    The sweep's process made the staging folder (with ``identity.json``)
    before it started the run: a node without it has no storage shared with
    the sweep's. The managed paths (checkpoint, client state, the app's
    results) move with it. The second value: the line saying so, or ``None``.
    """
    if (job.staging / IDENTITY).exists():
        return job, None
    local = Path(tempfile.mkdtemp(prefix="lips-flwr-run-"))
    before = str(job.staging)
    config = {key: str(local) + value[len(before):] if isinstance(value, str) and value.startswith(before)
              else value for key, value in job.run_config.items()}
    note = (f"[{job.name}] {socket.gethostname()} does not see the output folder: the run works in "
            f"{str(local)!r} there; stopped, it starts again at round 1")
    return dataclasses.replace(job, staging=local, run_config=config), note


def run_task(job: PreparedRun, resuming: bool, place: Place, send: Callable[[tuple], None],
             node: dict[str, Any]) -> tuple:
    """The body of a run's Ray task (see the module docstring); its outcome.

    ``("done", contents)`` (the result file's ``identity``, ``provenance``,
    ``observed`` and ``app``), ``("failed", error, detail, first client
    error)`` or ``("stopped", end of the log)`` after a Ctrl-C inside the
    run. ``node``: the provenance's record of this node. ``send`` is called
    from the stacked engine's client threads too (the heartbeat): a Ray actor
    handle may be called from any thread.
    """
    job, note = _on_this_node(job)
    if note is not None:
        send(("note", note))
        resuming = False
    _redirect_output(job.staging / LOG)
    job = _settle_in(job, place)
    observer = RunObserver(job.staging, keep_model=job.resumable, on_round=lambda r: send(("round", r)))
    try:
        contents = execute(job, resuming, observer, on_call=heartbeat(lambda: send(("alive",))), node=node)
        return ("done", contents)
    except KeyboardInterrupt:  # a Ctrl-C inside the run: stopped, resumable
        sys.stdout.flush()
        sys.stderr.flush()  # (the log's end is read now)
        return ("stopped", log_tail(job.staging))
    except BaseException as err:  # noqa: BLE001 - SystemExit too: a run that fails, reported
        detail = "".join(traceback.format_exception(err))[-4000:]
        return ("failed", f"{type(err).__name__}: {err}", detail, observer.first_error)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if note is not None:  # (this node's temporary folder; the sweep's staging folder is the sweep's)
            shutil.rmtree(job.staging, ignore_errors=True)


__all__ = ["NO_LIPS", "LipsOffCheck", "Place", "check_code", "execute",
           "inputs_made_absolute", "run_task"]
