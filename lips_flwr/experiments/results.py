"""Files written atomically, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import IO, Any

from ..persistence.npz_store import remove_stale_temporaries, write_atomic


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and other odd values."""
    return value.item() if hasattr(value, "item") else str(value)


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else by setting it back at once."""
    try:
        found = re.search(r"^Umask:\s*([0-7]+)", Path("/proc/self/status").read_text(), re.MULTILINE)
    except OSError:
        found = None
    if found:
        return int(found.group(1), 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``: the old file or the new, whole.

    The file gets a normal file's mode (``0o666 & ~umask``, e.g. 0644), not the
    0600 of the temporary file it is renamed from, set before it takes the name.
    Temporary files of this name that a killed writer left are removed
    (:func:`~lips_flwr.persistence.npz_store.remove_stale_temporaries`): a run
    stopped mid-write and continued leaves nothing behind.
    """
    mode = 0o666 & ~_umask()

    def write(f: IO[bytes]) -> None:
        f.write(data)
        if hasattr(os, "fchmod"):  # POSIX
            os.fchmod(f.fileno(), mode)

    write_atomic(path, write)
    remove_stale_temporaries(path, pid_only=True)


def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (:func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=_plain).encode("utf-8"))


__all__ = ["write_bytes_atomic", "write_json_atomic"]
