"""Files written atomically, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and other odd values."""
    return value.item() if hasattr(value, "item") else str(value)


def write_atomic(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it to ``path``.

    The data is flushed to disk before ``os.replace``, so after a crash (even
    of the machine) ``path`` holds either the old file or the new one, whole.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    text = json.dumps(payload, indent=2, sort_keys=True, default=_plain)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))
