"""What makes a client reply or an aggregate unusable, and why (no flwr import).

Both strategy adapters call these checks on the raw wire format, which is the
same in both Flower APIs: each array is serialized with ``np.save`` (the
``data`` of a Message API ``Array``, an entry of legacy
``Parameters.tensors``). :func:`lips_flwr._npy.read_npy` parses the ``.npy`` header and
returns a read-only view of the bytes, so checking a reply copies no array
data: the only full pass is the NaN/Inf test of each floating-point array
(:func:`lips_flwr.core.checks.all_finite`), which the strategies run on the
aggregate, and on the replies only to find a culprit.

A reply is rejected when its arrays do not match the global model (names,
count, shapes), cannot be read, are not real numbers (complex, object, text),
contain NaN or Inf, or when its example count, the weight of a weighted mean,
is missing, not a number, not finite, not positive or absurdly large. Dtype
changes between real numeric types are accepted: Flower's own aggregation
turns integer buffers into float64 (``num_batches_tracked``) and FedAdam returns
float64 for float32 models, so clients legitimately send other dtypes back.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from .._npy import NUMPY_SERIALIZATION, npy_header, npy_shape, read_npy
from ..core.checks import arrays_mismatch, nonfinite_arrays

# Above 2**53 a float64 no longer counts examples exactly; no client has that many.
MAX_NUM_EXAMPLES = 2**53
REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats
MISSING = object()  # a reply without the example count the inner strategy weights by


def model_shapes(tensors: Mapping[str, bytes]) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of a serialized model (the global model), from the headers."""
    return {name: npy_shape(data) for name, data in tensors.items()}


def serialization_problem(formats: Mapping[str, str]) -> str | None:
    """Why arrays in another serialization than numpy's cannot be checked or averaged."""
    other = {n: f for n, f in formats.items() if f != NUMPY_SERIALIZATION}
    if other:
        name, fmt = next(iter(other.items()))
        return f"array {name!r} is serialized as {fmt!r}, expected {NUMPY_SERIALIZATION!r}"
    return None


def num_examples_problem(value: object, key: str = "num-examples") -> str | None:
    """Why an example count cannot weight a mean, or ``None`` if it can.

    It must be a finite real number in ``(0, 2**53]``: a non-positive weight
    is meaningless (and an all-zero round divides by zero in FedAvg), NaN and
    Inf poison the mean.
    """
    if value is MISSING:
        return f"no {key!r} in its metrics"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{key!r} is {value!r}, not a number"
    number = cast(float, value)  # typeshed's numbers.Real has no `>`
    if not math.isfinite(number) or number <= 0 or number > MAX_NUM_EXAMPLES:
        return f"{key!r} is {value!r}: it must be > 0 and <= 2**53"
    return None


def reply_problem(
    expected: Mapping[str, tuple],
    tensors: Mapping[str, bytes],
    num_examples: object = None,
    weight_key: str = "num-examples",
    finite: bool = True,
) -> str | None:
    """Why a client reply must not be aggregated, or ``None`` if it may.

    Parameters
    ----------
    expected : Mapping[str, tuple]
        Shapes of the global model the client was sent (:func:`model_shapes`).
    tensors : Mapping[str, bytes]
        The reply's arrays, ``.npy`` bytes by name.
    num_examples : object, optional
        The reply's example count (:data:`MISSING` when the reply has none);
        ``None`` skips this check (the inner strategy does not weight).
    weight_key : str (default: "num-examples")
        The count's name, for the reason text.
    finite : bool (default: True)
        Also check for NaN/Inf: the one full pass over the data, run last and
        only on floating-point arrays. The strategies pass ``False`` and check
        the aggregate instead (one pass, not one per reply), looking for the
        culprit only when it is not finite.
    """
    arrays = {}
    for name, data in tensors.items():
        try:
            arrays[name] = read_npy(data)
        except ValueError as err:
            return f"array {name!r} is unreadable ({err})"
    reason = arrays_mismatch(expected, {n: a.shape for n, a in arrays.items()})
    if reason is not None:
        return reason
    for name, array in arrays.items():
        if array.dtype.kind not in REAL_KINDS:
            return f"array {name!r} has dtype {array.dtype}, not a real number type"
    if num_examples is not None:
        reason = num_examples_problem(num_examples, weight_key)
        if reason is not None:
            return reason
    bad = nonfinite_arrays(arrays) if finite else []
    if bad:
        return f"NaN or Inf in arrays {bad[:5]}"
    return None


