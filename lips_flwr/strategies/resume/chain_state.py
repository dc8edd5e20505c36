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
its scalar settings may differ, with a warning naming each difference. What
is put back is checked first (:func:`restore_state`): model-shaped state
against the checkpoint's model, values against the kind of the attribute
they replace; each restored value is named in a warning.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import log

from ..chain import strategy_chain

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


def shape_problem(tensors: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]) -> str | None:
    """Why model-shaped state ``tensors`` does not fit ``model``, or ``None``.

    Its arrays are the model's, in order, keyed by the model's names or by
    position (``"0"``, ``"1"``, ...: a list, legacy ``Parameters`` without
    ``param_names``), each of the model's shape (any dtype).
    """
    names, model_names = list(tensors), list(model)
    if names != model_names and names != [str(i) for i in range(len(model_names))]:
        return (f"{len(names)} arrays named {names[:3]}..., the model has {len(model_names)} "
                f"named {model_names[:3]}...")
    differ = [m for n, m in zip(names, model_names) if np.shape(tensors[n]) != np.shape(model[m])]
    if differ:
        name = differ[0]
        shape = np.shape(tensors[names[model_names.index(name)]])
        return f"shapes differ in {differ[:5]} ({name}: {shape}, the model's {np.shape(model[name])})"
    return None


def unshaped_state(arrays: Mapping[str, tuple[str, Mapping]], model: Mapping[str, np.ndarray]) -> list[str]:
    """The keys of captured array state that are not shaped like ``model`` (saved as such)."""
    return [key for key, (_, tensors) in arrays.items() if shape_problem(tensors, model) is not None]


def _kind(value: Any) -> str | None:
    """The kind of a scalar: ``"none"``, ``"bool"``, ``"number"`` (finite), ``"str"``; else ``None``."""
    scalar = _scalar(value)
    if scalar is _NOT_SCALAR:
        return None
    if scalar is None:
        return "none"
    if isinstance(scalar, bool):
        return "bool"
    return "str" if isinstance(scalar, str) else "number"


def restore_state(
    owner: Any, arrays: Mapping[str, tuple[str, Mapping]], meta: Mapping | None,
    to_state: ToState, from_state: FromState, model: Mapping[str, np.ndarray] | None = None,
    unshaped: Iterable[str] = (),
) -> None:
    """Put captured state back into a chain of the same classes; ``ValueError`` otherwise.

    Everything is checked before anything is set: each array state goes to an
    attribute of the chain that holds no other object and, unless saved as
    ``unshaped``, has the names and shapes of ``model`` (the checkpoint's);
    each value goes to an attribute holding a value of its kind (a number for
    a number, a string for a string, a bool for a bool; any over ``None``).
    Each restored value is named in a warning: it replaces what the strategy
    was built with.
    """
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

    unshaped = set(unshaped)
    updates: list[tuple[Any, str, Any]] = []
    for key, (kind, tensors) in arrays.items():
        inner, attribute = target(key, "array state")
        current = getattr(inner, attribute)
        empty = hasattr(current, "__len__") and len(current) == 0  # e.g. DP's ArrayRecord()
        if current is not None and not empty and to_state(current) is None:  # not other objects
            raise ValueError(f"the checkpoint's array state {key!r} would replace a "
                             f"{type(current).__name__}: not written by this strategy chain")
        problem = None if model is None or key in unshaped else shape_problem(tensors, model)
        if problem is not None:
            raise ValueError(f"the checkpoint's array state {key!r} does not fit its model: {problem}")
        updates.append((inner, attribute, from_state(kind, tensors)))
    restored = []
    for key, value in meta.get("scalars", {}).items():
        inner, attribute = target(key, "the value")
        live = getattr(inner, attribute)
        live_kind, saved_kind = _kind(live), _kind(value)
        if live_kind is None:
            raise ValueError(f"the checkpoint's value for {key!r} would replace a {type(live).__name__}")
        if saved_kind is None:
            raise ValueError(f"the checkpoint's value for {key!r} is not a number, string or bool: "
                             f"{value!r}")
        if saved_kind != live_kind and live_kind != "none":
            raise ValueError(f"the checkpoint's value for {key!r} is a {type(value).__name__} "
                             f"({value!r}), the strategy's a {type(live).__name__} ({live!r}): "
                             "not written by this strategy chain")
        updates.append((inner, attribute, value))
        restored.append(f"{key} = {value!r} (built with {live!r})")
    objects = [(target(key, "the state of"), key, state) for key, state in meta.get("objects", {}).items()]
    for inner, attribute, value in updates:
        setattr(inner, attribute, value)
    if restored:
        log(WARNING, "LIPS: restoring values of the wrapped strategies from the checkpoint: %s",
            "; ".join(restored))
    for (inner, attribute), key, state in objects:
        try:
            getattr(inner, attribute).load_state_dict(state)
        except Exception as err:  # the object's own validation: any error means "cannot resume"
            raise ValueError(f"cannot restore {key!r} from the checkpoint: {err}") from err
