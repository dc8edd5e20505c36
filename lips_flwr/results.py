"""Results files: written atomically, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and other odd values."""
    return value.item() if hasattr(value, "item") else str(value)


def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True, default=_plain)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
