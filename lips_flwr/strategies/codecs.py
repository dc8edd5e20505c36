"""One codec per Flower API: what a model is in the API's types, and its arrays as ``name -> ndarray``.

Every place the server side turns a Flower value into arrays or back goes
through its strategy's codec: the global model and the aggregate (the reply
gate, the core), the wrapped strategies' cached models (the cache sync) and
their model-shaped state (the checkpoint, the non-finite check).

One naming rule: a value with names of its own (an ``ArrayRecord``, a dict)
keeps them; a sequence (legacy ``Parameters``, a list of arrays such as
legacy FedAdam's moments) is named as the global model is, by the legacy
strategy's ``param_names`` when it has their count, else by position
(``"0"``, ``"1"``, ...). :meth:`ModelCodec.to_arrays` gives ``(kind, arrays)``,
the kind (``"arrayrecord"``, ``"parameters"``, ``"dict"``, ``"list"``) being
what :meth:`ModelCodec.from_arrays` rebuilds.

Views, not copies, on the way out: every reader only reads (the checkpoint
writes them to disk, the checks and the core compute from them, the cache
sync makes new arrays where it zeroes), and a view of serialized bytes is
read-only, so a writer would fail loudly instead of changing the value.
Copies on the way in, where a strategy is handed arrays it did not make
(a checkpoint's): it may update its state in place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord
from flwr.common import Parameters, ndarrays_to_parameters

from .._npy import npy_bytes, read_npy
from .._records import numpy_to_record, record_views

Arrays = dict[str, np.ndarray]
NAMES_HINT = "pass the names in the order the clients send them (e.g. list(net.state_dict().keys()))"


def _is_array(value: Any) -> bool:
    # FedOpt's 0-d entries (num_batches_tracked) come out as numpy scalars.
    return isinstance(value, (np.ndarray, np.generic))


class ModelCodec(ABC):
    """One API's models as arrays and back (:meth:`to_arrays`, :meth:`from_arrays`), and the global
    model's names and ``.npy`` bytes for the reply gate (:meth:`serialized`, :meth:`views`)."""

    model_kind: ClassVar[str]  # the kind of the API's models (a global model, an aggregate)

    def names(self, count: int) -> list[str]:
        """The names of a sequence of ``count`` arrays: positions (the legacy codec knows better)."""
        return [str(i) for i in range(count)]

    def to_arrays(self, value: Any) -> tuple[str, Arrays] | None:
        """``(kind, name -> ndarray)`` of a model-shaped value (read-only views, or the value's own
        arrays); ``None`` when it is not one (nothing, an empty one, a number, an object)."""
        if isinstance(value, dict) and value and all(
                isinstance(k, str) and _is_array(v) for k, v in value.items()):
            return "dict", {k: np.asarray(v) for k, v in value.items()}
        if isinstance(value, list) and value and all(map(_is_array, value)):
            return "list", dict(zip(self.names(len(value)), map(np.asarray, value)))
        return None

    def from_arrays(self, kind: str, arrays: Mapping[str, np.ndarray], like: Any = None,
                    changed: Collection[str] = ()) -> Any:
        """A value of ``kind`` holding ``arrays``, in their order.

        Without ``like`` it is new, its arrays copied (a checkpoint's, handed to
        a strategy that may update them in place). With ``like``, a value of
        that kind whose arrays are ``arrays``' (:meth:`to_arrays` of it, some
        replaced), only the arrays named in ``changed`` are new: the others are
        ``like``'s own, not serialized again.
        """
        if kind == "dict":
            return {k: v if like is not None else np.array(v) for k, v in arrays.items()}
        if kind == "list":
            return [v if like is not None else np.array(v) for v in arrays.values()]
        raise ValueError(f"unknown kind of strategy state {kind!r} in the checkpoint")

    @abstractmethod
    def serialized(self, model: Any) -> tuple[list[str], list[Any]]:
        """The names and the ``.npy`` bytes of a global model's (or an aggregate's) arrays, in its order."""

    @abstractmethod
    def views(self, model: Any) -> Arrays:
        """Read-only views of a global model's (or an aggregate's) arrays, in its order."""

    def in_order(self, aggregate: Any, order: Collection[str]) -> Arrays:
        """Read-only views of an aggregate, in the global model's order (``order``) when it has its names."""
        return self.views(aggregate)


