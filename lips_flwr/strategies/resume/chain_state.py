"""What a checkpoint holds of the wrapped strategies: a declared contract, and its restore.

Each strategy of the chain (``LIPS(DP(FedAvgM(...)))``) declares the state it
keeps between rounds (:func:`..chain.declared_state`): Flower's own by the
table of :mod:`..flower_state`, any class by ``lips_state = ("attr", ...)``
and ``lips_state_exclude = ("attr", ...)``, read along its bases. A declared
attribute is saved as model-shaped arrays (an ArrayRecord, Parameters, a dict
or list of ndarrays), a number, string, bool or ``None``, or an object's JSON
``state_dict()`` (restored with ``load_state_dict``). Nothing else is saved:
what the chain holds beyond its declared state that a checkpoint could save
is named in a warning at the first save that finds it, and a resumed run
starts it as built.

On resume the chain's classes must be the same (``ValueError`` otherwise);
its scalar settings may differ, with a warning naming each difference. Only
declared state is restored: a checkpoint holding anything else (one written
before the declared contract saved every value that changed) is refused with a
:class:`~lips_flwr.errors.ResultFileError` naming the keys, unless the strategy
was built with ``skip_undeclared_state=True``: then they are skipped, named in
a warning, and start as built.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import log

from ...errors import ResultFileError
from ..chain import declared_state, strategy_chain

# A codec's to_arrays and from_arrays (lips_flwr.strategies.codecs): the wing knows no codec.
ToState = Callable[[Any], "tuple[str, dict[str, np.ndarray]] | None"]  # None: not model-shaped
FromState = Callable[[str, Mapping[str, np.ndarray]], Any]


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


def _as_state(value: Any, to_state: ToState) -> tuple[str | None, Any]:
    """``(part, saved)``: ``value`` as checkpoint state in ``part`` (arrays, scalars, objects), or nothing."""
    found = to_state(value)
    if found is not None:
        return "arrays", found
    scalar = _scalar(value)
    if scalar is not _NOT_SCALAR:
        return "scalars", scalar
    state = _object_state(value)
    return ("objects", state) if state is not None else (None, None)


def undeclared_state(owner: Any, to_state: ToState, baseline: Mapping[str, Any]) -> list[str]:
    """Keys of what the chain holds beyond its declared state, and does not declare left out, that
    a checkpoint could save: model-shaped values, objects with a JSON ``state_dict()``, and numbers
    and strings that differ from ``baseline`` (:func:`scalar_settings` when the run began)."""
    declared = {id(inner): declared_state(inner) for inner in strategy_chain(owner)}
    found = []
    for key, (inner, attribute) in _attributes(owner).items():
        state, left_out = declared[id(inner)]
        if attribute in state or attribute in left_out:
            continue
        part, saved = _as_state(getattr(inner, attribute), to_state)
        if part is not None and (part != "scalars" or baseline.get(key, _NOT_SCALAR) != saved):
            found.append(key)
    return found


class ChainRecord:
    """A run's record of its chain: the settings it began with, and what its checkpoints leave out."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}  # :func:`scalar_settings` when the run began
        self._baseline: dict[str, Any] | None = None  # the same, to tell changed undeclared values
        self._named: set[str] = set()  # the keys the log has named as left out

    def begin(self, owner: Any) -> None:
        """A run begins: its chain's settings, before any round."""
        self.settings = scalar_settings(owner)
        self._baseline, self._named = dict(self.settings), set()

    def observe(self, owner: Any) -> None:
        """Take the baseline now if :meth:`begin` did not (the first save comes before round 1)."""
        if self._baseline is None:
            self._baseline = scalar_settings(owner)

    def capture(self, owner: Any, to_state: ToState, path: Any) -> tuple[dict, dict]:
        """``(arrays, meta)``: the chain's declared state. What checkpoint ``path`` leaves out is named
        once per key: declared attributes missing or holding nothing it saves, and undeclared state."""
        parts: dict[str, dict] = {"arrays": {}, "scalars": {}, "objects": {}}
        unsaved = []
        for depth, inner in enumerate(strategy_chain(owner)):
            for attribute in declared_state(inner)[0]:
                key = f"{depth}.{type(inner).__name__}.{attribute}"
                part, saved = _as_state(getattr(inner, attribute, _NOT_SCALAR), to_state)
                if part is None:
                    unsaved.append(key)
                else:
                    parts[part][key] = saved
        found = undeclared_state(owner, to_state, self._baseline or {})
        undeclared = [key for key in found if key not in self._named]
        unsaved = [key for key in unsaved if key not in self._named]
        if undeclared:
            log(WARNING, "LIPS: the checkpoint %s leaves out %s: the wrapped strategies hold them but do "
                "not declare them as their state, so a resumed run starts them as built. A strategy "
                "declares its state in its class attribute lips_state = (...), and what to leave out "
                "in lips_state_exclude", path, ", ".join(undeclared))
        if unsaved:
            log(WARNING, "LIPS: the checkpoint %s cannot save the declared state %s: missing, or not "
                "arrays, a number, string, bool, None or an object with a JSON state_dict()",
                path, ", ".join(unsaved))
        self._named.update(undeclared, unsaved)
        return parts["arrays"], {"chain": chain_classes(owner), "settings": dict(self.settings),
                                 "scalars": parts["scalars"], "objects": parts["objects"]}


