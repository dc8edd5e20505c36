"""The strategy's state on disk, so that a restarted server continues the same run.

A checkpoint is one ``.npz`` file (numpy's zip of ``.npy`` arrays, read with
``allow_pickle=False``: loading one runs no code) holding

* ``round``: the last completed server round ``r``, and ``num_rounds`` (``T``);
* ``settings``: the LIPS hyperparameters, which a resumed strategy must share;
* ``model``: the global model broadcast after round ``r``. It is where round
  ``r + 1`` starts and the "previous global model" its update ``dw`` is taken
  against, so the resumed schedule masks what the uninterrupted one would;
* the LIPS core's state: the layers chosen on the first model and the
  inertia tracker's reference and previous models;
* ``strategy``: model-shaped state of the wrapped strategies (FedAvgM's
  momentum and model copy, FedAdam's moments), keyed by position in the
  chain of wrappers and attribute name;
* ``python_random``, ``numpy_random``: the state of Python's ``random``
  module, from which Flower's strategies sample nodes, and of numpy's global
  RNG, from which Flower's DP wrappers draw their noise;
* ``identity``: the run that wrote it: a fingerprint of its *initial* global
  model (names, shapes, dtypes, SHA-256 of the bytes) and its settings, taken
  at its first save and kept for the whole run. A resume given another
  initial model is refused: the file was written by another run;
* ``history``: the metrics of rounds ``1..r`` (Message API), so that a resumed
  run's ``Result`` covers the whole run. They are appended, a round at a time,
  to ``<checkpoint>.history.jsonl`` (:class:`HistoryLog`); the ``.npz`` holds
  how many bytes of it belong to the checkpoint. A save thus writes the model
  and one round of metrics, not every round so far: O(T) bytes over a run.

The random score needs no RNG state: its scores derive from ``(seed, round,
layer)``. The file is written through a temporary file and ``os.replace``
(:mod:`lips_flwr.persistence.npz_store`): a crash leaves the old checkpoint or
the new one, never half of one. One run at a time writes a checkpoint: a
strategy holds ``<checkpoint>.lock`` (:func:`lock_checkpoint`, an ``flock``
that the OS frees when the process dies) from the start of its run.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import random
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..protocol import is_run_key
from .npz_store import (
    read_groups,
    read_meta,
    remove_stale_temporaries,
    temporary_prefix,
    write_atomic,
    write_groups,
)

FORMAT = "lips-flwr-checkpoint"
# 2: the history in a sidecar file, the run's identity. Version 1 files (history inline) are read.
VERSION = 2
READABLE_VERSIONS = (1,)  # besides VERSION
RESUME_CHOICES = (False, True, "auto")
HISTORY_FORMAT = "lips-flwr-history"


@dataclass
class Checkpoint:
    """Everything a LIPS strategy needs to continue after ``round``."""

    round: int
    num_rounds: int
    settings: dict[str, Any]
    model: dict[str, np.ndarray]
    layers: list[str] | None = None
    inertia: dict[str, Any] | None = None
    strategy: dict[str, tuple[str, dict[str, np.ndarray]]] = field(default_factory=dict)
    python_random: list | None = None
    history: dict | None = None  # per-round metrics (JSON-able), when the adapter keeps them
    run_key: str | None = None  # names the clients' persisted state of this run
    strategy_meta: dict | None = None  # the wrapped strategies' classes, settings, scalar state
    numpy_random: tuple | None = None  # numpy's global RNG (DP noise): np.random.get_state()
    # The run that wrote it: {"initial_model": model_fingerprint(...), "settings": ..., "num_rounds": T}.
    identity: dict | None = None
    # The history is the first ``history_bytes`` bytes of ``<checkpoint>.history.jsonl``
    # (None: inline in the .npz, or, loaded, no usable sidecar).
    history_bytes: int | None = None
    # Keys of ``strategy`` that are not shaped like the model (checked against it otherwise).
    unshaped_state: list[str] = field(default_factory=list)
    # What loading found wrong but not fatal (a missing history file): the strategy logs it.
    notes: list[str] = field(default_factory=list)


def python_random_state() -> list:
    """Python's ``random`` state as JSON-able lists."""
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def restore_python_random(state: list) -> None:
    version, internal, gauss = state
    random.setstate((version, tuple(internal), gauss))


