"""Checkpoint and resume, as both adapters do it after their own conversions.

The checkpoint is assembled here: the core's settings and plain-data state
(layer choice, inertia series, inertia trigger's series: :meth:`LIPSCore.state`), the run key, the
wrapped strategies' state (:mod:`._strategy_state`) and the RNGs' state; the
file format is :mod:`lips_flwr.persistence.checkpoint`'s. On resume the
checkpoint is checked against the live settings, the run's initial model and
its own model's shapes, then everything is put back. Each adapter holds one
:class:`CheckpointKeeper`, which holds the checkpoint's lock for its run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log

from ..core.layers import candidate_names, select_layers
from ..core.lips import LIPSCore
from ..core.trigger import check_trigger_state
from ..persistence.checkpoint import (
    Checkpoint,
    check_writable,
    checkpoint_to_resume,
    existing_checkpoint,
    model_mismatch,
    numpy_random_state,
    python_random_state,
    restore_numpy_random,
    restore_python_random,
    save_checkpoint,
    settings_mismatch,
    validate_resume,
)
from ..persistence.history import HistoryLog
from ..persistence.identity import fingerprint_mismatch, model_fingerprint
from ..persistence.lock import CheckpointLock, lock_checkpoint
from ..protocol import new_run_key
from ._strategy_state import (
    FromState,
    ToState,
    capture,
    restore_state,
    scalar_settings,
    unshaped_state,
)


class CheckpointKeeper:
    """One strategy's checkpointing: what to save, when, and what to resume from.

    Parameters
    ----------
    path : str or PathLike, optional
        The checkpoint file; ``None``: no checkpoint (every method is then a no-op).
    resume : bool or "auto"
        See :class:`lips_flwr.strategies.LIPS`.
    """

    def __init__(self, path: Any, resume: Any) -> None:
        self.path, self.resume = validate_resume(path, resume)
        self.saved_round: int | None = None  # the round of the file on disk, written or read
        self.seconds: float | None = None  # time of the last save, not yet reported
        self._settings: dict = {}
        self._pending_random: Checkpoint | None = None
        # Names the run for the clients' persisted state: a new run gets a new key, a resumed one keeps it.
        self.run_key: str | None = None
        # The run's identity: its initial model's fingerprint and settings (taken at its first save).
        self.identity: dict | None = None
        self._lock: CheckpointLock | None = None  # held from begin() to the last round's save
        self._history: HistoryLog | None = None

    def begin(self, owner: Any, core: LIPSCore) -> Checkpoint | None:
        """At the start of a run: the checkpoint to continue from (checked), else name a fresh run.

        Takes the checkpoint's lock for the run. Raises ``ValueError`` before
        any round trains when another run is writing the checkpoint, when it
        has other settings or state that does not fit them, when it cannot be
        written, or (``resume=False``) when the file is not a LIPS checkpoint.
        """
        self._release()
        self.saved_round, self.seconds, self._pending_random = None, None, None
        self.run_key, self.identity, self._history = None, None, None
        self._settings = scalar_settings(owner)  # the wrapped strategies' settings, before any round
        if self.path is None:
            return None
        check_writable(self.path)  # also before reading: a folder given as the path is named so
        self._lock = lock_checkpoint(self.path)  # ValueError: another run is writing it
        if self._lock.os_note is not None:
            log(WARNING, "LIPS: %s: runs in other processes are not kept from writing %s",
                self._lock.os_note, self.path)
        try:
            return self._begin(core)
        except BaseException:
            self._release()
            raise

    def _begin(self, core: LIPSCore) -> Checkpoint | None:
        assert self.path is not None
        if not self.resume:
            meta = existing_checkpoint(self.path)  # ValueError when it is another kind of file
            if meta is not None:
                log(WARNING, "LIPS: this run (resume=False) replaces the LIPS checkpoint %r of a run "
                    "(run key %s, round %s of %s); resume=True or \"auto\" would continue that run",
                    self.path, meta.get("run_key"), meta.get("round"), meta.get("num_rounds"))
        found = checkpoint_to_resume(self.path, self.resume)
        if found is None:
            if self.resume == "auto":
                log(INFO, "LIPS: no checkpoint at %s yet: starting at round 1", self.path)
            self.run_key = new_run_key()
            self._history = HistoryLog(self.path, self.run_key)
            return None
        continue_schedule(core, found)  # ValueError naming each differing setting or misfit state
        for note in found.notes:
            log(WARNING, "LIPS: the checkpoint %s: %s", self.path, note)
        self.run_key = found.run_key
        self.saved_round = found.round
        self.identity = found.identity
        self._history = HistoryLog(self.path, self.run_key)
        self._history.adopt(found)
        if found.round >= found.num_rounds:
            self._release()  # nothing left to write
        return found

    def restore(
        self, owner: Any, checkpoint: Checkpoint, initial_model: Mapping[str, np.ndarray] | None,
        to_state: ToState, from_state: FromState,
    ) -> None:
        """Put the wrapped strategies' state back; the RNGs' state waits for :meth:`before_round`.

        ``initial_model`` (the model the run was given, when known) must have
        the checkpoint model's names and shapes, and be the initial model of
        the run that wrote the checkpoint: ``ValueError`` otherwise.
        """
        try:
            self._restore(owner, checkpoint, initial_model, to_state, from_state)
        except BaseException:
            self._release()
            raise
        # Restored at the first round, not now: the run may draw random numbers before it
        # (Flower evaluates the initial model first) that the original run drew before saving.
        self._pending_random = checkpoint
        if checkpoint.round < checkpoint.num_rounds:
            log(INFO, "LIPS: resuming from %s: rounds 1-%d are done, continuing with round %d of %d",
                self.path, checkpoint.round, checkpoint.round + 1, checkpoint.num_rounds)
        else:
            log(INFO, "LIPS: resuming from %s: all %d rounds are done, nothing to run",
                self.path, checkpoint.num_rounds)

    def _restore(
        self, owner: Any, checkpoint: Checkpoint, initial_model: Mapping[str, np.ndarray] | None,
        to_state: ToState, from_state: FromState,
    ) -> None:
        if initial_model is not None:
            reason = model_mismatch(checkpoint.model, initial_model)
            if reason is not None:
                raise ValueError(f"the checkpoint {self.path!r} holds another model than the one "
                                 f"this run starts with: {reason}")
            if checkpoint.identity is not None:
                reason = fingerprint_mismatch(checkpoint.identity["initial_model"], initial_model)
                if reason is not None:
                    raise ValueError(
                        f"the checkpoint {self.path!r} was written by another run (its initial model "
                        f"differs: {reason}): resume a run with the initial model it started from "
                        "(seed the model's initialization), or start a new run: resume=False, or "
                        "another checkpoint_path")
            elif self.identity is None:  # a checkpoint from before identities: this run's from now on
                self.identity = run_identity(initial_model, checkpoint.settings, checkpoint.num_rounds)
        restore_state(owner, checkpoint.strategy, checkpoint.strategy_meta, to_state, from_state,
                      model=checkpoint.model, unshaped=checkpoint.unshaped_state)

    def before_round(self) -> None:
        """Called first thing in each round's configure: restore the RNGs' state, once."""
        checkpoint, self._pending_random = self._pending_random, None
        if checkpoint is not None and checkpoint.python_random is not None:
            restore_python_random(checkpoint.python_random)
        if checkpoint is not None and checkpoint.numpy_random is not None:
            restore_numpy_random(checkpoint.numpy_random)

    def save(
        self, owner: Any, core: LIPSCore, server_round: int,
        model: Mapping[str, np.ndarray], to_state: ToState,
        history: Mapping[str, Mapping[int, Mapping]] | None = None,
    ) -> None:
        """Write the state after ``server_round`` (``model``: the global model then), once per round.

        Round 0 writes nothing: its ``model`` is the run's initial model, whose
        fingerprint becomes the run's identity. ``history`` (per-round
        metrics) is appended to the history file, a round at a time. After the
        last round the lock goes: the run is over.
        """
        if self.path is None:
            return
        if server_round == 0 and self.identity is None:
            self.identity = run_identity(model, core.settings(), core.schedule.num_rounds)
        if server_round < 1 or server_round == self.saved_round:
            return
        self._hold_lock()
        start = time.perf_counter()
        checkpoint = checkpoint_of(core, server_round, model, self.run_key)
        checkpoint.strategy, checkpoint.strategy_meta = capture(owner, to_state, self._settings)
        checkpoint.unshaped_state = unshaped_state(checkpoint.strategy, checkpoint.model)
        checkpoint.identity = self.identity
        checkpoint.python_random = python_random_state()
        checkpoint.numpy_random = numpy_random_state()
        if history is not None:
            if self._history is None:
                self._history = HistoryLog(self.path, self.run_key)
            checkpoint.history_bytes = self._history.append(history, server_round)
        save_checkpoint(self.path, checkpoint)
        self.saved_round = server_round
        self.seconds = time.perf_counter() - start
        if server_round >= checkpoint.num_rounds:
            self._release()  # the run is over: another may use the path

    def _hold_lock(self) -> None:
        """``ValueError`` when another run took the checkpoint over; take the lock if not held."""
        assert self.path is not None
        if self._lock is not None and self._lock.taken_over:
            self._lock.check()
        if self._lock is None or not self._lock.held:
            self._lock = lock_checkpoint(self.path)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def report(self, metrics: dict) -> None:
        """Add ``lips-checkpoint-seconds`` of the last save to a round's metrics, once."""
        if self.seconds is not None:
            metrics["lips-checkpoint-seconds"] = self.seconds
            self.seconds = None