class MessageCodec(ModelCodec):
    """The Message API's ``ArrayRecord`` (and the plain numpy state of its strategies)."""

    model_kind = "arrayrecord"

    def to_arrays(self, value: Any) -> tuple[str, Arrays] | None:
        if isinstance(value, ArrayRecord):
            return ("arrayrecord", record_views(value)) if len(value) else None
        return super().to_arrays(value)

    def from_arrays(self, kind: str, arrays: Mapping[str, np.ndarray], like: Any = None,
                    changed: Collection[str] = ()) -> Any:
        if kind != "arrayrecord":
            return super().from_arrays(kind, arrays, like, changed)
        return numpy_to_record(arrays, template=like, changed=changed, order=list(arrays))

    def serialized(self, model: ArrayRecord) -> tuple[list[str], list[Any]]:
        return list(model), [array.data for array in model.values()]

    def views(self, model: ArrayRecord) -> Arrays:
        return record_views(model)

    def in_order(self, aggregate: ArrayRecord, order: Collection[str]) -> Arrays:
        # The aggregate's order follows whichever client replied first.
        unordered = record_views(aggregate)
        names = list(order) if set(order) == set(unordered) else list(unordered)
        return {name: unordered[name] for name in names}


class LegacyCodec(ModelCodec):
    """The legacy API's ``Parameters`` (an unnamed list of ``.npy`` bytes), named by ``param_names``."""

    model_kind = "parameters"

    def __init__(self, param_names: list[str] | None) -> None:
        self.param_names = param_names

    def names(self, count: int) -> list[str]:
        if self.param_names is not None and len(self.param_names) == count:
            return self.param_names
        return super().names(count)

    def model_names(self, count: int) -> list[str]:
        """:meth:`names` of the global model: ``ValueError`` when ``param_names`` has another count."""
        if self.param_names is not None and len(self.param_names) != count:
            raise ValueError(f"`param_names` has {len(self.param_names)} names but the model has "
                             f"{count} arrays; {NAMES_HINT}")
        return self.names(count)

    def to_arrays(self, value: Any) -> tuple[str, Arrays] | None:
        if isinstance(value, Parameters):
            if not value.tensors:
                return None
            return "parameters", dict(zip(self.names(len(value.tensors)), map(read_npy, value.tensors)))
        return super().to_arrays(value)

    def from_arrays(self, kind: str, arrays: Mapping[str, np.ndarray], like: Any = None,
                    changed: Collection[str] = ()) -> Any:
        if kind != "parameters":
            return super().from_arrays(kind, arrays, like, changed)
        if like is None:
            return ndarrays_to_parameters(list(arrays.values()))
        index = {name: i for i, name in enumerate(self.names(len(like.tensors)))}
        tensors = like.tensors  # npy_bytes writes np.save's bytes, as ndarrays_to_parameters does:
        return Parameters(tensors=[npy_bytes(np.asarray(array)) if name in changed else tensors[index[name]]
                                   for name, array in arrays.items()], tensor_type=like.tensor_type)

    def serialized(self, model: Parameters) -> tuple[list[str], list[Any]]:
        return self.model_names(len(model.tensors)), list(model.tensors)

    def views(self, model: Parameters) -> Arrays:
        return dict(zip(self.model_names(len(model.tensors)), map(read_npy, model.tensors)))


__all__ = ["NAMES_HINT", "Arrays", "LegacyCodec", "MessageCodec", "ModelCodec"]
