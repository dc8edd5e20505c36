"""Result files, staging folders and the sweep lock of an output folder.

A sweep writes each finished run to ``<out>/<name>.json`` (atomically, only
when the run has finished):

    {"format": "lips-flwr-result/1",
     "identity": {...},    # everything that decides the run's numbers (runs.py)
     "provenance": {...},  # where and how it was computed (provenance.py)
     "observed": {...},    # what the runner saw through the Grid (observe.py), null under flwr run
     "app": {...}}         # the app's own results JSON (its run config's results-path), else null

:func:`read_result` reads these and the results files of earlier sessions,
which are the paper app's own JSON (``run_config``, ``rounds``, ``summary``
at the top level) without identity or provenance.

A run works in ``<out>/.staging/<name>/`` (``identity.json`` first; the
app's results file, checkpoint and client state; the runner's partial
observations and its copy of the clients' state, :mod:`.resume`; its log),
removed once the result file is written or the run failed; a stopped run's
folder stays (:func:`prune_staging`). :class:`SweepLock` keeps a second
sweep out of a folder that a live sweep writes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ResultFileError
from ...persistence.lock import _try_lock
from ..results import write_json_atomic
from .apps import planned_identity

FORMAT = "lips-flwr-result/1"
STAGING = ".staging"
IDENTITY = "identity.json"  # a staging folder's first file: the identity it was claimed with
LOCK = ".sweep.lock"
LOG = "log"  # a run's output, in its staging folder
SEGMENTS = "segments.json"  # in a staging folder: the provenance of each process that worked on the run
OBSERVED, LAST_GLOBAL = "observed.json", "last-global.npz"  # the observer's partial record, last model
LOG_TAIL = 3000  # characters of a run's log in its error


@dataclass(frozen=True)
class Result:
    """One result file as read by :func:`read_result` (``identity``/``provenance`` ``None`` for old files)."""

    path: Path
    identity: dict | None
    provenance: dict | None
    observed: dict | None
    app: dict | None

    @property
    def run_config(self) -> dict:
        """The run's config: the identity's, else the app record's (old files)."""
        if self.identity is not None:
            return dict(self.identity["run_config"])
        return dict((self.app or {}).get("run_config", {}))


def read_result(path: str | Path) -> Result:
    """Read a result file, new (``format``) or of an earlier session (the app's JSON as it is).

    ``ValueError`` naming the file when it is neither.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{str(path)!r} is not a readable result file: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} is not a result file (a JSON {type(data).__name__})")
    if data.get("format") == FORMAT:
        missing = [key for key in ("identity", "provenance") if not isinstance(data.get(key), dict)]
        if missing:  # (a KeyError here stopped every sweep into the folder, --recompute too)
            raise ResultFileError(f"{str(path)!r} is a damaged result file: no {' and no '.join(missing)}")
        return Result(path, data["identity"], data["provenance"], data.get("observed"), data.get("app"))
    if "format" in data:
        raise ValueError(f"{str(path)!r} has format {data['format']!r}; this version reads {FORMAT!r}")
    if "run_config" in data:
        return Result(path, None, None, None, data)
    raise ValueError(f"{str(path)!r} is not a result file: no format, no run_config")


def write_result(path: str | Path, identity: dict, provenance: dict, observed: dict | None,
                 app: dict | None) -> None:
    """Write a finished run's result file atomically."""
    write_json_atomic(path, {"format": FORMAT, "identity": identity, "provenance": provenance,
                             "observed": observed, "app": app})


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out if out or not prefix else {prefix: {}}
    return {prefix: value}


def differences(found: dict, wanted: dict) -> list[str]:
    """``"key: file X, now Y"`` for each dotted key whose value differs (``(none)`` where one lacks it)."""
    a, b = _flat(json.loads(json.dumps(found))), _flat(json.loads(json.dumps(wanted)))
    show = {key: (json.dumps(a[key]) if key in a else "(none)", json.dumps(b[key]) if key in b else "(none)")
            for key in sorted(set(a) | set(b)) if a.get(key, _MISSING) != b.get(key, _MISSING)}
    return [f"{key}: file {x}, now {y}" for key, (x, y) in show.items()]