def numpy_random_state() -> tuple:
    """numpy's global RNG state (Flower's DP wrappers draw their noise from it)."""
    # A tuple for the global RNG (MT19937); the stub also allows a dict.
    return cast(tuple, np.random.get_state(legacy=True))


def restore_numpy_random(state: tuple) -> None:
    np.random.set_state(state)


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (the parent folder is created)."""
    groups: dict[str, Mapping[str, np.ndarray]] = {"model": checkpoint.model}
    inertia = None
    if checkpoint.inertia is not None:
        inertia = {"t0": checkpoint.inertia["t0"]}
        for part in ("reference", "previous"):
            tensors = checkpoint.inertia.get(part)
            inertia[part] = tensors is not None
            if tensors is not None and _copies_of(tensors, checkpoint.model):
                inertia[part] = list(tensors)  # stored once, in the model
            elif tensors is not None:
                groups[f"inertia-{part}"] = tensors
    kinds = {}
    for key, (kind, tensors) in checkpoint.strategy.items():
        kinds[key] = kind
        groups[f"strategy-{key}"] = tensors
    history: Any = checkpoint.history
    if checkpoint.history_bytes is not None:  # in the sidecar (HistoryLog): only its length here
        history = {"jsonl_bytes": checkpoint.history_bytes}
    meta = {
        "format": FORMAT, "version": VERSION, "round": checkpoint.round,
        "num_rounds": checkpoint.num_rounds, "settings": checkpoint.settings,
        "layers": checkpoint.layers, "inertia": inertia, "strategy": kinds,
        "python_random": checkpoint.python_random, "history": history,
        "run_key": checkpoint.run_key, "strategy_meta": checkpoint.strategy_meta,
        "numpy_random": None, "identity": checkpoint.identity,
        "unshaped_state": list(checkpoint.unshaped_state),
    }
    if checkpoint.numpy_random is not None:
        name, keys, pos, has_gauss, cached = checkpoint.numpy_random
        groups["numpy-random"] = {"keys": np.asarray(keys, dtype=np.uint32)}
        meta["numpy_random"] = [str(name), int(pos), int(has_gauss), float(cached)]
    write_groups(path, groups, meta)
    remove_stale_temporaries(path)


def _copies_of(tensors: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]) -> bool:
    """Whether ``tensors`` equal the model's tensors of the same names, dtype included.

    The inertia tracker's previous model is the broadcast model's weights:
    storing them once keeps the checkpoint at 2x the model instead of 3x.
    """
    return all(
        name in model and np.asarray(model[name]).dtype == np.asarray(t).dtype
        and np.array_equal(model[name], t)
        for name, t in tensors.items()
    )


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError
        The file is not a LIPS checkpoint, is damaged, or has another version.
    """
    groups, meta = read_groups(path, "LIPS checkpoint")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a LIPS checkpoint")
    if meta.get("version") not in (VERSION, *READABLE_VERSIONS):
        raise ValueError(
            f"{str(path)!r} is a version {meta.get('version')} LIPS checkpoint; this "
            f"lips-flwr reads versions {sorted({VERSION, *READABLE_VERSIONS})}"
        )
    try:
        checkpoint = _checkpoint_from(groups, meta)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, RecursionError) as err:
        raise ValueError(f"{str(path)!r} is damaged: {err!r}") from err
    pointer = meta.get("history")
    if isinstance(pointer, dict) and "jsonl_bytes" in pointer:
        size = pointer["jsonl_bytes"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"{str(path)!r} is damaged: malformed history length {size!r}")
        checkpoint.history, ok, notes = read_history(path, size, checkpoint.round, checkpoint.run_key)
        checkpoint.history_bytes = size if ok else None
        checkpoint.notes.extend(notes)
    return checkpoint


