"""Checkpoint and resume, as both adapters do it after their own conversions.

The checkpoint is assembled here: the core's settings and plain-data state
(layer choice, inertia series: :meth:`LIPSCore.state`), the run key, the
wrapped strategies' state (:mod:`._strategy_state`) and the RNGs' state; the
file format is :mod:`lips_flwr.persistence.checkpoint`'s. On resume the
checkpoint is checked against the live settings and everything is put back.
Each adapter holds one :class:`CheckpointKeeper`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import log

from ..core.lips import LIPSCore
from ..persistence.checkpoint import (
    Checkpoint,
    check_writable,
    checkpoint_to_resume,
    model_mismatch,
    numpy_random_state,
    python_random_state,
    restore_numpy_random,
    restore_python_random,
    save_checkpoint,
    settings_mismatch,
    validate_resume,
)
from ..protocol import new_run_key
from ._strategy_state import FromState, ToState, capture, restore_state, scalar_settings


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

    def begin(self, owner: Any, core: LIPSCore) -> Checkpoint | None:
        """At the start of a run: the checkpoint to continue from (checked), else name a fresh run.

        Raises ``ValueError`` before any round trains when the checkpoint has
        other settings or cannot be written.
        """
        self.saved_round, self.seconds, self._pending_random = None, None, None
        self.run_key = None
        self._settings = scalar_settings(owner)  # the wrapped strategies' settings, before any round
        if self.path is None:
            return None
        check_writable(self.path)  # also before reading: a folder given as the path is named so
        found = checkpoint_to_resume(self.path, self.resume)
        if found is None:
            if self.resume == "auto":
                log(INFO, "LIPS: no checkpoint at %s yet: starting at round 1", self.path)
            self.run_key = new_run_key()
            return None
        continue_schedule(core, found)  # ValueError naming each differing setting
        self.run_key = found.run_key
        self.saved_round = found.round
        return found

    def restore(
        self, owner: Any, checkpoint: Checkpoint, initial_model: Mapping[str, np.ndarray] | None,
        to_state: ToState, from_state: FromState,
    ) -> None:
        """Put the wrapped strategies' state back; the RNGs' state waits for :meth:`before_round`.

        ``initial_model`` (the model the run was given, when known) must have
        the checkpoint model's names and shapes.
        """
        if initial_model is not None:
            reason = model_mismatch(checkpoint.model, initial_model)
            if reason is not None:
                raise ValueError(f"the checkpoint {self.path!r} holds another model than the one "
                                 f"this run starts with: {reason}")
        restore_state(owner, checkpoint.strategy, checkpoint.strategy_meta, to_state, from_state)
        # Restored at the first round, not now: the run may draw random numbers before it
        # (Flower evaluates the initial model first) that the original run drew before saving.
        self._pending_random = checkpoint
        if checkpoint.round < checkpoint.num_rounds:
            log(INFO, "LIPS: resuming from %s: rounds 1-%d are done, continuing with round %d of %d",
                self.path, checkpoint.round, checkpoint.round + 1, checkpoint.num_rounds)
        else:
            log(INFO, "LIPS: resuming from %s: all %d rounds are done, nothing to run",
                self.path, checkpoint.num_rounds)

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
        """Write the state after ``server_round`` (``model``: the global model then), once per round."""
        if self.path is None or server_round < 1 or server_round == self.saved_round:
            return
        start = time.perf_counter()
        checkpoint = checkpoint_of(core, server_round, model, self.run_key)
        checkpoint.strategy, checkpoint.strategy_meta = capture(owner, to_state, self._settings)
        checkpoint.python_random = python_random_state()
        checkpoint.numpy_random = numpy_random_state()
        if history is not None:
            checkpoint.history = {
                part: {str(r): dict(m) for r, m in rounds.items() if r <= server_round}
                for part, rounds in history.items()
            }
        save_checkpoint(self.path, checkpoint)
        self.saved_round = server_round
        self.seconds = time.perf_counter() - start

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
    )


def continue_schedule(core: LIPSCore, checkpoint: Checkpoint) -> None:
    """Take the schedule position, layer choice and inertia series of ``checkpoint``.

    Raises ``ValueError`` naming every difference when the checkpoint was
    written with other hyperparameters or another ``num_rounds``: it would
    not continue the same schedule.
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
    if core.num_rounds is None:
        core.set_num_rounds(checkpoint.num_rounds)
    core.load_state({"layers": checkpoint.layers, "inertia": checkpoint.inertia}, checkpoint.model)
