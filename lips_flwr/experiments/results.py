"""Files written atomically, so a crash never leaves half a file."""

from __future__ import annotations

import json
import os
from typing import Any

from ..persistence.npz_store import write_atomic


def _plain(value: Any) -> Any:
    """JSON fallback for numpy scalars and other odd values."""
    return value.item() if hasattr(value, "item") else str(value)



def write_json_atomic(path: str | os.PathLike, payload: dict) -> None:
    """Write ``payload`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    text = json.dumps(payload, indent=2, sort_keys=True, default=_plain)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


__all__ = ["write_json_atomic"]