def checkpoint_of(
    core: LIPSCore, server_round: int, model: Mapping[str, np.ndarray], run_key: str | None = None
) -> Checkpoint:
    """The core's part of a checkpoint after ``server_round``; ``model`` is the broadcast one."""
    state = core.state()
    return Checkpoint(
        round=server_round, num_rounds=core.schedule.num_rounds, settings=core.settings(),
        model=dict(model), layers=state["layers"], inertia=state["inertia"], run_key=run_key,
        trigger=state["trigger"],
    )


def run_identity(model: Mapping[str, np.ndarray], settings: dict, num_rounds: int) -> dict:
    """A run's identity: its initial model's fingerprint, its settings and ``num_rounds``."""
    return {"initial_model": model_fingerprint(model), "settings": dict(settings), "num_rounds": num_rounds}


def continue_schedule(core: LIPSCore, checkpoint: Checkpoint) -> None:
    """Take the schedule position, layer choice, inertia series and trigger series of ``checkpoint``.

    Raises ``ValueError`` naming every difference when the checkpoint was
    written with other hyperparameters or another ``num_rounds``: it would
    not continue the same schedule; and naming what does not fit when its
    layer choice is not what ``core``'s ``layers`` selects on its model, or
    its inertia series or inertia trigger's series does not fit its model.
    """
    problems = settings_mismatch(checkpoint.settings, core.settings())
    if core.num_rounds is not None and checkpoint.num_rounds != core.num_rounds:
        problems.append(f"num_rounds: checkpoint {checkpoint.num_rounds}, now {core.num_rounds}")
    if not 0 <= checkpoint.round <= checkpoint.num_rounds:
        problems.append(f"round {checkpoint.round} is outside 0..{checkpoint.num_rounds}")
    if problems:
        raise ValueError(
            "the checkpoint was written by a LIPS strategy with other settings; "
            "resuming would not continue the same schedule: " + "; ".join(problems)
        )
    check_core_state(core, checkpoint)
    if core.num_rounds is None:
        core.set_num_rounds(checkpoint.num_rounds)
    core.load_state({"layers": checkpoint.layers, "inertia": checkpoint.inertia,
                     "trigger": checkpoint.trigger}, checkpoint.model, checkpoint.round)