_MISSING = object()


def check_name(name: str) -> str:
    """``name`` if it is a relative result name (``a``, ``conf/a``); ``ValueError`` otherwise."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(not p or p in (".", "..") or p.startswith(".") for p in parts):
        raise ValueError(f"result name {name!r} must be a relative path of plain names (no '.', '..', "
                         "empty or hidden parts)")
    return name


def result_path(out: Path, name: str) -> Path:
    return out / f"{name}.json"


def staging_path(out: Path, name: str) -> Path:
    return out / STAGING / name


def log_tail(staging: Path) -> str:
    """The last :data:`LOG_TAIL` characters of a run's log, where this machine sees its staging folder."""
    try:
        return (staging / LOG).read_text(errors="replace")[-LOG_TAIL:]
    except OSError:
        return "(no log on this machine)"


def staged_identity(folder: Path) -> dict | None:
    """The identity a staging folder was claimed with; ``None`` when its file is missing or unreadable."""
    try:
        saved = json.loads((folder / IDENTITY).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _finished(out: Path, name: str, identity: dict) -> bool:
    """Whether ``<out>/<name>.json`` is a finished result of ``identity`` (its run ended after writing it)."""
    try:
        found = read_result(result_path(out, name)).identity
        return found is not None and planned_identity(found) == identity  # (less its run's modules)
    except ValueError:
        return False


def prune_staging(out: Path, running: set[str], log: Any = print) -> None:
    """Tidy ``<out>/.staging`` at a sweep's start; each folder removed or kept is logged.

    A folder with a readable ``identity.json`` is a run's staging folder:

    - ``running`` names it (this sweep runs it): left to :func:`~.sweep.claim_staging`;
    - ``<out>/<name>.json`` is a finished result of its identity (the run was
      stopped after writing its result): removed;
    - otherwise it is a stopped run's progress: kept, for a sweep that runs
      ``name`` with its identity to continue (another identity replaces it then).

    Anything else (a folder with no readable identity file below it, a loose
    file) was left by a run stopped as its folder was being made: removed.
    """
    root = out / STAGING
    if not root.is_dir():
        return

    def walk(folder: Path, rel: str) -> None:
        for entry in sorted(folder.iterdir()):
            name = f"{rel}/{entry.name}" if rel else entry.name
            identity = staged_identity(entry) if entry.is_dir() else None
            if identity is not None:
                if name in running:
                    continue
                if not _finished(out, name, identity):
                    log(f"keeping {str(entry)!r}: a stopped run's staging, continued when a sweep runs "
                        f"{name!r} with its settings again")
                    continue
                why = "its run finished (its result file is written)"
            elif entry.is_dir() and (entry / IDENTITY).exists():
                why = "its identity file is unreadable (a run stopped as its folder was made)"
            elif entry.is_dir() and any(staged_identity(p.parent) is not None for p in entry.rglob(IDENTITY)):
                walk(entry, name)  # a folder of runs' staging folders (``conf/`` of ``conf/a-seed0``)
                continue
            else:
                why = "no identity file (a run stopped as its folder was made)"
            log(f"removing {str(entry)!r}: {why}")
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    walk(root, "")
    remove_empty(root)


def remove_empty(root: Path) -> None:
    """Remove ``root`` and its folders, bottom up, as far as they are empty."""
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if not any(root.iterdir()):
        root.rmdir()


class SweepLock:
    """``<out>/.sweep.lock``: an ``flock`` held while a sweep writes ``out`` (freed with its process).

    ``ValueError`` naming the holder's pid when another live sweep holds it.
    The file is removed on :meth:`release`.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK
        out.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_lock(fd):
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise ValueError(f"{str(out)!r} is in use by another sweep (pid {holder}, "
                                 f"{str(self.path)!r}): wait for it to end, or give this sweep another "
                                 "output folder")
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:  # (else the holder removed the file as we locked it: take the new one)
                self._fd = fd
            else:
                os.close(fd)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SweepLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["FORMAT", "IDENTITY", "Result", "SweepLock", "check_name", "differences", "prune_staging",
           "read_result", "result_path", "staged_identity", "staging_path", "write_result"]
