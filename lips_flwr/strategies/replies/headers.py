"""The global model's ``.npy`` headers, read once per model, and the fast checks they allow (no flwr import).

``np.save`` writes the same header for the same dtype, shape and order: a
reply array whose bytes start with the global model's header for its name and
have its length has the global model's dtype and shape. That is a comparison
of ~128 bytes per array, no parse, no pass over the data; only an array that
differs is parsed (:func:`.checks.reply_problem`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from ..._npy import npy_header, read_npy
from .checks import real_for, reply_problem


class ModelHeaders:
    """The global model's ``.npy`` headers (``tensors``: its ``.npy`` bytes by name), and those
    ``replied`` last round where replies sent another dtype (:meth:`_replied`)."""

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
        """Take ``replied`` (name -> ``.npy`` header) for :meth:`dtypes_in_order`'s first path.

        Flower's FedAvg averages integer buffers into float64 and clients send
        them back as integers: without these, every reply after the first round
        would miss the fast path. A header that is not a real-number array of
        the global model's shape for its name is ignored.
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
        """Whether every array is an ``.npy`` of the global model's dtype and shape for its name
        (arrays in the global model's order through :meth:`all_same_in_order`, others by name)."""
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
        """:meth:`all_same` for arrays listed in the global model's order, in C loops (``map``, ``all``):
        no Python bytecode runs per array."""
        return (len(datas) == len(self._lengths)
                and set(map(type, datas)) <= _BYTES
                and list(map(len, datas)) == self._lengths  # type: ignore[arg-type]
                and all(map(bytes.startswith, datas, self._prefixes)))  # type: ignore[arg-type]

    def dtypes_in_order(self, datas: Sequence[object]) -> Mapping[str, np.dtype] | None:
        """The dtypes of serialized arrays listed in the global model's order, from their headers.

        ``replied_dtype`` when every array has the header replies sent last
        round, else ``dtype`` when every array is like the global model's, else
        ``None`` (then they are checked one by one). Last round's go first: once
        FedAvg made the buffers float64, every reply has them.
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
        its layout, the header not parsed again; any other (or in Fortran
        order) is parsed (``ValueError`` if it cannot be read).
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


def fast_reply_problem(headers: ModelHeaders,
                       tensors: Mapping[str, bytes]) -> tuple[str | None, Mapping[str, np.dtype]]:
    """``(reason or None, name -> dtype)``: :func:`.checks.reply_problem` without NaN/Inf, and
    the arrays' dtypes; only a reply with an array unlike the global model's is parsed."""
    if len(tensors) == len(headers.shape) and headers.all_same(tensors):
        return None, headers.dtype
    reason = reply_problem(headers.shape, tensors, finite=False)
    if reason is not None:
        return reason, {}
    dtypes = {name: read_npy(data).dtype for name, data in tensors.items()}
    for name, dtype in dtypes.items():
        if not real_for(dtype, headers.dtype[name]):
            return (f"array {name!r} has dtype {dtype}, not a real number type for the model's "
                    f"{headers.dtype[name]}"), {}
    return None, dtypes


class HeaderCache:
    """The headers of the round's global model, read once per model (again when it holds other
    names or serialized arrays: it is the caller's object), and those replies sent last round."""

    def __init__(self) -> None:
        self._read: tuple[object, ModelHeaders, list] | None = None  # (model, its headers, its arrays then)
        # name -> .npy header replies sent last round in another dtype (ModelHeaders' `replied`).
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
