"""Which code computed a run, and where: the code identity and the provenance record of a result file.

The *code identity* (:func:`code_identity`) is part of a run's identity: the
package version and a digest of every ``.py`` file of ``lips_flwr``, so a
result computed by other code is never reused. The *provenance*
(:func:`provenance`) says where and how the run was computed (the git commit
of a checkout, versions, the machine, threads, times), without deciding
whether it is reused. Two runs meant to be paired compare their provenance
with :func:`same_environment`.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import platform
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lips_flwr

PACKAGE = Path(lips_flwr.__file__).resolve().parent
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# What makes two runs' arithmetic alike: the same libraries, instruction set, threads and engine.
ENVIRONMENT_KEYS = ("python", "numpy", "torch", "flwr", "cpu_flags", "gpu", "threads", "engine")


@functools.lru_cache(maxsize=1)
def code_identity() -> dict[str, str]:
    """``{"lips_flwr": version, "source": SHA-256 of the package's .py files (paths and contents)}``.

    Computed once per process; :func:`code_identity_now` reads the files again.
    """
    return code_identity_now()


def code_identity_now() -> dict[str, str]:
    """:func:`code_identity` from the files on disk now (a run's process checks it against its identity's)."""
    files = [path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts]
    return {"lips_flwr": lips_flwr.__version__, "source": tree_digest(PACKAGE, files)}


def tree_digest(root: Path, files: Iterable[Path],
                content: Callable[[Path], bytes] = Path.read_bytes) -> str:
    """SHA-256 of ``files`` under ``root``: each one's path relative to ``root`` and its ``content``, by path.

    The one digest of a tree of files: ``lips_flwr``'s code identity (bytes
    as they are) and an app's digest (its code without comments or
    docstrings: :func:`~.apps.code_content`).
    """
    digest = hashlib.sha256()
    for path in sorted(set(files)):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + content(path) + b"\0")
    return digest.hexdigest()


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(PACKAGE.parent), *args], capture_output=True, text=True,
                              timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_state() -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the checkout ``lips_flwr`` is imported from; ``None`` outside one.

    ``dirty``: a tracked file of the checkout differs from the commit (files
    git does not track, such as results folders, do not count).
    """
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != PACKAGE.parent:
        return None  # an installed package, or a checkout that is not this package's
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return None
    return {"commit": commit, "dirty": bool(status)}


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, str | None]:
    """The CPU's model name and flags (one string) from ``/proc/cpuinfo``; the machine type elsewhere."""
    model = flags = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key in ("flags", "Features") and flags is None:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(), "flags": flags}


def versions() -> dict[str, str]:
    import flwr
    import numpy
    import torch

    return {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "flwr": flwr.__version__}


def now_utc() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def provenance(engine: str, started: str, wall_seconds: float | None, **extra: Any) -> dict[str, Any]:
    """The provenance record of a run that started at ``started`` and took ``wall_seconds`` (the module).

    ``threads``: torch's intra-op threads and the thread variables of numpy's and torch's BLAS/OpenMP.
    """
    import torch

    info, gpu = cpu(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    threads = {"torch": torch.get_num_threads(), **{name: os.environ.get(name) for name in THREAD_VARIABLES}}
    return {"lips_flwr": lips_flwr.__version__, "git": git_state(), **versions(),
            "platform": platform.platform(), "cpu": info["model"], "cpu_flags": info["flags"],
            "gpu": gpu, "engine": engine, "threads": threads, "started": started,
            "wall_seconds": None if wall_seconds is None else round(wall_seconds, 3), **extra}


def same_environment(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[bool | None, list[str]]:
    """Whether two runs (each in all its segments) ran in one environment; the keys that differ.

    ``(None, [])`` when either has no provenance (a file written before it was recorded).
    """
    if a is None or b is None:
        return None, []
    segments = [a, *a.get("earlier_segments", []), b, *b.get("earlier_segments", [])]
    differing = [key for key in ENVIRONMENT_KEYS if len({repr(s.get(key)) for s in segments}) > 1]
    return not differing, differing


__all__ = ["code_identity", "code_identity_now", "git_state", "now_utc", "provenance",
           "same_environment", "tree_digest"]
