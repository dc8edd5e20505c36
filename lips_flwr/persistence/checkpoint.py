"""The strategy's state on disk, so that a restarted server continues the same run.

A checkpoint is one ``.npz`` file (numpy's zip of ``.npy`` arrays, read with
``allow_pickle=False``: loading one runs no code) holding

* ``round``: the last completed server round ``r``, and ``num_rounds`` (``T``);
* ``settings``: the LIPS hyperparameters, which a resumed strategy must share;
* ``model``: the global model broadcast after round ``r``. It is where round
  ``r + 1`` starts and the "previous global model" its update ``dw`` is taken
  against, so the resumed schedule masks what the uninterrupted one would;
* the LIPS core's state: the layers chosen on the first model, the
  inertia tracker's reference and previous models, and (``trigger="inertia"``)
  the inertia trigger's series of relative steps and last mask (JSON);
* ``strategy``: model-shaped state of the wrapped strategies (FedAvgM's
  momentum and model copy, FedAdam's moments), keyed by position in the
  chain of wrappers and attribute name;
* ``python_random``, ``numpy_random``: the state of Python's ``random``
  module, from which Flower's strategies sample nodes, and of numpy's global
  RNG, from which Flower's DP wrappers draw their noise (:mod:`.random_state`);
* ``identity``: the run that wrote it: a fingerprint of its *initial* global
  model (names, shapes, dtypes, SHA-256 of the bytes) and its settings, taken
  at its first save and kept for the whole run (:mod:`.identity`). A resume
  given another initial model is refused: the file was written by another run;
* ``history``: the metrics of rounds ``1..r`` (Message API), so that a resumed
  run's ``Result`` covers the whole run. They are appended, a round at a time,
  to ``<checkpoint>.history.jsonl`` (:mod:`.history`); the ``.npz`` holds
  how many bytes of it belong to the checkpoint. A save thus writes the model
  and one round of metrics, not every round so far: O(T) bytes over a run.

The random score needs no RNG state: its scores derive from ``(seed, round,
layer)``. The file is written through a temporary file and ``os.replace``
(:mod:`lips_flwr.persistence.npz_store`): a crash leaves the old checkpoint or
the new one, never half of one. One run at a time writes a checkpoint: a
strategy holds ``<checkpoint>.lock`` (:mod:`.lock`, an ``flock`` that the OS
frees when the process dies) from the start of its run.

This module holds the :class:`Checkpoint` record, its saving and loading (every
field checked as it is read: :mod:`._checks`), and the checks of the
``checkpoint_path`` / ``resume`` options a strategy runs before its first
round. The history sidecar (:mod:`.history`), the lock (:mod:`.lock`), the
identity (:mod:`.identity`) and the generators' states (:mod:`.random_state`)
have modules of their own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..protocol import is_run_key
from ._checks import check_metrics, check_settings, checked_int, json_scalar
from .history import read_history
from .identity import check_identity
from .npz_store import (
    path_lock,
    read_groups,
    read_meta,
    remove_stale_temporaries,
    temporary_prefix,
    write_groups,
)
from .random_state import check_python_random, numpy_random_from, numpy_random_parts

FORMAT = "lips-flwr-checkpoint"
# 2: the history in a sidecar file, the run's identity. Version 1 files (history inline) are read.
VERSION = 2
READABLE_VERSIONS = (1,)  # besides VERSION
RESUME_CHOICES = (False, True, "auto")


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
    # The inertia trigger's series (JSON-able, LIPSCore.state()["trigger"]); None: the schedule.
    trigger: dict[str, Any] | None = None


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically (the parent folder is created).

    Concurrent saves to one path all succeed, and the file is always one of
    them, whole. Threads of this process are serialized (a per-path lock,
    :func:`~lips_flwr.persistence.npz_store.path_lock`, around the write and
    the removal of stale temporaries): refusing them instead would fail
    saves that are merely simultaneous, and the lock costs nothing
    uncontended. Processes are not serialized: each writes its own
    temporary (pid and random part in the name) and renames it into place
    atomically, and removes only the temporaries of processes that are gone.
    Whose save is on disk at the end is whichever renamed last; that two runs
    do not write one checkpoint is :func:`lock_checkpoint`'s job.
    """
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
    if checkpoint.trigger is not None:  # absent for the paper's schedule: those files stay as they were
        meta["trigger"] = checkpoint.trigger
    if checkpoint.numpy_random is not None:
        groups["numpy-random"], meta["numpy_random"] = numpy_random_parts(checkpoint.numpy_random)
    with path_lock(path):  # one save at a time in this process: neither removes the other's temporary
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
        inertia = {"t0": checked_int(meta["inertia"]["t0"])}
        for part in ("reference", "previous"):
            stored = meta["inertia"][part]
            if isinstance(stored, list):
                inertia[part] = {name: model[name] for name in stored}
            else:
                inertia[part] = groups[f"inertia-{part}"] if stored else None
    python_random = meta["python_random"]
    if python_random is not None:
        check_python_random(python_random)
    history = meta.get("history")
    if isinstance(history, dict) and "jsonl_bytes" in history:
        history = None  # in the sidecar: read by load_checkpoint
    for rounds in (history or {}).values():
        for key, metrics in rounds.items():
            int(key)
            check_metrics(key, metrics)
    run_key = meta.get("run_key")
    if run_key is not None and not is_run_key(run_key):
        raise ValueError(f"malformed run key {run_key!r}")
    strategy_meta = meta.get("strategy_meta")
    if strategy_meta is not None and not all(
            isinstance(strategy_meta.get(k, {}), dict) for k in ("settings", "scalars", "objects")):
        raise ValueError("malformed strategy state")
    numpy_random = meta.get("numpy_random")
    if numpy_random is not None:
        numpy_random = numpy_random_from(numpy_random, groups)
    layers = meta["layers"]
    if layers is not None and not all(isinstance(n, str) for n in layers):
        raise ValueError("malformed layer list")
    check_settings(meta["settings"], "settings")
    if strategy_meta is not None:
        for part in ("settings", "scalars"):
            for key, value in strategy_meta.get(part, {}).items():
                if json_scalar(value) is None:
                    raise ValueError(f"the value of {key!r} in the strategy's {part} is not a "
                                     f"number, string or bool: {value!r}")
    for group, arrays in groups.items():
        for name, array in arrays.items():
            if array.dtype.kind not in "biufc":
                raise ValueError(f"{group} {name!r} holds {array.dtype} values, not numbers")
    identity = meta.get("identity")
    if identity is not None:
        check_identity(identity, model)
    trigger = meta.get("trigger")
    if trigger is not None and not isinstance(trigger, dict):  # its contents: check_trigger_state on resume
        raise ValueError("malformed inertia-trigger state")
    unshaped = meta.get("unshaped_state", [])
    if not (isinstance(unshaped, list) and all(isinstance(k, str) for k in unshaped)):
        raise ValueError("malformed list of unshaped state")
    return Checkpoint(
        round=checked_int(meta["round"]),
        num_rounds=checked_int(meta["num_rounds"]),
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
        trigger=trigger,
    )
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
        with path_lock(path), tempfile.NamedTemporaryFile(dir=folder, prefix=temporary_prefix(path)):
            pass  # (named like a save's temporary: a save's cleanup must not remove it meanwhile)
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
    "Checkpoint", "FORMAT", "RESUME_CHOICES", "VERSION", "check_writable", "checkpoint_to_resume",
    "existing_checkpoint", "load_checkpoint", "model_mismatch", "resume_option", "save_checkpoint",
    "settings_mismatch", "validate_resume",
]
