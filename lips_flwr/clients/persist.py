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

The folder never costs a round. Any OS error on the folder or its files (a
folder that cannot be searched, read or written, a full disk, a name too long
for the filesystem) is a WARNING naming the path and the error, logged once
per path (or, for writes, per folder), and the client replies as usual,
training as without persisted state. Something other than a regular file at a
state file's path (a folder, a FIFO) is logged and neither read nor
replaced. A file that is damaged or lacks a part (a signal without its round)
is logged and treated as absent, and so is one written for another model
(tensors this model lacks, or of other shapes): the client starts fresh. A
partition id (or node id) that is not a plain name (``[A-Za-z0-9_.-]+``
without ``..``) never becomes part of a path: it is logged and nothing is
kept. A plain name longer than 64 characters is shortened (:func:`_file_part`):
every file name stays far below the 255 bytes filesystems allow.

An engine that runs many clients in one process (the batched Grid) has the
files written behind the next clients' calls (:mod:`.saves_behind`).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import stat
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from pathlib import Path
from typing import cast

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import log

from .._records import numpy_to_record, record_views
from ..persistence.npz_store import read_groups, read_meta, remove_stale_temporaries, write_groups
from ..protocol import KEY_RUN, KEY_STATE_DIR, is_run_key
from .saves_behind import write_behind
from .state import LOCAL_KEY, SIGNAL_KEY, SIGNAL_ROUND_KEY

STATE_DIR_KEY = KEY_STATE_DIR  # the node/run config key naming the folder
PERSISTED = (SIGNAL_KEY, SIGNAL_ROUND_KEY, LOCAL_KEY)
FORMAT = "lips-flwr-client-state"
# A partition id or node id in a file name: a plain name, so the file stays in its folder.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_warned: set[tuple[str, str]] = set()  # (what, where): each problem is logged once per process
# path -> (the file's identity when this process wrote it, its round): a save reads the round of the
# file it replaces, and the file is nearly always the one this process wrote last (:func:`_saved_round`).
_written: dict[str, tuple[tuple[int, int, int, int], int]] = {}
_NOTHING_THERE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)  # as pathlib's exists()


def _warn_once(what: str, where: str, message: str, *args: object) -> None:
    if (what, where) not in _warned:
        _warned.add((what, where))
        log(WARNING, message, *args)


def _plain_name(value: object) -> str | None:
    """``value`` as a file-name part: an int, or a string of ``[A-Za-z0-9_.-]`` without ``..``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and _PLAIN_NAME.fullmatch(value) and ".." not in value:
        return value
    return None


_LONGEST_PLAIN = 64  # a plain name this long or shorter is used as it is; a longer one is shortened


def _file_part(who: str) -> str:
    """The partition/node id's part of a file name: ``who`` up to 64 characters, else its first 32, ``-``
    and the 64 hex digits of its SHA-256 (97 characters). The two forms differ in length, so they never
    meet, and two long names share a file only if their SHA-256 do."""
    if len(who) <= _LONGEST_PLAIN:
        return who
    return f"{who[:32]}-{hashlib.sha256(who.encode('utf-8')).hexdigest()}"


def state_path(context: Context, config: Mapping) -> Path | None:
    """Where this client keeps its state for the run named in ``config``; ``None``: nowhere."""
    folder = context.node_config.get(STATE_DIR_KEY) or context.run_config.get(STATE_DIR_KEY)
    key = config.get(KEY_RUN)
    if not folder or key is None:
        return None
    if "\x00" in str(folder):  # no OS call takes it (ValueError, not OSError)
        _warn_once("folder", repr(folder), "LIPS: the %s %r holds a NUL character: client state "
                   "not kept on disk", STATE_DIR_KEY, folder)
        return None
    if not is_run_key(key):  # also keeps paths inside the folder
        log(WARNING, "LIPS: malformed %s %r from the server: client state not kept on disk",
            KEY_RUN, key)
        return None
    raw = context.node_config.get("partition-id", context.node_id)
    who = _plain_name(raw)
    if who is None:
        _warn_once("name", repr(raw), "LIPS: partition-id %r is not a plain name "
                   "([A-Za-z0-9_.-]+ without '..'): client state not kept on disk", raw)
        return None
    return _state_file(str(folder), key, who)


@functools.lru_cache(maxsize=65_536)  # (a batched run's clients all fit: a smaller cache evicts each)
def _state_file(folder: str, key: str, who: str) -> Path:
    """:func:`state_path`'s file, made once per folder, run and client (a ``Path`` parses its parts
    anew each time it is made: ~20 us of every client call)."""
    return Path(folder) / f"lips-client-{key}-{_file_part(who)}.npz"


def _stat(path: Path) -> os.stat_result | None:
    """``path.stat()``, ``None`` where ``path.exists()`` is False: one system call for ``exists()`` and
    ``is_file()``. Other OS errors (no search permission) propagate."""
    try:
        return path.stat()
    except (OSError, ValueError) as err:  # (ValueError: a path no OS call takes)
        if isinstance(err, OSError) and err.errno not in _NOTHING_THERE:
            raise
        return None


def _not_a_file(path: Path, info: os.stat_result | None) -> bool:
    """Whether something other than a regular file (a folder, a FIFO) is at ``path`` (``info``: its
    :func:`_stat`), logged once: it is neither read (a FIFO would block a client) nor replaced (not ours)."""
    if info is None or stat.S_ISREG(info.st_mode):
        return False
    _warn_once("irregular", str(path), "LIPS: client state not kept on disk: %r is not a regular "
               "file (a folder, a FIFO?); it is neither read nor replaced", str(path))
    return True


def _saved_round(path: Path, info: os.stat_result | None) -> int | None:
    """The round a state file (``info``: its :func:`_stat`) was saved after; ``None`` if missing or
    unreadable (logged). The file this process wrote there last, still there (:func:`_identity`), is not
    read again: its round is remembered. OS errors (a folder that cannot be searched) propagate."""
    if info is None or _not_a_file(path, info):
        return None
    known = _written.get(str(path))
    if known is not None and known[0] == _identity(info):  # unchanged since this process wrote it
        return known[1]
    try:
        meta = read_meta(path, "LIPS client state")  # the arrays are read only for the chosen file
        if meta.get("format") != FORMAT or not isinstance(meta.get("round"), int):
            raise ValueError(f"{str(path)!r} is not a LIPS client state file")
    except ValueError as err:
        log(WARNING, "LIPS: client state not restored: %s", err)
        return None
    return meta["round"]


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """Device, inode, size and modification time (ns) of a file's ``stat``: another file written
    there since (a rename brings its own inode, a rewrite a new time) has another one."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def _previous(path: Path) -> Path:
    return path.with_name(path.name.replace(".npz", ".prev.npz"))


