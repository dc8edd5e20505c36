"""Checkpoint and resume for both adapters: what to save, when, and what to resume from.

A checkpoint holds the core's settings and state (:mod:`.core_state`), the run
key, the wrapped strategies' state (:mod:`.chain_state`) and the RNGs' state,
in :mod:`lips_flwr.persistence.checkpoint`'s format. On resume it is checked
against the live settings, the run's initial model and its own model before
anything is put back.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import log

from ...core.lips import LIPSCore
from ...errors import ConfigError
from ...persistence.checkpoint import (
    Checkpoint,
    check_writable,
    checkpoint_to_resume,
    existing_checkpoint,
    model_mismatch,
    save_checkpoint,
    validate_resume,
)
from ...persistence.history import HistoryLog
from ...persistence.identity import fingerprint_mismatch
from ...persistence.lock import CheckpointLock, lock_checkpoint
from ...persistence.random_state import (
    numpy_random_state,
    python_random_state,
    restore_numpy_random,
    restore_python_random,
)
from ...protocol import new_run_key
from ..chain import check_declarations
from .chain_state import ChainRecord, FromState, ToState, restore_state, unshaped_state
from .core_state import checkpoint_of, continue_schedule, run_identity


class CheckpointKeeper:
    """One strategy's checkpointing, with the checkpoint's lock for its run (``path`` ``None``: no
    checkpoint, nothing to do; ``resume``, ``skip_undeclared``: the strategy's options ``resume`` and
    ``skip_undeclared_state``)."""

    def __init__(self, path: Any, resume: Any, skip_undeclared: Any = False) -> None:
        self.path, self.resume = validate_resume(path, resume)
        if not isinstance(skip_undeclared, bool):
            raise ConfigError(f"`skip_undeclared_state` must be True or False, got {skip_undeclared!r}")
        self.skip_undeclared = skip_undeclared
        self.saved_round: int | None = None  # the round of the file on disk, written or read
        self.seconds: float | None = None  # time of the last save, not yet reported
        self._chain = ChainRecord()  # the wrapped strategies' part
        self._pending_random: Checkpoint | None = None
        # Names the run for the clients' persisted state: a new run gets a new key, a resumed one keeps it.
        self.run_key: str | None = None
        # The run's identity: its initial model's fingerprint and settings (taken at its first save).
        self.identity: dict | None = None
        self._lock: CheckpointLock | None = None  # held from begin() to the last round's save
        self._history: HistoryLog | None = None

    def begin(self, owner: Any, core: LIPSCore) -> Checkpoint | None:
        """At the start of a run, its lock taken: the checkpoint to continue from (checked), else
        ``None`` and a new run key. ``ValueError`` before any round when another run is writing the
        checkpoint, when it does not fit the settings, cannot be written, or (``resume=False``) is
        not a LIPS checkpoint."""
        self.release()
        self.saved_round, self.seconds, self._pending_random = None, None, None
        self.run_key, self.identity, self._history = None, None, None
        self._chain.begin(owner)  # the wrapped strategies' settings, before any round
        if self.path is None:
            return None
        check_declarations(owner)  # TypeError: a malformed lips_state, before any round
        check_writable(self.path)  # also before reading: a folder given as the path is named so
        self._lock = lock_checkpoint(self.path)  # ValueError: another run is writing it
        if self._lock.os_note is not None:
            log(WARNING, "LIPS: %s: runs in other processes are not kept from writing %s",
                self._lock.os_note, self.path)
        try:
            return self._begin(core)
        except BaseException:
            self.release()
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
            self.release()  # nothing left to write
        return found

    def restore(
        self, owner: Any, checkpoint: Checkpoint, initial_model: Mapping[str, np.ndarray] | None,
        to_state: ToState, from_state: FromState,
    ) -> None:
        """Put the wrapped strategies' state back; the RNGs' state waits for :meth:`before_round`.
        ``ValueError`` unless ``initial_model`` (the run's, when known) is the initial model of the
        run that wrote the checkpoint."""
        try:
            self._restore(owner, checkpoint, initial_model, to_state, from_state)
        except BaseException:
            self.release()
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
                      model=checkpoint.model, unshaped=checkpoint.unshaped_state,
                      skip_undeclared=self.skip_undeclared)

    def before_round(self) -> None:
        """Called first thing in each round's configure: restore the RNGs' state, once."""
        checkpoint, self._pending_random = self._pending_random, None
        if checkpoint is not None and checkpoint.python_random is not None:
            restore_python_random(checkpoint.python_random)
        if checkpoint is not None and checkpoint.numpy_random is not None:
            restore_numpy_random(checkpoint.numpy_random)

    def save(self, owner: Any, core: LIPSCore, server_round: int, model: Mapping[str, np.ndarray],
             to_state: ToState, history: Mapping[str, Mapping[int, Mapping]] | None = None) -> None:
        """Write the state after ``server_round`` (``model``: the global model then), once per round.

        Round 0 writes nothing: its ``model``'s fingerprint becomes the run's
        identity. ``history`` (per-round metrics) is appended to the history
        file. A save the OS refuses is an ERROR and the run goes on: the next
        round's save tries again. After the last round's save, written or not,
        the lock goes (the legacy API has no end-of-run hook).
        """
        if self.path is None:
            return
        self._chain.observe(owner)  # before round 1 when begin() did not run (a loop other than start())
        if server_round == 0 and self.identity is None:
            self.identity = run_identity(model, core.settings(), core.schedule.num_rounds)
        if server_round < 1 or server_round == self.saved_round:
            return
        self._hold_lock()
        start = time.perf_counter()
        checkpoint = checkpoint_of(core, server_round, model, self.run_key)
        checkpoint.strategy, checkpoint.strategy_meta = self._chain.capture(owner, to_state, self.path)
        checkpoint.unshaped_state = unshaped_state(checkpoint.strategy, checkpoint.model)
        checkpoint.identity = self.identity
        checkpoint.python_random = python_random_state()
        checkpoint.numpy_random = numpy_random_state()
        try:
            if history is not None:
                if self._history is None:
                    self._history = HistoryLog(self.path, self.run_key)
                checkpoint.history_bytes = self._history.append(history, server_round)
            save_checkpoint(self.path, checkpoint)
        except OSError as err:  # a full disk, a folder turned read-only: the run is worth more
            held = "none written yet" if self.saved_round is None else f"it holds round {self.saved_round}"
            log(ERROR, "LIPS: cannot write the checkpoint %r after round %d (%s: %s): the run goes on; "
                "the next round's save tries again (%s)", self.path, server_round, type(err).__name__, err,
                held)
        else:
            self.saved_round = server_round
            self.seconds = time.perf_counter() - start
        finally:
            if server_round >= checkpoint.num_rounds:
                self.release()  # the run is over, saved or not: another may use the path

    def _hold_lock(self) -> None:
        """``ValueError`` when another run took the checkpoint over; take the lock if not held."""
        assert self.path is not None
        if self._lock is not None and self._lock.taken_over:
            self._lock.check()
        if self._lock is None or not self._lock.held:
            self._lock = lock_checkpoint(self.path)

    def release(self) -> None:
        """The run is over (done or failed): let another run write the checkpoint."""
        if self._lock is not None:
            self._lock.release()

    def report(self, metrics: dict) -> None:
        """Add ``lips-checkpoint-seconds`` of the last save to a round's metrics, once."""
        if self.seconds is not None:
            metrics["lips-checkpoint-seconds"] = self.seconds
            self.seconds = None


__all__ = ["CheckpointKeeper"]
