"""A client's LIPS and FedBN state on its own disk, so that a resumed server run continues with it.

``context.state`` lives as long as a Flower run. A server resumed from its
checkpoint runs as a *new* Flower run, whose contexts start empty: without
more, FedBN clients would restart from the global batch-norm tensors and
client-mode clients from the magnitude fallback. With a state folder, named
``lips-state-dir`` in the SuperNode's node config (``--node-config
"lips-state-dir='/var/lib/lips'"``) or in the run config (simulation), and a
LIPS strategy that checkpoints (it sends the run's ``lips-run-key``), each
client writes those records after every training to
``<folder>/lips-client-<run key>-<partition id or node id>.npz`` (keeping
the previous round's file beside it) and reads them back when a run with the
same key finds its context empty: the newest saved before the round it is
asked to train (or, for an evaluation, saved by then).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import log

from .._records import numpy_to_record, record_to_numpy
from ..persistence.npz_store import read_groups, read_meta, write_groups
from ..protocol import KEY_RUN, KEY_STATE_DIR, is_run_key
from .state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY

STATE_DIR_KEY = KEY_STATE_DIR  # the node/run config key naming the folder
PERSISTED = (SIGNAL_KEY, SIGNAL_ROUND_KEY, LOCAL_KEY)
FORMAT = "lips-flwr-client-state"


def state_path(context: Context, config: Mapping) -> Path | None:
    """Where this client keeps its state for the run named in ``config``; ``None``: nowhere."""
    folder = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    key = config.get(KEY_RUN)
    if not folder or key is None:
        return None
    if not is_run_key(key):  # also keeps paths inside the folder
        log(WARNING, "LIPS: malformed %s %r from the server: client state not kept on disk",
            KEY_RUN, key)
        return None
    who = context.node_config.get("partition-id", context.node_id)
    return Path(str(folder)) / f"lips-client-{key}-{who}.npz"


def _saved_round(path: Path) -> int | None:
    """The round a state file was saved after; ``None`` if missing or unreadable (logged)."""
    if not path.exists():
        return None
    try:
        meta = read_meta(path, "LIPS client state")  # the arrays are read only for the chosen file
        if meta.get("format") != FORMAT or not isinstance(meta.get("round"), int):
            raise ValueError(f"{str(path)!r} is not a LIPS client state file")
    except ValueError as err:
        log(WARNING, "LIPS: client state not restored: %s", err)
        return None
    return meta["round"]


def _previous(path: Path) -> Path:
    return path.with_name(path.name.replace(".npz", ".prev.npz"))


def load_state(state: RecordDict, path: Path | None, before_round: int | None) -> bool:
    """Fill an empty ``state`` from the newest file saved before ``before_round``; whether it did.

    Two files are kept, the state after the last round this client trained
    and after the one before: a server resumes from the round before the
    one it crashed in, which the client may have trained already. A damaged
    file is logged and ignored.
    """
    if path is None or any(key in state for key in PERSISTED):
        return False
    candidates = [(r, p) for p in (path, _previous(path)) if (r := _saved_round(p)) is not None
                  and (before_round is None or r < before_round)]
    if not candidates:
        return False
    saved_round, source = max(candidates)
    groups, meta = read_groups(source, "LIPS client state")
    for key, arrays in groups.items():
        state[key] = numpy_to_record(arrays)
    for key, values in meta.get("configs", {}).items():
        state[key] = ConfigRecord(values)
    log(INFO, "LIPS: client state restored from %s (after round %d)", source, saved_round)
    return True


def save_state(state: RecordDict, path: Path | None, trained_round: int) -> None:
    """Write the LIPS/FedBN records of ``state`` after ``trained_round`` (atomically), if any.

    The file of an earlier round becomes the previous one; a file of this or
    a later round (a resumed run training a lost round again) is replaced.
    """
    if path is None:
        return
    present = [key for key in PERSISTED if key in state]
    groups = {k: record_to_numpy(cast(ArrayRecord, state[k]))
              for k in present if isinstance(state[k], ArrayRecord)}
    configs = {k: dict(state[k]) for k in present if isinstance(state[k], ConfigRecord)}
    if not groups and not configs:
        return
    last = _saved_round(path)
    if last is not None and last < trained_round:
        os.replace(path, _previous(path))
    write_groups(path, groups, {"format": FORMAT, "configs": configs, "round": trained_round})


__all__ = ["STATE_DIR_KEY", "load_state", "save_state", "state_path"]