def _checkpoint_from(groups: dict[str, dict[str, np.ndarray]], meta: dict) -> Checkpoint:
    """Build a Checkpoint, checking every field's type: a damaged file fails here, not mid-run."""
    model = groups["model"]
    inertia: dict[str, Any] | None = None
    if meta["inertia"] is not None:
        inertia = {"t0": _int(meta["inertia"]["t0"])}
        for part in ("reference", "previous"):
            stored = meta["inertia"][part]
            if isinstance(stored, list):
                inertia[part] = {name: model[name] for name in stored}
            else:
                inertia[part] = groups[f"inertia-{part}"] if stored else None
    python_random = meta["python_random"]
    if python_random is not None:
        version, internal, gauss = python_random
        if not (isinstance(version, int) and len(internal) == 625
                and all(isinstance(i, int) for i in internal)
                and (gauss is None or isinstance(gauss, float))):
            raise ValueError("malformed Python random state")
    history = meta.get("history")
    if isinstance(history, dict) and "jsonl_bytes" in history:
        history = None  # in the sidecar: read by load_checkpoint
    for rounds in (history or {}).values():
        for key, metrics in rounds.items():
            int(key)
            _check_metrics(key, metrics)
    run_key = meta.get("run_key")
    if run_key is not None and not is_run_key(run_key):
        raise ValueError(f"malformed run key {run_key!r}")
    strategy_meta = meta.get("strategy_meta")
    if strategy_meta is not None and not all(
            isinstance(strategy_meta.get(k, {}), dict) for k in ("settings", "scalars", "objects")):
        raise ValueError("malformed strategy state")
    numpy_random = meta.get("numpy_random")
    if numpy_random is not None:
        name, pos, has_gauss, cached = numpy_random
        keys = groups["numpy-random"]["keys"]
        if name != "MT19937" or keys.shape != (624,) or keys.dtype != np.uint32:
            raise ValueError("malformed numpy random state")
        numpy_random = (name, keys, _int(pos), _int(has_gauss), float(cached))
    layers = meta["layers"]
    if layers is not None and not all(isinstance(n, str) for n in layers):
        raise ValueError("malformed layer list")
    _check_settings(meta["settings"], "settings")
    if strategy_meta is not None:
        for part in ("settings", "scalars"):
            for key, value in strategy_meta.get(part, {}).items():
                if _json_scalar(value) is None:
                    raise ValueError(f"the value of {key!r} in the strategy's {part} is not a "
                                     f"number, string or bool: {value!r}")
    for group, arrays in groups.items():
        for name, array in arrays.items():
            if array.dtype.kind not in "biufc":
                raise ValueError(f"{group} {name!r} holds {array.dtype} values, not numbers")
    identity = meta.get("identity")
    if identity is not None:
        _check_identity(identity, model)
    unshaped = meta.get("unshaped_state", [])
    if not (isinstance(unshaped, list) and all(isinstance(k, str) for k in unshaped)):
        raise ValueError("malformed list of unshaped state")
    return Checkpoint(
        round=_int(meta["round"]),
        num_rounds=_int(meta["num_rounds"]),
        settings=meta["settings"],
        model=model,
        layers=layers,
        inertia=inertia,
        strategy={str(key): (str(kind), groups[f"strategy-{key}"])
                  for key, kind in meta["strategy"].items()},
        python_random=python_random,
        history=history,
        run_key=run_key,
        strategy_meta=strategy_meta,
        numpy_random=numpy_random,
        identity=identity,
        unshaped_state=unshaped,
    )


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _json_scalar(value: Any) -> str | None:
    """``"none"``, ``"bool"``, ``"number"`` (finite) or ``"str"``; ``None`` for anything else."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return "number"
    return "str" if isinstance(value, str) else None


def _check_settings(settings: Any, what: str) -> None:
    """LIPS settings: a dict of JSON scalars and lists of them (``layers``), nothing nested."""
    if not isinstance(settings, dict):
        raise ValueError(f"malformed {what}")
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        if not all(_json_scalar(v) is not None for v in values):
            raise ValueError(f"malformed {what}: {key!r} is {value!r}")


def _check_metrics(key: Any, metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise ValueError(f"the metrics of round {key} are not a record: {metrics!r}")
    for value in metrics.values():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"a metric of round {key} is not a number: {value!r}")


def _check_identity(identity: Any, model: Mapping[str, np.ndarray]) -> None:
    """The run's identity: well formed, and its initial model has the names and shapes of ``model``."""
    initial = identity["initial_model"]
    names, shapes, dtypes, digest = (initial[k] for k in ("names", "shapes", "dtypes", "sha256"))
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)
            and isinstance(shapes, list) and len(shapes) == len(names)
            and all(isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in s) for s in shapes)
            and isinstance(dtypes, list) and len(dtypes) == len(names)
            and all(isinstance(d, str) and np.dtype(d).kind in "biufc" for d in dtypes)
            and isinstance(digest, str) and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest)):
        raise ValueError("malformed run identity")
    _check_settings(identity["settings"], "run identity")
    _int(identity["num_rounds"])
    if names != list(model) or any(list(np.shape(model[n])) != s for n, s in zip(names, shapes)):
        raise ValueError("its model does not have the names and shapes of the initial model "
                         "of the run that wrote it")