def shape_problem(tensors: Mapping[str, np.ndarray], model: Mapping[str, np.ndarray]) -> str | None:
    """Why model-shaped state ``tensors`` does not fit ``model``, or ``None``: its arrays must be
    the model's, keyed by its names or by position (a list, legacy ``Parameters`` without
    ``param_names``), in its order, each of its shape (any dtype)."""
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
    unshaped: Iterable[str] = (), skip_undeclared: bool = False,
) -> None:
    """Put captured state back into a chain of the same classes; ``ValueError`` otherwise.

    Only state the live chain declares is restored, and that is settled
    first (:func:`_declared_only`): the rest is refused, or with
    ``skip_undeclared`` dropped, before any other check. Everything is checked
    before anything is set: array state goes to an attribute that holds no
    other object and, unless saved ``unshaped``, fits ``model`` (the
    checkpoint's); a value to an attribute holding one of its kind (any over
    ``None``); an object's state is loaded into a copy of it first
    (:func:`_copy`). Each restored value that differs from what the strategy
    was built with is named in a warning.
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
    arrays, meta = _declared_only(arrays, meta, here, skip_undeclared)

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
        if _scalar(live) != value or type(_scalar(live)) is not type(value):
            restored.append(f"{key} = {value!r} (built with {live!r})")
    objects = [(getattr(*target(key, "the state of")), key, state)
               for key, state in meta.get("objects", {}).items()]
    # An object checks its state in its own load_state_dict: each loads it into a copy first, nothing
    # set yet; one that cannot be copied loads it itself, after those checks and before any setattr.
    tried = [(obj, key, state, _copy(obj)) for obj, key, state in objects]
    for obj, key, state, trial in sorted(tried, key=lambda found: found[3] is None):
        _load(obj if trial is None else trial, key, state)
    for inner, attribute, value in updates:
        setattr(inner, attribute, value)
    for obj, key, state, trial in tried:
        if trial is not None:
            _load(obj, key, state)
    if restored:
        log(WARNING, "LIPS: restoring values of the wrapped strategies from the checkpoint: %s",
            "; ".join(restored))


def _declared_only(
    arrays: Mapping[str, tuple[str, Mapping]], meta: Mapping, here: Mapping[str, tuple[Any, str]],
    skip_undeclared: bool,
) -> tuple[Mapping[str, tuple[str, Mapping]], Mapping]:
    """``arrays`` and ``meta`` holding only state the live chain declares. The rest is a
    :class:`ResultFileError` naming its keys and the ``lips_state`` fix or, with ``skip_undeclared``,
    dropped behind a WARNING, unchecked: it starts as built. Keys the chain lacks are kept (refused later)."""
    saved = (*arrays, *meta.get("scalars", {}), *meta.get("objects", {}))
    undeclared = [key for key in saved if key in here and here[key][1] not in declared_state(here[key][0])[0]]
    if not undeclared:
        return arrays, meta
    if not skip_undeclared:
        raise ResultFileError(_undeclared_message(undeclared, here))
    log(WARNING, "LIPS: skipping %s of the checkpoint (skip_undeclared_state=True): the wrapped "
        "strategies do not declare them as their state; they start as built", ", ".join(undeclared))

    def declared(part: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in part.items() if key not in undeclared}
    return declared(arrays), {**meta, "scalars": declared(meta.get("scalars", {})),
                              "objects": declared(meta.get("objects", {}))}


def _undeclared_message(keys: list[str], here: Mapping[str, tuple[Any, str]]) -> str:
    """Why a checkpoint with state the live chain does not declare is refused, and the two fixes."""
    owners = sorted({f"{type(here[key][0]).__name__}.lips_state" for key in keys})
    return (f"the checkpoint holds {', '.join(keys)}, which the wrapped strategies do not declare as "
            "their state (checkpoints written before the declared state saved every value that changed): "
            f"declare what a resumed run must continue with in {', '.join(owners)} = (\"attr\", ...), or "
            "resume without it with skip_undeclared_state=True (those attributes then start as built)")


def _copy(obj: Any) -> Any:
    """A deep copy of ``obj`` to try a state on, or ``None`` when it cannot be copied."""
    try:
        return copy.deepcopy(obj)
    except Exception:  # a lock, a file, a C object: it is tried on itself
        return None


def _load(obj: Any, key: str, state: Any) -> None:
    """``obj.load_state_dict(state)``; ``ValueError`` naming ``key`` when it fails."""
    try:
        obj.load_state_dict(state)
    except Exception as err:  # the object's own validation: any error means "cannot resume"
        raise ValueError(f"cannot restore {key!r} from the checkpoint: {err}") from err
