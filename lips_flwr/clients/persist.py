"""A client's LIPS and FedBN state on its own disk, so that a resumed server run continues with it.

``context.state`` lives as long as a Flower run. A server resumed from its
checkpoint runs as a *new* Flower run, whose contexts start empty: without
more, FedBN clients would restart from the global batch-norm tensors and
client-mode clients from the magnitude fallback. With a state folder, named
``lips-state-dir`` in the SuperNode's node config (``--node-config
"lips-state-dir='/var/lib/lips'"``) or in the run config (simulation), and a
LIPS strategy that checkpoints (it sends the run's ``lips-run-key``), each
client writes those records after every training to
``<folder>/lips-client-<run key>-<partition id or node id>.npz`` and reads them
back when a run with the same key finds its context empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import log

from ..npz_store import read_groups, write_groups
from ..records import numpy_to_record, record_to_numpy
from ..sparsifier import KEY_RUN
from .state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY

STATE_DIR_KEY = "lips-state-dir"
PERSISTED = (SIGNAL_KEY, SIGNAL_ROUND_KEY, LOCAL_KEY)
FORMAT = "lips-flwr-client-state"
_RUN_KEY = re.compile(r"[0-9a-f]{32}")  # what the strategies send: also keeps paths inside the folder


def state_path(context: Context, config: Mapping) -> Path | None:
    """Where this client keeps its state for the run named in ``config``; ``None``: nowhere."""
    folder = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    key = config.get(KEY_RUN)
    if not folder or key is None:
        return None
    if not isinstance(key, str) or not _RUN_KEY.fullmatch(key):
        log(WARNING, "LIPS: malformed %s %r from the server: client state not kept on disk",
            KEY_RUN, key)
        return None
    who = context.node_config.get("partition-id", context.node_id)
    return Path(str(folder)) / f"lips-client-{key}-{who}.npz"


def load_state(state: RecordDict, path: Path | None) -> bool:
    """Fill an empty ``state`` from ``path``; whether it did. A damaged file is logged and ignored."""
    if path is None or any(key in state for key in PERSISTED) or not path.exists():
        return False
    try:
        groups, meta = read_groups(path, "LIPS client state")
        if meta.get("format") != FORMAT:
            raise ValueError(f"{str(path)!r} is not a LIPS client state file")
    except ValueError as err:
        log(WARNING, "LIPS: client state not restored: %s", err)
        return False
    for key, arrays in groups.items():
        state[key] = numpy_to_record(arrays)
    for key, values in meta.get("configs", {}).items():
        state[key] = ConfigRecord(values)
    log(INFO, "LIPS: client state restored from %s", path)
    return True


def save_state(state: RecordDict, path: Path | None) -> None:
    """Write the LIPS/FedBN records of ``state`` to ``path`` (atomically), if there are any."""
    if path is None:
        return
    present = [key for key in PERSISTED if key in state]
    groups = {k: record_to_numpy(state[k]) for k in present if isinstance(state[k], ArrayRecord)}
    configs = {k: dict(state[k]) for k in present if isinstance(state[k], ConfigRecord)}
    if groups or configs:
        write_groups(path, groups, {"format": FORMAT, "configs": configs})