def model_fingerprint(model: Mapping[str, np.ndarray]) -> dict:
    """Names, shapes, dtypes and SHA-256 of the bytes of ``model``: a run's initial model's identity."""
    digest = hashlib.sha256()
    names, shapes, dtypes = [], [], []
    for name, value in model.items():
        array = np.asarray(value)
        names.append(name)
        shapes.append([int(d) for d in array.shape])
        dtypes.append(array.dtype.str)
        digest.update(json.dumps([name, shapes[-1], dtypes[-1]]).encode("utf-8"))
        # (ascontiguousarray makes a 0-d array 1-d: only the bytes are taken from it)
        digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return {"names": names, "shapes": shapes, "dtypes": dtypes, "sha256": digest.hexdigest()}


def fingerprint_mismatch(saved: Mapping[str, Any], model: Mapping[str, np.ndarray]) -> str | None:
    """How ``model`` differs from the model of fingerprint ``saved``, or ``None`` when it is that model."""
    now = model_fingerprint(model)
    if now == dict(saved):
        return None
    if now["names"] != saved["names"]:
        return "other arrays"
    for what in ("shapes", "dtypes"):
        differ = [n for n, a, b in zip(now["names"], saved[what], now[what]) if a != b]
        if differ:
            return f"{what} differ in {differ[:5]}"
    return "the same names, shapes and dtypes, other values"


# ----------------------------------------------------------------- history sidecar
def history_path(checkpoint_path: str | os.PathLike) -> Path:
    """``<checkpoint>.history.jsonl``: where the checkpoint's metrics history is appended."""
    return Path(os.fspath(checkpoint_path) + ".history.jsonl")


def read_history(
    checkpoint_path: str | os.PathLike, size: int, upto: int, run_key: str | None
) -> tuple[dict, bool, list[str]]:
    """``(history, whole, notes)``: the metrics in the first ``size`` bytes of the history file.

    ``history`` is ``part -> str(round) -> metrics`` for rounds ``<= upto``;
    a later line for the same part and round replaces an earlier one. Lines
    past ``size`` (a save that was cut short before its checkpoint was
    written) and a truncated last line are ignored. ``whole`` is false, with
    ``notes`` saying why, when the file is missing, shorter than ``size`` or
    another run's: the history then lacks rounds, which is not fatal.
    ``ValueError`` for a damaged line.
    """
    file = history_path(checkpoint_path)
    try:
        with open(file, "rb") as f:
            data = f.read(size)
    except FileNotFoundError:
        return {}, False, [f"its metrics history {str(file)!r} is missing: the result of the "
                           "resumed run lacks the metrics of the rounds before it"]
    except OSError as err:
        raise ValueError(f"cannot read the LIPS checkpoint's history {str(file)!r}: {err}") from err
    notes = []
    if len(data) < size:
        notes.append(f"its metrics history {str(file)!r} holds {len(data)} of its {size} bytes: the "
                     "result of the resumed run lacks the metrics of some rounds before it")
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing, or a line cut short
    history: dict[str, dict[str, dict]] = {}
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line.decode("utf-8"))
            if number == 1:
                if not (isinstance(entry, dict) and entry.get("format") == HISTORY_FORMAT):
                    raise ValueError("not a LIPS metrics history")
                if entry.get("run_key") != run_key:
                    return {}, False, [f"its metrics history {str(file)!r} is another run's: the result "
                                       "of the resumed run lacks the metrics of the rounds before it"]
                continue
            part, server_round, metrics = entry["part"], _int(entry["round"]), entry["metrics"]
            if not isinstance(part, str):
                raise ValueError(f"malformed part {part!r}")
            _check_metrics(server_round, metrics)
        except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as err:
            raise ValueError(f"the LIPS checkpoint's history {str(file)!r} is damaged: "
                             f"line {number}: {err}") from err
        if server_round <= upto:
            history.setdefault(part, {})[str(server_round)] = metrics
    if not lines:
        notes.append(f"its metrics history {str(file)!r} has no header")
    return history, not notes, notes


