"""The wrapped strategies' state in a checkpoint, found and put back generically.

A LIPS strategy wraps a chain of strategies (``LIPS(DP(FedAvgM(...)))``)
whose state evolves during a run: model copies and momenta (FedAvgM's
``momentum_vector``, FedAdam's ``m_t``/``v_t``, DP's ``current_arrays``), numbers
(the adaptive clipping norm) and objects with a ``state_dict`` (the privacy
accountant). What is saved, per strategy of the chain:

* arrays: every attribute holding model-shaped values (an ArrayRecord,
  Parameters, a dict or list of ndarrays), whatever their value;
* numbers and strings that changed since the run began: evolved state, not
  settings, so a resumed strategy keeps the settings it is built with;
* objects with ``state_dict()``/``load_state_dict()`` whose state is JSON.

The chain's classes must be the same on resume (``ValueError`` otherwise);
its scalar settings may differ, with a warning naming each difference.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import log

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


def chain_classes(owner: Any) -> list[str]:
    return [type(inner).__name__ for inner in strategy_chain(owner)]


def _attributes(owner: Any) -> dict[str, tuple[Any, str]]:
    """``"depth.Class.attribute" -> (strategy, attribute)`` over the chain (not LIPS's own)."""
    out = {}
    for depth, inner in enumerate(strategy_chain(owner)):
        for attribute in vars(inner):
            if attribute != "strategy" and not attribute.startswith("_lips"):
                out[f"{depth}.{type(inner).__name__}.{attribute}"] = (inner, attribute)
    return out


def _scalar(value: Any) -> Any:
    """``value`` as a JSON number/string/bool/None, or ``_NOT_SCALAR``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return _NOT_SCALAR


_NOT_SCALAR = object()


def scalar_settings(owner: Any) -> dict[str, Any]:
    """The chain's scalar attributes now (at the start of a run: its settings)."""
    out = {}
    for key, (inner, attribute) in _attributes(owner).items():
        value = _scalar(getattr(inner, attribute))
        if value is not _NOT_SCALAR:
            out[key] = value
    return out


def _object_state(value: Any) -> dict | None:
    """A JSON ``state_dict()`` of an object that can load it back, or ``None``."""
    if not (callable(getattr(value, "state_dict", None))
            and callable(getattr(value, "load_state_dict", None))):
        return None
    try:
        state = value.state_dict()
        json.dumps(state, allow_nan=False)
    except (TypeError, ValueError, RuntimeError):
        return None  # e.g. a torch module: tensors are not this module's business
    return state if isinstance(state, dict) else None


def capture(owner: Any, to_state: ToState, settings: Mapping[str, Any]) -> tuple[dict, dict]:
    """``(arrays, meta)`` of the chain's state; ``settings`` is :func:`scalar_settings` at the run's start."""
    arrays, scalars, objects = {}, {}, {}
    for key, (inner, attribute) in _attributes(owner).items():
        value = getattr(inner, attribute)
        found = to_state(value)
        if found is not None:
            arrays[key] = found
            continue
        scalar = _scalar(value)
        if scalar is not _NOT_SCALAR:
            if key not in settings or settings[key] != scalar:
                scalars[key] = scalar
            continue
        state = _object_state(value)
        if state is not None:
            objects[key] = state
    meta = {"chain": chain_classes(owner), "settings": dict(settings),
            "scalars": scalars, "objects": objects}
    return arrays, meta


def restore_state(
    owner: Any, arrays: Mapping[str, tuple[str, Mapping]], meta: Mapping | None,
    to_state: ToState, from_state: FromState,
) -> None:
    """Put captured state back into a chain of the same classes; ``ValueError`` otherwise."""
    meta = meta or {}
    here = _attributes(owner)
    saved_chain, chain = meta.get("chain"), chain_classes(owner)
    if saved_chain is not None and saved_chain != chain:
        raise ValueError(f"the checkpoint was written by a LIPS strategy wrapping {saved_chain}, "
                         f"this one wraps {chain}: resume with the same strategies")
    settings_now = scalar_settings(owner)
    changed = [f"{k}: checkpoint {v!r}, now {settings_now.get(k)!r}"
               for k, v in meta.get("settings", {}).items() if settings_now.get(k, v) != v]
    if changed:
        log(WARNING, "LIPS: resuming with other settings of the wrapped strategies: %s",
            "; ".join(changed))

    def target(key: str, what: str) -> tuple[Any, str]:
        if key not in here:
            raise ValueError(f"the checkpoint holds {what} {key!r}, which this strategy chain "
                             f"{chain} does not have: resume with the same strategies")
        return here[key]

    for key, (kind, tensors) in arrays.items():
        inner, attribute = target(key, "array state")
        current = getattr(inner, attribute)
        empty = hasattr(current, "__len__") and len(current) == 0  # e.g. DP's ArrayRecord()
        if current is not None and not empty and to_state(current) is None:  # not other objects
            raise ValueError(f"the checkpoint's array state {key!r} would replace a "
                             f"{type(current).__name__}: not written by this strategy chain")
        setattr(inner, attribute, from_state(kind, tensors))
    for key, value in meta.get("scalars", {}).items():
        inner, attribute = target(key, "the value")
        if _scalar(getattr(inner, attribute)) is _NOT_SCALAR:
            raise ValueError(f"the checkpoint's value for {key!r} would replace a "
                             f"{type(getattr(inner, attribute)).__name__}")
        setattr(inner, attribute, value)
    for key, state in meta.get("objects", {}).items():
        inner, attribute = target(key, "the state of")
        try:
            getattr(inner, attribute).load_state_dict(state)
        except Exception as err:  # the object's own validation: any error means "cannot resume"
            raise ValueError(f"cannot restore {key!r} from the checkpoint: {err}") from err