def round_dtypes(
    dtypes: Sequence[Mapping[str, np.dtype]], previous: Mapping[str, np.dtype]
) -> tuple[Mapping[str, np.dtype], bool]:
    """The dtypes a round's replies are aggregated in, and whether any reply must be cast to them.

    ``dtypes`` holds each kept reply's ``name -> dtype``. No reply: the global
    model's (``previous``), nothing to cast. Replies whose headers were all
    known share one map (the checks' fast path): that map, nothing to cast,
    nothing counted. Otherwise :func:`common_dtypes`.
    """
    if not dtypes:
        return previous, False
    if all(found is dtypes[0] for found in dtypes):
        return dtypes[0], False
    return common_dtypes(dtypes, previous), True


def common_dtypes(
    dtypes: Sequence[Mapping[str, np.dtype]], previous: Mapping[str, np.dtype]
) -> dict[str, np.dtype]:
    """Per array, the dtype most replies send; a tie goes to the global model's dtype, else the widest.

    ``dtypes`` holds each reply's ``name -> dtype``. The replies are then
    aggregated in these dtypes whatever their order (Flower accumulates into
    the first reply's dtype).
    """
    # Replies that look like the global model share one dtype map (the fast path of
    # fast_reply_problem): count each distinct map once, with its number of replies.
    distinct: dict[int, list] = {}
    for found in dtypes:
        distinct.setdefault(id(found), [found, 0])[1] += 1
    if len(distinct) == 1:
        return dict(dtypes[0]) if dtypes else {}
    votes: dict[str, Counter] = {}
    for found, count in distinct.values():
        for name, dtype in found.items():
            votes.setdefault(name, Counter())[dtype] += count
    out: dict[str, np.dtype] = {}
    for name, counter in votes.items():
        best = max(counter.values())
        tied = [dtype for dtype, n in counter.items() if n == best]
        here = previous.get(name)
        out[name] = here if here is not None and here in tied else max(
            tied, key=lambda d: (d.kind == "f", d.itemsize))
    return out


def culprit_among(
    models: Sequence[Mapping[str, np.ndarray]], weights: Sequence[object] | None = None
) -> tuple[int, str] | None:
    """The first model with NaN/Inf, else one whose values are large enough to overflow a sum.

    A sum of ``n`` finite terms overflows only when one is above ``max(dtype)
    / n`` or so; a term is a value times its weight where the strategy
    multiplies before it divides (legacy ``aggregate``: ``layer *
    num_examples``). The model with the largest such term is the culprit.
    Below that, no model explains a non-finite aggregate: ``None``.
    """
    largest, peak_of, where = 0.0, 0.0, None
    for i, model in enumerate(models):
        bad = nonfinite_arrays(model)
        if bad:
            return i, f"NaN or Inf in arrays {bad[:5]}"
        weight = weights[i] if weights is not None else 1.0
        scale = max(1.0, float(weight)) if isinstance(weight, (int, float)) else 1.0
        for data in model.values():
            if data.dtype.kind == "f" and data.size:
                peak = float(np.max(np.abs(data)))
                term = peak * scale
                if term >= float(np.finfo(data.dtype).max) / (2 * len(models)) and term > largest:
                    largest, peak_of, where = term, peak, i
    if where is None:
        return None
    return where, f"its values (up to {peak_of:.3g}) overflow the aggregate"


class ModelHeaders:
    """The global model's ``.npy`` headers, to recognise a well-formed reply array without parsing it.

    ``np.save`` writes the same header for the same dtype, shape and order:
    a reply array whose bytes start with the global model's header for that
    name and have its length has the global model's dtype and shape. That is
    a comparison of ~128 bytes per array, no parse, no pass over the data;
    only an array that differs is parsed (:func:`reply_problem`).
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
            if found is None or found[1] != self.shape[name] or found[2].kind not in REAL_KINDS:
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
) -> tuple[str | None, dict[str, np.dtype]]:
    """:func:`reply_problem` without NaN/Inf, fast for arrays like the global model's; and their dtypes.

    Returns ``(reason or None, name -> dtype)``. Only a reply with an array
    whose header differs from the global model's is parsed in full.
    """
    if len(tensors) == len(headers.shape) and headers.all_same(tensors):
        reason = None if num_examples is None else num_examples_problem(num_examples, weight_key)
        return reason, headers.dtype
    reason = reply_problem(headers.shape, tensors, num_examples, weight_key, finite=False)
    if reason is not None:
        return reason, {}
    return None, {name: read_npy(data).dtype for name, data in tensors.items()}