class HistoryLog:
    """A run's metrics history, appended to ``<checkpoint>.history.jsonl`` (JSON lines).

    The first line names the run (its key); each other line is one round's
    metrics of one part (``{"part", "round", "metrics"}``). :meth:`append`
    writes the entries not yet in the file, flushed and fsync'ed before the
    checkpoint that counts them is written: a save writes one round of
    metrics, however long the run.
    """

    def __init__(self, checkpoint_path: str | os.PathLike, run_key: str | None) -> None:
        self.path = history_path(checkpoint_path)
        self.run_key = run_key
        self.size: int | None = None  # the bytes of the file this run writes to; None: none yet
        self._written: dict[tuple[str, int], Any] = {}

    def adopt(self, checkpoint: Checkpoint) -> None:
        """Continue the history ``checkpoint`` was loaded with; lines past it (a cut-short save) go."""
        self.size, self._written = None, {}
        if checkpoint.history_bytes is None:
            return  # no usable file: the next append starts a new one with the whole history
        try:
            with open(self.path, "r+b") as f:
                f.truncate(checkpoint.history_bytes)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            return  # gone since it was read: the next append writes it anew
        self.size = checkpoint.history_bytes
        self._written = {(part, int(r)): metrics for part, rounds in (checkpoint.history or {}).items()
                         for r, metrics in rounds.items()}

    def append(self, history: Mapping[str, Mapping[int, Mapping]], upto: int) -> int:
        """Append the entries of rounds ``<= upto`` not yet in the file; the file's length.

        A file that is gone, or not as this run left it, is written anew, whole.
        """
        if self.size is not None and _size(self.path) != self.size:
            self.size = None
        if self.size is None:
            header = json.dumps({"format": HISTORY_FORMAT, "run_key": self.run_key}) + "\n"
            write_atomic(self.path, lambda f: f.write(header.encode("utf-8")))
            remove_stale_temporaries(self.path)
            self.size, self._written = len(header.encode("utf-8")), {}
        lines = []
        for part, rounds in history.items():
            for server_round, metrics in rounds.items():
                if server_round > upto:
                    continue
                known = self._written.get((part, server_round), _UNSEEN)
                if known is metrics:
                    continue
                self._written[(part, server_round)] = metrics
                if known is not _UNSEEN and known == metrics:
                    continue  # e.g. the history a resumed run was given back
                entry = {"part": part, "round": server_round, "metrics": dict(metrics)}
                lines.append((json.dumps(entry) + "\n").encode("utf-8"))
        if lines:
            with open(self.path, "ab") as f:
                f.write(b"".join(lines))
                f.flush()
                os.fsync(f.fileno())
                self.size = f.tell()
        return self.size


_UNSEEN = object()


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