def _records(source: Path) -> dict[str, ArrayRecord | ConfigRecord]:
    """The persisted records of a state file; ``ValueError`` if damaged or incomplete.

    What :func:`~lips_flwr.clients.state.after_training` and
    :func:`~lips_flwr.clients.state.save_local` write: the signal (arrays)
    always with its round (a config with an int ``round``), the local tensors
    (arrays) on their own. Anything else in the file is ignored.
    """
    groups, meta = read_groups(source, "LIPS client state")
    configs = meta.get("configs", {})
    if not isinstance(configs, dict):
        raise ValueError(f"{str(source)!r} is damaged: its configs are not a mapping")
    for key in (SIGNAL_KEY, LOCAL_KEY):
        if key in configs:
            raise ValueError(f"{str(source)!r} is damaged: {key!r} is not arrays")
    if SIGNAL_ROUND_KEY in groups:
        raise ValueError(f"{str(source)!r} is damaged: {SIGNAL_ROUND_KEY!r} is not a config")
    if (SIGNAL_KEY in groups) != (SIGNAL_ROUND_KEY in configs):
        present, missing = ((SIGNAL_KEY, SIGNAL_ROUND_KEY) if SIGNAL_KEY in groups
                            else (SIGNAL_ROUND_KEY, SIGNAL_KEY))
        raise ValueError(f"{str(source)!r} is incomplete: {present!r} without {missing!r}")
    if SIGNAL_ROUND_KEY in configs:
        signal_round = configs[SIGNAL_ROUND_KEY]
        value = signal_round.get("round") if isinstance(signal_round, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{str(source)!r} is damaged: {SIGNAL_ROUND_KEY!r} has no int round")
    records: dict[str, ArrayRecord | ConfigRecord] = {}
    try:
        for key in PERSISTED:
            if key in groups:
                records[key] = numpy_to_record(groups[key])
            elif key in configs:
                records[key] = ConfigRecord(configs[key])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{str(source)!r} is damaged: {err}") from err
    return records


def _misfit(records: Mapping[str, ArrayRecord | ConfigRecord],
            shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Why the tensors of ``records`` are not of the model of ``shapes`` (at most 3 reasons)."""
    reasons = []
    for key, record in records.items():
        if not isinstance(record, ArrayRecord):
            continue
        for name, array in record.items():
            if name not in shapes:
                reasons.append(f"{key} has {name!r}, which this model lacks")
            elif tuple(array.shape) != tuple(shapes[name]):
                reasons.append(f"{key} has {name!r} of shape {tuple(array.shape)}, this model "
                               f"{tuple(shapes[name])}")
    return reasons[:3]


def load_state(state: RecordDict, path: Path | None, before_round: int | None,
               shapes: Mapping[str, Sequence[int]] | None = None) -> bool:
    """Fill an empty ``state`` from the newest file saved before ``before_round``; whether it did.

    Two files are kept, the state after the last round this client trained
    and after the one before: a server resumes from the round before the
    one it crashed in, which the client may have trained already. A file
    that is damaged or lacks a part is logged and treated as absent, and so
    is one whose tensors do not fit ``shapes`` (name -> shape of the model
    received, when given): the state of another model. An OS error is a
    WARNING (once per path) and nothing is restored.
    """
    if path is None or any(key in state for key in PERSISTED):
        return False
    try:
        return _restore_newest(state, path, before_round, shapes)
    except OSError as err:
        _warn_once("load", str(path), "LIPS: client state not restored: cannot read %r (%s: %s); "
                   "the client trains without it", str(path), type(err).__name__, err)
        return False


def _restore_newest(state: RecordDict, path: Path, before_round: int | None,
                    shapes: Mapping[str, Sequence[int]] | None) -> bool:
    """:func:`load_state` once its checks passed; OS errors propagate."""
    candidates = [(r, p) for p in (path, _previous(path)) if (r := _saved_round(p, _stat(p))) is not None
                  and (before_round is None or r < before_round)]
    for saved_round, source in sorted(candidates, reverse=True):
        try:
            records = _records(source)
        except ValueError as err:
            log(WARNING, "LIPS: client state not restored: %s", err)
            continue
        misfit = [] if shapes is None else _misfit(records, shapes)
        if misfit:
            log(WARNING, "LIPS: client state not restored: %r is of another model (%s)",
                str(source), "; ".join(misfit))
            continue
        for key, record in records.items():
            state[key] = record
        log(INFO, "LIPS: client state restored from %s (after round %d)", source, saved_round)
        return True
    return False


def save_state(state: RecordDict, path: Path | None, trained_round: int) -> None:
    """Write the LIPS/FedBN records of ``state`` after ``trained_round`` (atomically), if any.

    The file of an earlier round becomes the previous one; a file of this or
    a later round (a resumed run training a lost round again) is replaced.
    An OS error (a folder that cannot be written, a full disk) is logged
    (once per folder) and the state is not saved: the round's reply is never
    lost to it. Something other than a regular file at ``path`` is logged
    and left alone. Within :func:`saves_behind`, the records as they are now
    are written by the block's thread, and this returns at once.
    """
    if path is None:
        return
    present = [key for key in PERSISTED if key in state]
    # Read-only views of the Arrays' bytes and shallow copies of the configs (int values): what is
    # written is the state of now, whatever the records hold when the thread of saves_behind writes it.
    groups = {k: record_views(cast(ArrayRecord, state[k]))
              for k in present if isinstance(state[k], ArrayRecord)}
    configs = {k: dict(state[k]) for k in present if isinstance(state[k], ConfigRecord)}
    if not groups and not configs:
        return
    write = functools.partial(_write_state, path, groups, configs, trained_round)
    if not write_behind(path, write):
        write()


def _write_state(path: Path, groups: dict[str, dict], configs: dict[str, dict], trained_round: int) -> None:
    """:func:`save_state`'s file, written now.

    The rotation to the previous file is not under the path's lock (only the
    write is): a client's saves never overlap, as a client's next call waits
    for its last one (the batched Grid leaves a node with a running call out),
    and the thread of :func:`saves_behind` writes one file after another.
    """
    try:
        if _not_a_file(path, info := _stat(path)):
            return
        if (last := _saved_round(path, info)) is not None and last < trained_round:
            os.replace(path, _previous(path))
        written = write_groups(path, groups, {"format": FORMAT, "configs": configs, "round": trained_round})
        if str(path) not in _written:  # this process's first file there: what killed writers left beside it
            remove_stale_temporaries(path, pid_only=True)
        _written[str(path)] = (_identity(written), trained_round)
    except OSError as err:
        _warn_once("save", str(path.parent), "LIPS: client state not kept on disk: cannot write "
                   "%r in the %s folder %r (%s: %s); training goes on without it",
                   str(path), STATE_DIR_KEY, str(path.parent), type(err).__name__, err)


__all__ = ["STATE_DIR_KEY", "load_state", "save_state", "state_path"]
