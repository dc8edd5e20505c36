"""The global model's ``.npy`` headers, read once per model, and the checks they allow (no flwr import).

A reply array whose bytes start with the global model's header for its name
and have its length has the global model's dtype and shape: a comparison of
~128 bytes per array, no parse, no pass over the data (:class:`ModelHeaders`).
:class:`HeaderCache` keeps one model's headers for the round and, from one
round to the next, the headers replies sent where their dtype was not the
global model's (the second fast path).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from ..._npy import npy_header, read_npy
from .checks import num_examples_problem, real_for, reply_problem


class ModelHeaders:
    """The global model's ``.npy`` headers, to recognise a well-formed reply array without parsing it.

    ``np.save`` writes the same header for the same dtype, shape and order:
    a reply array whose bytes start with the global model's header for that
    name and have its length has the global model's dtype and shape. That is
    a comparison of ~128 bytes per array, no parse, no pass over the data;
    only an array that differs is parsed (:func:`.checks.reply_problem`).
    """

    def __init__(self, tensors: Mapping[str, bytes], replied: Mapping[str, bytes] | None = None) -> None:
        self.shape: dict[str, tuple[int, ...]] = {}
        self.dtype: dict[str, np.dtype] = {}
        self.views: dict[str, np.ndarray] = {}  # the global model, read-only views of ``tensors``
        self._head: dict[str, tuple[bytes, int]] = {}
        for name, data in tensors.items():
            array = self.views[name] = read_npy(data)
            self.shape[name], self.dtype[name] = tuple(array.shape), array.dtype
            self._head[name] = (bytes(data[: len(data) - array.nbytes]), len(data))
        self.names = tuple(self.shape)  # the global model's order
        self.name_list = list(self.names)  # (a list compares to a list of names fastest)
        self.sorted_names = tuple(sorted(self.names))  # one shared tuple for the replies' signatures
        self._prefixes = tuple(head for head, _ in self._head.values())
        self._lengths = [length for _, length in self._head.values()]
        # What np.frombuffer needs to view an array with this header (dtype, count, offset,
        # shape), or None for a Fortran-order header, which read_npy reads (its data is transposed).
        self._layout = [(self.dtype[n], self.views[n].size, len(self._head[n][0]), self.shape[n])
                        if self.views[n].flags.c_contiguous else None for n in self.names]
        self._replied(replied or {})

    def _replied(self, replied: Mapping[str, bytes]) -> None:
        """The headers replies sent where they differ from the global model's (:meth:`dtypes_in_order`).

        Flower's FedAvg averages integer buffers (``num_batches_tracked``)
        into float64, and clients send them back as integers: without these,
        every reply of every round after the first would miss the fast path.
        ``replied`` maps names to ``.npy`` headers (:func:`lips_flwr._npy.npy_header`'s
        first item); one that does not describe a real-number array of the
        global model's shape for its name is ignored.
        """
        prefixes, lengths, dtype = list(self._prefixes), list(self._lengths), dict(self.dtype)
        for i, name in enumerate(self.names):
            found = npy_header(replied[name]) if name in replied else None
            if found is None or found[1] != self.shape[name] or not real_for(found[2], self.dtype[name]):
                continue
            prefixes[i], lengths[i], dtype[name] = found[0], found[3], found[2]
        changed = dtype != self.dtype or prefixes != list(self._prefixes)
        # The replies' dtypes: the global model's own map when nothing differs (one shared object).
        self.replied_dtype: dict[str, np.dtype] = dtype if changed else self.dtype
        self._replied_prefixes = tuple(prefixes) if changed else self._prefixes
        self._replied_lengths = lengths if changed else self._lengths

    def all_same(self, tensors: Mapping[str, object]) -> bool:
        """Whether every array is an ``.npy`` of the global model's dtype and shape for its name.

        This runs for every array of every reply: arrays in the global model's
        order (the usual case) are compared by :meth:`all_same_in_order`, in C
        loops; others one by one, by name.
        """
        if tuple(tensors) == self.names:
            return self.all_same_in_order(list(tensors.values()))
        heads = self._head
        for name, data in tensors.items():
            head = heads.get(name)
            if (head is None or type(data) is not bytes or len(data) != head[1]
                    or not data.startswith(head[0])):
                return False
        return True

    def all_same_in_order(self, datas: Sequence[object]) -> bool:
        """:meth:`all_same` for the arrays of the global model's names, listed in its order.

        The same test (``bytes`` of the global model's length that start with
        its header) as ``map`` and ``all`` over the whole list: no Python
        bytecode runs per array.
        """
        return (len(datas) == len(self._lengths)
                and set(map(type, datas)) <= _BYTES
                and list(map(len, datas)) == self._lengths  # type: ignore[arg-type]
                and all(map(bytes.startswith, datas, self._prefixes)))  # type: ignore[arg-type]

    def dtypes_in_order(self, datas: Sequence[object]) -> Mapping[str, np.dtype] | None:
        """The dtypes of serialized arrays listed in the global model's order, from their headers.

        ``replied_dtype`` when every array starts with the header the replies
        sent last round (``replied``), else ``dtype`` when every array is like
        the global model's (:meth:`all_same_in_order`), else ``None`` (then the
        arrays are checked one by one). Last round's headers are tried first:
        once FedAvg has made the global model's integer buffers float64, every
        reply has them, and a good round costs one pass per reply.
        """
        if len(datas) != len(self._lengths) or not set(map(type, datas)) <= _BYTES:
            return None
        lengths = list(map(len, datas))  # type: ignore[arg-type]
        if (self.replied_dtype is not self.dtype and lengths == self._replied_lengths
                and all(map(bytes.startswith, datas, self._replied_prefixes))):  # type: ignore[arg-type]
            return self.replied_dtype
        if lengths == self._lengths and all(map(bytes.startswith, datas, self._prefixes)):  # type: ignore[arg-type]
            return self.dtype
        return None

    def read_in_order(self, datas: Sequence[bytes]) -> list[np.ndarray]:
        """Read-only views of serialized arrays listed in the global model's order.

        An array with the global model's header for its place is viewed with
        the global model's layout, its header not parsed again; any other
        (and any in Fortran order) is parsed (:func:`lips_flwr._npy.read_npy`,
        ``ValueError`` if it cannot be read). A fresh aggregate (FedAvg's) has
        the global model's headers but for integer buffers, which Flower
        averages into float64.
        """
        if len(datas) != len(self._layout):
            raise ValueError(f"{len(datas)} arrays, expected {len(self._layout)}")
        views = []
        for data, prefix, length, layout in zip(datas, self._prefixes, self._lengths, self._layout):
            if layout is not None and type(data) is bytes and len(data) == length and data.startswith(prefix):
                dtype, count, offset, shape = layout
                views.append(np.frombuffer(data, dtype, count, offset).reshape(shape))
            else:
                views.append(read_npy(data))
        return views


_BYTES = {bytes}


def fast_reply_problem(
    headers: ModelHeaders,
    tensors: Mapping[str, bytes],
    num_examples: object = None,
    weight_key: str = "num-examples",
) -> tuple[str | None, Mapping[str, np.dtype]]:
    """:func:`.checks.reply_problem` without NaN/Inf, fast for arrays like the global model's; their dtypes.

    Returns ``(reason or None, name -> dtype)``. Only a reply with an array
    whose header differs from the global model's is parsed in full.
    """
    if len(tensors) == len(headers.shape) and headers.all_same(tensors):
        reason = None if num_examples is None else num_examples_problem(num_examples, weight_key)
        return reason, headers.dtype
    reason = reply_problem(headers.shape, tensors, num_examples, weight_key, finite=False)
    if reason is not None:
        return reason, {}
    dtypes = {name: read_npy(data).dtype for name, data in tensors.items()}
    for name, dtype in dtypes.items():
        if not real_for(dtype, headers.dtype[name]):
            return (f"array {name!r} has dtype {dtype}, not a real number type for the model's "
                    f"{headers.dtype[name]}"), {}
    return None, dtypes


class HeaderCache:
    """The headers of the round's global model, read once per model, and those replies sent last round.

    The global model is the caller's object and may change: its headers are
    read again when it holds other names or other serialized arrays than
    when they were read.
    """

    def __init__(self) -> None:
        self._read: tuple[object, ModelHeaders, list] | None = None  # (model, its headers, its arrays then)
        # name -> .npy header the replies sent last round where their dtype was not the global
        # model's (ModelHeaders' `replied`: the fast path of the next round's checks).
        self.replied: Mapping[str, bytes] = MappingProxyType({})

    def forget(self) -> None:
        """A new global model: its headers are read when replies come."""
        self._read = None

    def of(self, model: object, names: list[str], datas: list) -> ModelHeaders:
        """The headers of ``model`` (its ``names`` and serialized arrays ``datas``), read once."""
        headers = self.cached(model, names, datas)
        if headers is None:
            headers = ModelHeaders(dict(zip(names, datas)), self.replied)
            self._read = (model, headers, datas)
        return headers

    def cached(self, model: object, names: list[str], datas: list) -> ModelHeaders | None:
        """:meth:`of` if it was read from ``model`` as it is now, else ``None``."""
        read = self._read
        if read is None or read[0] is not model:
            return None
        same = (read[1].names == tuple(names) and len(datas) == len(read[2])
                and all(map(operator.is_, datas, read[2])))
        return read[1] if same else None

    def remember(self, headers: ModelHeaders, chosen: Mapping[str, np.dtype],
                 kept: Mapping[str, bytes] | None) -> None:
        """Keep, for the next round's checks, the headers of the arrays replies sent in another dtype
        than the global model's (``chosen``: the dtypes aggregated; ``kept``: one kept reply's
        ``name -> .npy bytes``, already in those dtypes)."""
        if chosen is headers.replied_dtype:  # the headers already known (none, or last round's)
            return
        replied = {}
        for name, dtype in chosen.items():
            data = None if kept is None else kept.get(name)
            found = None if data is None or dtype == headers.dtype.get(name) else npy_header(data)
            if found is not None and found[2] == dtype:
                replied[name] = found[0]
        self.replied = MappingProxyType(replied)


__all__ = ["HeaderCache", "ModelHeaders", "fast_reply_problem"]