# ----------------------------------------------------------------------- one writer
if sys.platform == "win32":  # pragma: no cover - not what CI runs
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
else:
    import errno
    import fcntl

    def _try_lock(fd: int) -> bool:
        """``flock`` ``fd`` (exclusive, not waiting): ``False`` when another open file holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True


_HOLDERS: dict[str, weakref.ref[CheckpointLock]] = {}  # lock file (real path) -> its holder here
_HOLDERS_GUARD = threading.RLock()


class CheckpointLock:
    """This process's right to write one checkpoint, taken by :func:`lock_checkpoint`.

    Held until :meth:`release`, until the object is garbage collected, or
    until the process ends (the OS frees an ``flock`` with its process, so a
    killed writer leaves no lock behind). ``lost`` says why it was taken away.
    """

    def __init__(self, path: str, lock_path: Path, key: str, fd: int | None, os_note: str | None) -> None:
        self.path, self.lock_path, self._key = path, lock_path, key
        self.os_note = os_note  # why the file could not be locked (a filesystem without locks)
        self.thread = threading.current_thread()
        self.lost: str | None = None
        self.taken_over = False  # by another run of this process: this one must not write
        self._fd = fd
        self._finalizer = weakref.finalize(self, _drop, key, fd)

    @property
    def held(self) -> bool:
        return self.lost is None and self._finalizer.alive

    def check(self) -> None:
        """``ValueError`` when another run took the checkpoint over."""
        if self.lost is not None:
            raise ValueError(self.lost)

    def release(self) -> None:
        """Let another run write the checkpoint."""
        with _HOLDERS_GUARD:
            self._finalizer()
            self.lost = self.lost or f"this run released the LIPS checkpoint {self.path!r}"

    def _hand_over(self, path: str) -> CheckpointLock:
        """The lock, for a new run of this thread (or of one that ended); this one can no longer write."""
        self._finalizer.detach()
        self.taken_over = True
        self.lost = (f"the LIPS checkpoint {self.path!r} was taken over by another run in this process "
                     f"(thread {threading.current_thread().name}): this run can no longer write it")
        successor = CheckpointLock(path, self.lock_path, self._key, self._fd, self.os_note)
        _HOLDERS[self._key] = weakref.ref(successor)
        return successor


def _drop(key: str, fd: int | None) -> None:
    with _HOLDERS_GUARD:
        ref = _HOLDERS.get(key)
        holder = None if ref is None else ref()
        if ref is not None and (holder is None or holder._fd == fd):
            del _HOLDERS[key]
    if fd is not None:
        os.close(fd)  # frees the flock


def lock_checkpoint(path: str | os.PathLike) -> CheckpointLock:
    """Take the right to write the checkpoint ``path``: an ``flock`` on ``<path>.lock``.

    Refused (``ValueError``, not waiting) while another process holds it, or
    another thread of this process whose run may still be going. A run of the
    same thread, or of a thread that ended, is over (crashed: its strategy may
    outlive it in a traceback): the new run takes the lock over, and the old
    one's next save is refused.
    """
    path = os.fspath(path)
    lock_path = Path(path + ".lock")
    key = os.path.realpath(lock_path)
    busy = (f"the LIPS checkpoint {path!r} is in use: another run is writing it (%s); two runs cannot "
            "share a checkpoint: give this run another `checkpoint_path`, or stop the other run")
    for attempt in range(2):
        with _HOLDERS_GUARD:
            ref = _HOLDERS.get(key)
            holder = None if ref is None else ref()
            if holder is not None and holder.held:
                if holder.thread is threading.current_thread() or not holder.thread.is_alive():
                    return holder._hand_over(path)
                if attempt:
                    raise ValueError(busy % f"a strategy of this process, thread {holder.thread.name}")
            else:
                return _lock_file(path, lock_path, key, busy)
        gc.collect()  # a crashed run's strategy in a reference cycle: collect it, then look again
    raise AssertionError("unreachable")


def _lock_file(path: str, lock_path: Path, key: str, busy: str) -> CheckpointLock:
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ValueError(f"cannot write the LIPS checkpoint {path!r}: {err}") from err
    note = None
    try:
        locked = _try_lock(fd)
    except OSError as err:  # a filesystem without locks: one writer per process only
        locked, note = True, f"cannot lock {str(lock_path)!r} ({err})"
    if not locked:
        os.close(fd)
        raise ValueError(busy % f"another process holds {str(lock_path)!r}")
    holder = CheckpointLock(path, lock_path, key, fd, note)
    _HOLDERS[key] = weakref.ref(holder)
    return holder


def existing_checkpoint(path: str | os.PathLike) -> dict | None:
    """The metadata of the LIPS checkpoint at ``path``, ``None`` when there is no file.

    ``ValueError`` when the file is something else (a results file, say): a
    fresh run must not overwrite it.
    """
    if not Path(path).exists():
        return None
    try:
        meta = read_meta(path, "LIPS checkpoint")
        if meta.get("format") != FORMAT:
            raise ValueError("no LIPS metadata")
    except ValueError as err:
        raise ValueError(
            f"`checkpoint_path` {os.fspath(path)!r} names a file that is not a LIPS checkpoint; a run "
            f"with resume=False would overwrite it: move it away, or choose another path ({err})"
        ) from err
    return meta


def settings_mismatch(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"name: checkpoint X, now Y"`` for each setting that differs."""
    keys = sorted(set(saved) | set(current))
    return [
        f"{key}: checkpoint {saved.get(key)!r}, now {current.get(key)!r}"
        for key in keys
        if _jsonable(saved.get(key)) != _jsonable(current.get(key))
    ]


