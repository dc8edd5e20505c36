"""The LIPS core's part of a checkpoint: its settings and plain-data state (:meth:`LIPSCore.state`:
layer choice, inertia and trigger series), checked on resume against the live core's settings and
the checkpoint's own model before the core takes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...core.layers import candidate_names, select_layers
from ...core.lips import LIPSCore
from ...core.trigger import check_trigger_state
from ...persistence.checkpoint import Checkpoint, settings_mismatch
from ...persistence.identity import model_fingerprint


def checkpoint_of(
    core: LIPSCore, server_round: int, model: Mapping[str, np.ndarray], run_key: str | None = None
) -> Checkpoint:
    """The core's part of a checkpoint after ``server_round``; ``model`` is the broadcast one."""
    state = core.state()
    return Checkpoint(round=server_round, num_rounds=core.schedule.num_rounds, settings=core.settings(),
                      model=dict(model), layers=state["layers"], inertia=state["inertia"], run_key=run_key,
                      trigger=state["trigger"])


def run_identity(model: Mapping[str, np.ndarray], settings: dict, num_rounds: int) -> dict:
    """A run's identity: its initial model's fingerprint, its settings and ``num_rounds``."""
    return {"initial_model": model_fingerprint(model), "settings": dict(settings), "num_rounds": num_rounds}


def continue_schedule(core: LIPSCore, checkpoint: Checkpoint) -> None:
    """Take the schedule position and the core's state of ``checkpoint``; ``ValueError`` naming every
    difference when it was written with other settings or ``num_rounds`` (it would not continue the
    same schedule), or naming what does not fit (:func:`check_core_state`)."""
    problems = settings_mismatch(checkpoint.settings, core.settings())
    if core.num_rounds is not None and checkpoint.num_rounds != core.num_rounds:
        problems.append(f"num_rounds: checkpoint {checkpoint.num_rounds}, now {core.num_rounds}")
    if not 0 <= checkpoint.round <= checkpoint.num_rounds:
        problems.append(f"round {checkpoint.round} is outside 0..{checkpoint.num_rounds}")
    if problems:
        raise ValueError("the checkpoint was written by a LIPS strategy with other settings; "
                         "resuming would not continue the same schedule: " + "; ".join(problems))
    check_core_state(core, checkpoint)
    if core.num_rounds is None:
        core.set_num_rounds(checkpoint.num_rounds)
    core.load_state({"layers": checkpoint.layers, "inertia": checkpoint.inertia,
                     "trigger": checkpoint.trigger}, checkpoint.model, checkpoint.round)


def check_core_state(core: LIPSCore, checkpoint: Checkpoint) -> None:
    """``ValueError`` unless the checkpoint's layer choice (what ``core``'s ``layers`` selects on its
    model), inertia series and trigger series fit its model and ``core``."""
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
    """``model`` with the dtypes of its run's initial model, on which the layers were chosen (Flower's
    Message FedAvg returns integer buffers as float64)."""
    if identity is None:
        return model
    dtypes = dict(zip(identity["initial_model"]["names"], identity["initial_model"]["dtypes"]))
    return {name: array if name not in dtypes or np.dtype(dtypes[name]) == array.dtype
            else array.astype(np.dtype(dtypes[name]))
            for name, array in model.items()}


__all__ = ["check_core_state", "checkpoint_of", "continue_schedule", "run_identity"]
