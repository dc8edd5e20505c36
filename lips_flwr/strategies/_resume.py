"""Checkpoint and resume, as both adapters do it after their own conversions.

The sparsifier contributes the schedule position, the layer choice and the
inertia series (:meth:`TransientSparsifier.checkpoint`); this module adds the
model-shaped state of the wrapped strategies and Python's ``random`` state,
writes the file each round, and on resume checks it and puts it all back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from logging import INFO
from typing import Any

import numpy as np
from flwr.common import log

from ..checkpoint import (
    Checkpoint,
    checkpoint_to_resume,
    model_mismatch,
    python_random_state,
    restore_python_random,
    save_checkpoint,
)
from ..sparsifier import TransientSparsifier
from ._cache_sync import strategy_chain

# ``value -> (kind, name -> ndarray)`` or ``None`` when the value is not model-shaped state.
ToState = Callable[[Any], "tuple[str, dict[str, np.ndarray]] | None"]
# ``(kind, name -> ndarray) -> value`` of that kind.
FromState = Callable[[str, Mapping[str, np.ndarray]], Any]


def ndarray_state(value: Any) -> tuple[str, dict[str, np.ndarray]] | None:
    """Plain numpy state: a dict of arrays (Message FedAdam's ``m_t``) or a list (legacy ``m_t``)."""
    if isinstance(value, dict) and value and all(
            isinstance(k, str) and isinstance(v, (np.ndarray, np.generic)) for k, v in value.items()):
        return "dict", {k: np.asarray(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, (np.ndarray, np.generic)) for v in value):
        return "list", {str(i): np.asarray(v) for i, v in enumerate(value)}
    return None


def ndarray_value(kind: str, arrays: Mapping[str, np.ndarray]) -> Any:
    if kind == "dict":
        return {k: np.array(v) for k, v in arrays.items()}
    if kind == "list":
        return [np.array(v) for v in arrays.values()]
    raise ValueError(f"unknown kind of strategy state {kind!r} in the checkpoint")


def _chain_attributes(owner: Any) -> list[tuple[str, Any, str]]:
    """``(key, strategy, attribute)`` for the state-bearing attributes of the chain.

    The key names the position in the chain and the class, so that a
    checkpoint is never put back into a different chain of wrappers.
    """
    out = []
    for depth, inner in enumerate(strategy_chain(owner)):
        for attribute in vars(inner):
            if attribute == "strategy" or attribute.startswith("_lips"):
                continue
            out.append((f"{depth}.{type(inner).__name__}.{attribute}", inner, attribute))
    return out


def chain_state(owner: Any, to_state: ToState) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Model-shaped state of every strategy in the chain (models, momenta, moments)."""
    state = {}
    for key, inner, attribute in _chain_attributes(owner):
        found = to_state(getattr(inner, attribute))
        if found is not None:
            state[key] = found
    return state


def restore_chain_state(owner: Any, saved: Mapping[str, tuple[str, Mapping]], from_state: FromState) -> None:
    """Put saved state back; ``ValueError`` if the chain of wrappers is not the same."""
    here = {key: (inner, attribute) for key, inner, attribute in _chain_attributes(owner)}
    chain = [type(s).__name__ for s in strategy_chain(owner)]
    for key, (kind, arrays) in saved.items():
        depth, cls, attribute = key.split(".", 2)
        if int(depth) >= len(chain) or chain[int(depth)] != cls:
            raise ValueError(
                f"the checkpoint holds state of {cls} at depth {depth} of the wrapped "
                f"strategies, but this strategy wraps {chain}: resume with the same strategies"
            )
        inner = here[key][0] if key in here else list(strategy_chain(owner))[int(depth)]
        setattr(inner, attribute, from_state(kind, arrays))


def save_round(
    owner: Any,
    sparsifier: TransientSparsifier,
    path: str,
    server_round: int,
    model: Mapping[str, np.ndarray],
    to_state: ToState,
    history: Mapping[str, Mapping[int, Mapping]] | None = None,
) -> float:
    """Write the checkpoint after ``server_round``; returns the seconds it took.

    ``history``: per part, round -> metrics (JSON-able) of the rounds so far.
    """
    start = time.perf_counter()
    checkpoint = sparsifier.checkpoint(server_round, model)
    if history is not None:
        checkpoint.history = {
            part: {str(r): dict(m) for r, m in rounds.items() if r <= server_round}
            for part, rounds in history.items()
        }
    checkpoint.strategy = chain_state(owner, to_state)
    checkpoint.python_random = python_random_state()
    save_checkpoint(path, checkpoint)
    return time.perf_counter() - start


def load_for_resume(sparsifier: TransientSparsifier, path: str | None, mode: bool | str) -> Checkpoint | None:
    """The checkpoint to continue from, checked against the sparsifier's settings; ``None``: start fresh."""
    checkpoint = checkpoint_to_resume(path, mode)
    if checkpoint is None:
        if mode == "auto":
            log(INFO, "LIPS: no checkpoint at %s yet: starting at round 1", path)
        return None
    sparsifier.resume_from(checkpoint)  # ValueError naming each differing setting
    return checkpoint


def restore(
    owner: Any,
    checkpoint: Checkpoint,
    path: str | None,
    initial_model: Mapping[str, np.ndarray] | None,
    from_state: FromState,
) -> None:
    """Put the wrapped strategies' state and Python's ``random`` state back.

    ``initial_model`` (the model the run was given, when known) must have the
    checkpoint model's names and shapes.
    """
    if initial_model is not None:
        reason = model_mismatch(checkpoint.model, initial_model)
        if reason is not None:
            raise ValueError(
                f"the checkpoint {path!r} holds another model than the one this run "
                f"starts with: {reason}"
            )
    restore_chain_state(owner, checkpoint.strategy, from_state)
    if checkpoint.python_random is not None:
        restore_python_random(checkpoint.python_random)
    log(INFO, "LIPS: resuming from %s: rounds 1-%d are done, continuing with round %d of %d",
        path, checkpoint.round, checkpoint.round + 1, checkpoint.num_rounds)
