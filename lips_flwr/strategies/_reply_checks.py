"""What makes a client reply or an aggregate unusable, and why (no flwr import).

Both strategy adapters call these checks on the raw wire format, which is the
same in both Flower APIs: each array is serialized with ``np.save`` (the
``data`` of a Message API ``Array``, an entry of legacy
``Parameters.tensors``). :func:`lips_flwr._npy.read_npy` parses the ``.npy`` header and
returns a read-only view of the bytes, so checking a reply copies no array
data: the only full pass is one :func:`numpy.isfinite` over each
floating-point array.

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
from collections.abc import Mapping
from typing import cast

from .._npy import NUMPY_SERIALIZATION, npy_shape, read_npy
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

    Cheap checks come first; the one full pass over the data, the NaN/Inf
    check, runs last and only on floating-point arrays.
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
    bad = nonfinite_arrays(arrays)
    if bad:
        return f"NaN or Inf in arrays {bad[:5]}"
    return None
