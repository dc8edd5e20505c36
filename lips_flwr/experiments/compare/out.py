"""``lips-flwr compare``'s output folder: what is checked before a sweep writes into it, and the stale report.

Before anything runs (:func:`prepared_sweep`, which compare calls holding
the sweep's lock on ``runs/``: a second compare into the folder is refused
before it removes anything):

- ``--out`` must be a folder compare can write (not a file, not below a
  file, not read-only; ``runs/`` neither), and none of its output names a
  folder (:func:`check_out`);
- every run is resolved (an app's broken ``pyproject.toml`` named);
- a run's result path that is a folder is refused; a result file without
  observations (written before the runner observed runs, or by ``flwr run``)
  cannot give compare its metric: refused, or with ``--recompute`` removed so
  that it runs again (:func:`check_results`);
- a sweep that will run any of ``runs/`` first removes the earlier report
  (:func:`remove_stale_report`).

A refused invocation leaves no folder it made (:func:`made_folders`,
:func:`remove_made`).
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from pathlib import Path

from ...errors import ConfigError, ResultFileError
from ..runner.board import Progress
from ..runner.runs import PreparedRun, RunSpec, prepare
from ..runner.store import read_result
from ..runner.sweep import plan

OUTPUTS = ("summary.json", "report.md", "curves.png", "inertia.png")  # what compare writes beside runs/


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def check_out(out: Path) -> None:
    """``ResultFileError`` naming the path when compare cannot write its results into ``out``."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == out else f"is below {str(existing)!r}, a file"
        raise ResultFileError(f"--out {str(out)!r} {what}: give a folder (compare writes runs/, summary.json "
                              "and report.md into it)")
    if not _writable(existing):
        raise ResultFileError(f"--out {str(out)!r}: {str(existing)!r} is not writable: give a folder you "
                              "can write")
    runs = out / "runs"
    if runs.exists() and (not runs.is_dir() or not _writable(runs)):
        why = "is not a folder" if not runs.is_dir() else "is read-only"
        raise ResultFileError(f"{str(runs)!r} {why}: compare writes its runs there; make it writable, or "
                              "give another --out")
    for name in OUTPUTS:
        if (out / name).is_dir():
            raise ResultFileError(f"{str(out / name)!r} is a folder where compare writes its {name}: move "
                                  "it away, or give another --out")


def made_folders(path: Path) -> list[Path]:
    """The folders from ``path`` up that do not exist yet (the deepest first): what a sweep would make."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_made(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that exists and is empty."""
    for folder in folders:
        with contextlib.suppress(OSError):  # (not there, or not empty: a run's staging is kept)
            folder.rmdir()


def prepare_all(specs: list[RunSpec], runs: Path) -> list[PreparedRun]:
    """:func:`~..runner.runs.prepare` each spec; an app's unreadable ``pyproject.toml`` named with its
    error."""
    out = []
    for spec in specs:
        try:
            out.append(prepare(spec, runs))
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{str(Path(spec.app).resolve() / 'pyproject.toml')!r} is not valid TOML: "
                              f"{err}") from err
    return out


def check_results(prepared: list[PreparedRun], recompute: bool, progress: Progress) -> None:
    """Refuse a result path that is a folder, and a result file compare cannot read its metric from.

    A result file without observations (``observed`` null: written before the
    runner observed runs, or by ``flwr run``) is removed under ``recompute``,
    so that the sweep runs it again; otherwise ``ResultFileError`` lists them.
    """
    blind = []
    for job in prepared:
        if job.result.is_dir():
            raise ResultFileError(f"{str(job.result)!r} is a folder where the result file of run {job.name} "
                                  "goes: move it away, or give another --out")
        if not job.result.is_file():
            continue
        try:
            found = read_result(job.result)
        except ValueError:
            continue  # (the sweep refuses it, or replaces it under --recompute, naming why)
        if found.observed is None:
            blind.append(job)
    if blind and not recompute:
        raise ResultFileError("these result files hold no per-round observations (written before the "
                              "runner observed runs, or by `flwr run`), so compare cannot read its metric "
                              "from them: "
                              + ", ".join(repr(str(job.result)) for job in blind)
                              + "; --recompute runs them again and replaces them")
    for job in blind:
        progress(f"[{job.name}] recomputing {str(job.result)!r}: it holds no per-round observations")
        job.result.unlink()


def remove_stale_report(prepared: list[PreparedRun], out: Path, recompute: bool, progress: Progress) -> None:
    """Remove ``out``'s report files before a sweep that will run (and so write) any of ``runs/``.

    A report left beside result files that a sweep has replaced would describe
    other runs than those beside it, should the sweep or the report then fail.
    A sweep that only reuses its runs leaves the report in place; one that
    would be refused raises here, as the sweep would (nothing is removed).
    """
    present = [name for name in OUTPUTS if (out / name).exists()]
    if not present or not plan(prepared, recompute, lambda line: None):
        return
    progress(f"removing the report of earlier runs from {str(out)!r} ({', '.join(present)}): this sweep "
             "replaces or adds runs")
    for name in present:
        (out / name).unlink()


def prepared_sweep(specs: list[RunSpec], out: Path, recompute: bool, progress: Progress) -> None:
    """Every check before compare's sweep (see the module docstring); ``LipsError`` naming what is wrong."""
    check_out(out)
    prepared = prepare_all(specs, out / "runs")
    check_results(prepared, recompute, progress)
    remove_stale_report(prepared, out, recompute, progress)


__all__ = ["OUTPUTS", "check_out", "check_results", "made_folders", "prepare_all", "prepared_sweep",
           "remove_made", "remove_stale_report"]
