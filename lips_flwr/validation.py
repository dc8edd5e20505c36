"""What makes a client reply or an aggregate unusable, and why (no flwr import).

Both strategy adapters call these checks on the raw wire format, which is the
same in both Flower APIs: each array is serialized with ``np.save`` (the
``data`` of a Message API ``Array``, an entry of legacy
``Parameters.tensors``). :func:`read_npy` parses the ``.npy`` header and
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

import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from io import BytesIO

import numpy as np

# Above 2**53 a float64 no longer counts examples exactly; no client has that many.
MAX_NUM_EXAMPLES = 2**53
NUMPY_SERIALIZATION = "numpy.ndarray"
REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats
MISSING = object()  # a reply without the example count the inner strategy weights by


_NPY_V1, _NPY_V2 = b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00"
_MAX_CACHED_HEADER = 4096  # np.save writes 64-byte aligned headers of ~128 bytes


def _header_prefix(data: bytes) -> bytes | None:
    """The magic string and header of a 1.0/2.0 ``.npy`` (a cache key), or ``None``."""
    if not isinstance(data, bytes):
        return None
    if data[:8] == _NPY_V1:
        end = 10 + int.from_bytes(data[8:10], "little")
    elif data[:8] == _NPY_V2:
        end = 12 + int.from_bytes(data[8:12], "little")
    else:
        return None
    return data[:end] if end <= _MAX_CACHED_HEADER and len(data) >= end else None


@functools.lru_cache(maxsize=1024)
def _parse_header(prefix: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` of a header, parsed once.

    Every client sends the same few headers, and numpy parses each as a Python
    literal (~20 us): for 100 replies of a 60-array model that was ~0.1 s per
    round. Only headers that parse are cached (an exception is not).
    """
    stream = BytesIO(prefix)
    version = np.lib.format.read_magic(stream)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(stream)
    return tuple(shape), bool(fortran), dtype, stream.tell()


def read_npy(data: bytes) -> np.ndarray:
    """A read-only, zero-copy view of an array serialized with ``np.save``.

    Raises ``ValueError`` when the bytes are not a readable ``.npy`` array
    (bad magic or header, object dtype, fewer bytes than the header promises).
    """
    prefix = _header_prefix(data)
    try:
        if prefix is not None:  # the usual case, parsed once per distinct header
            shape, fortran, dtype, offset = _parse_header(prefix)
        else:
            stream = BytesIO(data)
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
            else:  # 3.0 (utf-8 field names) is rare: let numpy read it, with a copy
                return np.load(BytesIO(data), allow_pickle=False)
            offset = stream.tell()
    except (ValueError, EOFError, SyntaxError) as err:
        raise ValueError(f"not a .npy array: {err}") from err
    if dtype.hasobject:
        raise ValueError(f"object arrays are not allowed (dtype {dtype})")
    count = math.prod(shape)
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape[::-1]).T if fortran else flat.reshape(shape)


def npy_shape(data: bytes) -> tuple[int, ...]:
    """Shape of a serialized ``.npy`` array (reads the header only)."""
    return tuple(read_npy(data).shape)


def model_shapes(tensors: Mapping[str, bytes]) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of a serialized model (the global model), from the headers."""
    return {name: npy_shape(data) for name, data in tensors.items()}


def arrays_mismatch(expected: Mapping[str, tuple], received: Mapping[str, tuple]) -> str | None:
    """Why a reply's arrays do not fit the global model, or ``None`` if they do.

    Both arguments map names to shapes. Names and shapes must match; order is
    not checked (Flower's aggregation matches by name).
    """
    missing = [n for n in expected if n not in received]
    extra = [n for n in received if n not in expected]
    if missing or extra:
        parts = [f"missing arrays {missing[:5]}"] if missing else []
        parts += [f"unexpected arrays {extra[:5]}"] if extra else []
        return "; ".join(parts)
    for name, shape in expected.items():
        if tuple(received[name]) != tuple(shape):
            return f"array {name!r} has shape {tuple(received[name])}, expected {tuple(shape)}"
    return None


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
    if not math.isfinite(value) or value <= 0 or value > MAX_NUM_EXAMPLES:
        return f"{key!r} is {value!r}: it must be > 0 and <= 2**53"
    return None


def names_problem(arrays: Mapping[str, np.ndarray]) -> str | None:
    """Why these names cannot label these arrays, or ``None`` if they may.

    Only what is certain is checked: PyTorch's batch-norm buffers
    ``running_mean``/``running_var`` have rank 1 and ``num_batches_tracked``
    rank 0, and LIPS relies on these names to leave batch norm alone. Names
    given in the wrong order (legacy ``param_names``) usually break this.
    """
    for name, array in arrays.items():
        rank = 0 if name.endswith("num_batches_tracked") else 1
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")) and array.ndim != rank:
            return f"{name!r} names an array of shape {tuple(array.shape)} (expected rank {rank})"
    return None


def nonfinite_arrays(arrays: Mapping[str, np.ndarray], names: Iterable[str] | None = None) -> list[str]:
    """Names of the floating-point arrays (among ``names``) holding NaN or Inf."""
    names = arrays if names is None else names
    return [
        name for name in names
        if arrays[name].dtype.kind == "f" and not np.isfinite(arrays[name]).all()
    ]


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


__all__ = [
    "MAX_NUM_EXAMPLES",
    "MISSING",
    "arrays_mismatch",
    "model_shapes",
    "names_problem",
    "nonfinite_arrays",
    "npy_shape",
    "num_examples_problem",
    "read_npy",
    "reply_problem",
    "serialization_problem",
]