def _jsonable(value: Any) -> Any:
    # Compare as the file stores it: tuples come back as lists.
    return json.loads(json.dumps(value))


def validate_resume(checkpoint_path: Any, resume: Any) -> tuple[str | None, bool | str]:
    """Check the ``checkpoint_path`` / ``resume`` constructor arguments."""
    if checkpoint_path is not None and not isinstance(checkpoint_path, (str, os.PathLike)):
        raise ValueError(f"`checkpoint_path` must be a path or None, got {checkpoint_path!r}")
    if checkpoint_path is not None and not str(checkpoint_path):
        raise ValueError("`checkpoint_path` must not be empty; pass None to save no checkpoint")
    if not (isinstance(resume, bool) or (isinstance(resume, str) and resume == "auto")):
        raise ValueError(f"`resume` must be one of {RESUME_CHOICES}, got {resume!r}")
    if resume and checkpoint_path is None:
        raise ValueError("`resume` needs `checkpoint_path`: the checkpoint to resume from")
    return (None if checkpoint_path is None else os.fspath(checkpoint_path)), resume


def resume_option(value: bool | str) -> bool | str:
    """A run-config value (``"no"``, ``"yes"``, ``"auto"`` or a bool) as the strategies' ``resume``."""
    choices: dict[str, bool | str] = {"no": False, "false": False, "yes": True, "true": True, "auto": "auto"}
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in choices:
        return choices[value.strip().lower()]
    raise ValueError(f"`resume` must be one of 'no', 'yes', 'auto', got {value!r}")


def check_writable(path: str | os.PathLike) -> None:
    """Fail before any round trains when the checkpoint cannot be written (``ValueError``)."""
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=temporary_prefix(path)):
            pass
    except OSError as err:
        raise ValueError(f"cannot write the LIPS checkpoint {str(path)!r}: {err}") from err
    if Path(path).is_dir():
        raise ValueError(f"`checkpoint_path` {str(path)!r} is a folder; name a file in it")


def checkpoint_to_resume(checkpoint_path: str | None, resume: bool | str) -> Checkpoint | None:
    """The checkpoint to continue from: ``None`` to start at round 1.

    ``resume=True`` requires the file; ``"auto"`` resumes when it exists, so one
    command serves the first start and every restart.
    """
    if not resume or checkpoint_path is None:
        return None
    if resume == "auto" and not Path(checkpoint_path).exists():
        return None
    return load_checkpoint(checkpoint_path)


def model_mismatch(saved: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]) -> str | None:
    """Why the checkpoint's model is not the model the run starts with, or ``None``."""
    if list(saved) != list(model):
        missing = [n for n in model if n not in saved][:5]
        extra = [n for n in saved if n not in model][:5]
        return f"arrays differ (missing {missing}, extra {extra}, or another order)"
    shapes = [n for n in model if np.shape(saved[n]) != np.shape(model[n])]
    return f"shapes differ in {shapes[:5]}" if shapes else None


__all__ = [
    "Checkpoint", "CheckpointLock", "FORMAT", "HistoryLog", "RESUME_CHOICES", "VERSION",
    "check_writable", "checkpoint_to_resume", "existing_checkpoint", "fingerprint_mismatch",
    "history_path", "load_checkpoint", "lock_checkpoint", "model_fingerprint", "model_mismatch",
    "numpy_random_state", "python_random_state", "read_history", "restore_numpy_random",
    "restore_python_random", "resume_option", "save_checkpoint", "settings_mismatch", "validate_resume",
]
