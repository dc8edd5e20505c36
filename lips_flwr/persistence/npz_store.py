"""Named groups of arrays plus JSON metadata in one ``.npz`` file, written atomically.

The format of the strategy checkpoint (:mod:`lips_flwr.persistence.checkpoint`) and of
the clients' persisted state (:mod:`lips_flwr.clients.persist`). Arrays keep
their names, order, dtype and shape (0-d too); the file is read with
``allow_pickle=False``, so loading one never runs code.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, cast

import numpy as np

_META = "__meta__"


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it to ``path``.

    The data is flushed to disk before ``os.replace``, so after a crash (even
    of the machine) ``path`` holds either the old file or the new one, whole.
    The temporary file is ``.<name>.<pid>.<random>``: the writer's process id
    tells a file that a crash left behind from one being written
    (:func:`remove_stale_temporaries`).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temporary_prefix(target))
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def temporary_prefix(path: str | os.PathLike) -> str:
    """``.<name>.<pid>.``: how this process names its temporary files beside ``path``."""
    return f".{Path(path).name}.{os.getpid()}."


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (other than this process)."""
    if pid <= 0 or pid == os.getpid():
        return False  # this process writes one file at a time: its leftovers are stale
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
    """
    target = Path(path)
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
) -> None:
    """Write ``groups`` (group -> name -> array) and ``meta`` (JSON-able) to ``path`` atomically."""
    arrays: dict[str, np.ndarray] = {}
    names: dict[str, list[str]] = {}
    for group, tensors in groups.items():
        names[group] = list(tensors)
        for i, tensor in enumerate(tensors.values()):
            arrays[f"{group}/{i}"] = np.asarray(tensor)  # positions: names may hold any character
    header = json.dumps({**meta, "groups": names}).encode("utf-8")
    arrays[_META] = np.frombuffer(header, dtype=np.uint8)
    # Any values: numpy's stub would match a **dict against savez's `allow_pickle: bool`.
    write_atomic(path, lambda f: np.savez(f, **cast(dict[str, Any], arrays)))


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
    "read_groups", "read_meta", "remove_stale_temporaries", "temporary_prefix", "write_atomic",
    "write_groups",
]