def check_core_state(core: LIPSCore, checkpoint: Checkpoint) -> None:
    """``ValueError`` unless the checkpoint's layer choice, inertia series and trigger series fit
    its model and ``core``."""
    model = checkpoint.model
    if core.inertia_trigger is not None:
        if checkpoint.trigger is None:
            raise ValueError("the checkpoint has no inertia-trigger series, which trigger='inertia' "
                             "needs to continue: the checkpoint is damaged")
        try:
            check_trigger_state(checkpoint.trigger, core.inertia_trigger.window, core.inertia_trigger.every,
                                candidate_names(model), checkpoint.round)
        except ValueError as err:
            raise ValueError(f"the checkpoint's inertia-trigger series does not fit its model and "
                             f"settings: {err}") from err
    if checkpoint.layers is not None:
        missing = [n for n in checkpoint.layers if n not in model]
        if missing:
            raise ValueError(f"the checkpoint's layer choice names {missing}, which its model lacks: "
                             "the checkpoint is damaged")
        label = _layers_label(core.layers)
        try:
            expected = select_layers(_as_initial(model, checkpoint.identity), core.layers)
        except ValueError as err:
            raise ValueError(f"layers={label} does not fit the checkpoint's model: {err}") from err
        if list(checkpoint.layers) != expected:
            raise ValueError(f"the checkpoint's layer choice {list(checkpoint.layers)} is not what "
                             f"layers={label} selects on its model ({expected}): resuming would mask "
                             "other layers than the run did")
    inertia = checkpoint.inertia
    if inertia is None or core.inertia is None:
        return
    tracked = candidate_names(model)
    for part in ("reference", "previous"):
        tensors = inertia.get(part)
        if tensors is None:
            continue
        problems = []
        unknown = [n for n in tensors if n not in model]
        if unknown:
            problems.append(f"names {unknown[:5]} the model lacks")
        shapes = [f"{n} {np.shape(tensors[n])}, the model's {np.shape(model[n])}"
                  for n in tensors if n in model and np.shape(tensors[n]) != np.shape(model[n])]
        if shapes:
            problems.append("other shapes: " + "; ".join(shapes[:5]))
        lacking = [n for n in tracked if n not in tensors]
        if lacking:
            problems.append(f"no {lacking[:5]}, tracked in the model")
        if problems:
            raise ValueError(f"the checkpoint's inertia {part} model does not fit its model: "
                             + ", ".join(problems))


def _layers_label(layers: Any) -> str:
    if callable(layers):
        return f"callable {getattr(layers, '__qualname__', type(layers).__name__)}"
    return repr(layers if isinstance(layers, str) else list(layers))


def _as_initial(model: Mapping[str, np.ndarray], identity: dict | None) -> Mapping[str, np.ndarray]:
    """``model`` with the dtypes of its run's initial model, on which the layers were chosen.

    Flower's Message API FedAvg returns integer buffers as float64: the
    checkpoint's model may have other dtypes than the model the run started with.
    """
    if identity is None:
        return model
    dtypes = dict(zip(identity["initial_model"]["names"], identity["initial_model"]["dtypes"]))
    return {name: array if name not in dtypes or np.dtype(dtypes[name]) == array.dtype
            else array.astype(np.dtype(dtypes[name]))
            for name, array in model.items()}
