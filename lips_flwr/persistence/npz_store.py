"""Named groups of arrays plus JSON metadata in one ``.npz`` file, written atomically.

The format of the strategy checkpoint (:mod:`lips_flwr.persistence.checkpoint`) and of
the clients' persisted state (:mod:`lips_flwr.clients.persist`). Arrays keep
their names, order, dtype and shape (0-d too); the file is read with
``allow_pickle=False``, so loading one never runs code.

Writers of one path take turns. Between processes nothing needs to wait:
each writes its own temporary file (its process id and a random part in the
name) and renames it into place, which the OS does atomically, and a process
removes only the temporaries of processes that are gone. Within a process the
process id no longer tells writers apart, so :func:`write_atomic` and
:func:`remove_stale_temporaries` hold a per-path lock (:func:`path_lock`):
one thread's cleanup never removes another's temporary mid-write.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import numpy as np

from .npz_writer import write_npz

_META = "__meta__"


class _PathLock:
    """A re-entrant lock for one path (a class: a bare lock cannot be weakly referenced)."""

    __slots__ = ("__weakref__", "lock")

    def __init__(self) -> None:
        self.lock = threading.RLock()


# Path -> its lock while some thread holds or waits for it; then collected.
_PATH_LOCKS: weakref.WeakValueDictionary[str, _PathLock] = weakref.WeakValueDictionary()
_PATH_LOCKS_GUARD = threading.Lock()


def _forget_path_locks() -> None:
    """In a forked child: fresh locks (one held by a thread that did not follow would never free)."""
    global _PATH_LOCKS, _PATH_LOCKS_GUARD
    _PATH_LOCKS, _PATH_LOCKS_GUARD = weakref.WeakValueDictionary(), threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_path_locks)


@contextmanager
def path_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold this process's lock on ``path``: its writes and cleanups, one thread at a time.

    Re-entrant (a save may hold it around :func:`write_atomic` and
    :func:`remove_stale_temporaries`, which take it too). Keyed by the real
    path of the folder and the file's name: the temporaries sit beside the
    name, whatever a link at it points to.
    """
    target = Path(path)
    key = os.path.join(os.path.realpath(target.parent), target.name)
    with _PATH_LOCKS_GUARD:
        entry = _PATH_LOCKS.get(key)
        if entry is None:
            entry = _PATH_LOCKS[key] = _PathLock()
    with entry.lock:  # ``entry`` keeps the lock alive while held
        yield


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> os.stat_result:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it to ``path``; the
    ``os.stat_result`` of the file written, taken before the rename (which keeps its inode, size
    and times): what another writer puts at ``path`` afterwards has another.

    The data is flushed to disk before ``os.replace``, so after a crash (even
    of the machine) ``path`` holds either the old file or the new one, whole.
    The temporary file is ``.<name>.<pid>.<random>``: the writer's process id
    tells a file that a crash left behind from one being written
    (:func:`remove_stale_temporaries`). Threads of this process writing
    ``path`` take turns (:func:`path_lock`); other processes need not.
    """
    target = Path(path)
    with path_lock(target):
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temporary_prefix(target))
        except FileNotFoundError:  # (the folder made when missing only: a write of each round costs no mkdir)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temporary_prefix(target))
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
                written = os.fstat(f.fileno())
            os.replace(tmp, target)
            return written
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def temporary_prefix(path: str | os.PathLike) -> str:
    """``.<name>.<pid>.``: how this process names its temporary files beside ``path``."""
    return f".{Path(path).name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (other than this process)."""
    if pid <= 0 or pid == os.getpid():
        return False  # this process's writers of a path take turns (path_lock): leftovers are stale
    if sys.platform == "win32":
        return True  # os.kill would terminate it: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike, *, pid_only: bool = False) -> None:
    """Remove the temporary files beside ``path`` that no running writer will finish.

    ``.<name>.<pid>.<random>`` goes when process ``pid`` is gone (or is this
    one: after a restart it may have the dead writer's pid, and it writes one
    file at a time); a file of a live process is another writer's, mid-write,
    and stays. ``.<name>.<random>`` (no pid: checkpoint temporaries written
    before pids were in the names) goes too, unless ``pid_only``: beside a
    results file that form may be someone's own file (``.<name>.partial``).
    This process's lock on ``path`` (:func:`path_lock`) is held meanwhile, so
    no thread of it is writing one of those files.
    """
    target = Path(path)
    with path_lock(target):
        for stale in target.parent.glob(f".{glob.escape(target.name)}.*"):
            rest = stale.name[len(target.name) + 2:]
            match = _TEMPORARY.fullmatch(rest)
            if match is not None and _alive(int(match.group(1))):
                continue
            if match is None and ("." in rest or pid_only):
                continue  # another file's temporary (``.<name>.history.jsonl.<pid>.<random>``)
            stale.unlink(missing_ok=True)


_TEMPORARY = re.compile(r"(\d+)\.[A-Za-z0-9_]+")


def write_groups(
    path: str | os.PathLike, groups: Mapping[str, Mapping[str, np.ndarray]], meta: Mapping
) -> os.stat_result:
    """Write ``groups`` (group -> name -> array) and ``meta`` (JSON-able) to ``path`` atomically;
    the written file's ``os.stat_result`` (:func:`write_atomic`)."""
    arrays: dict[str, np.ndarray] = {}
    names: dict[str, list[str]] = {}
    for group, tensors in groups.items():
        names[group] = list(tensors)
        for i, tensor in enumerate(tensors.values()):
            arrays[f"{group}/{i}"] = np.asarray(tensor)  # positions: names may hold any character
    header = json.dumps({**meta, "groups": names}).encode("utf-8")
    arrays[_META] = np.frombuffer(header, dtype=np.uint8)
    return write_atomic(path, lambda f: write_npz(f, arrays))


def _load(path: str | os.PathLike, what: str, arrays: bool) -> tuple[dict[str, np.ndarray], dict]:
    """``(files, meta)`` of ``path``; ``files`` empty unless ``arrays`` (npz members load lazily)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {str(path)!r}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz[_META].tobytes().decode("utf-8"))
            files = {name: npz[name] for name in npz.files if name != _META} if arrays else {}
        if not isinstance(meta, dict) or not isinstance(meta["groups"], dict):
            raise ValueError("malformed metadata")
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError,
            UnicodeDecodeError, RecursionError) as err:  # RecursionError: JSON nested too deep
        raise ValueError(f"{str(path)!r} is not a readable {what}: {err!r}") from err
    return files, meta


def read_meta(path: str | os.PathLike, what: str) -> dict:
    """Only the metadata of a file written by :func:`write_groups` (no array is read)."""
    return _load(path, what, arrays=False)[1]


def read_groups(path: str | os.PathLike, what: str) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """Read a file written by :func:`write_groups`: ``(groups, meta)``.

    Raises ``FileNotFoundError`` when there is no file, and ``ValueError``
    naming ``what`` the file should be when it is unreadable or damaged.
    """
    files, meta = _load(path, what, arrays=True)
    groups = {}
    for group, members in meta["groups"].items():
        try:
            groups[group] = {name: files[f"{group}/{i}"] for i, name in enumerate(members)}
        except (KeyError, TypeError) as err:
            raise ValueError(f"{str(path)!r} is damaged: {group!r} lacks {err}") from err
    return groups, meta


__all__ = [
    "path_lock", "read_groups", "read_meta", "remove_stale_temporaries", "temporary_prefix",
    "write_atomic", "write_groups",
]
