"""Conversions between Flower records and ``name -> ndarray`` dicts (adapters only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

from ._npy import NUMPY_SERIALIZATION, is_npy_bytes, npy_bytes, read_npy

_DTYPE_NAMES: dict[np.dtype, str] = {}  # a builtin dtype -> str(dtype): 3 us in numpy 2 (Python code)


def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, remembered for numpy's builtin dtypes (the few a model has)."""
    if dtype.isbuiltin != 1:
        return str(dtype)
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def array_of(ndarray: np.ndarray) -> Array:
    """``Array(ndarray)`` as Flower builds it (the same fields and bytes), serialized faster.

    Flower's ``Array(ndarray)`` runs ``np.save`` into a buffer and then its
    own argument parsing; this passes the fields to Flower's keyword
    constructor, the bytes from :func:`lips_flwr._npy.npy_bytes` (the
    header made once per dtype and shape). A non-C-contiguous array is
    serialized in C order, as ``Array(np.asarray(ndarray, order="C"))``.
    """
    ndarray = np.asarray(ndarray, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    # (An object array is refused by np.save without pickle, as in Flower: a ValueError.)
    return Array(dtype=_dtype_name(ndarray.dtype), shape=tuple(ndarray.shape), stype=NUMPY_SERIALIZATION,
                 data=npy_bytes(ndarray))


def as_npy_array(array: Array) -> Array:
    """``array_of(array_view(array))``: ``array`` itself when it is already that (the same bytes,
    dtype and shape: :func:`lips_flwr._npy.is_npy_bytes`), else that copy of its values (from Fortran
    order or another header, without bytes past the array's end). To keep a record's Array."""
    if array.stype != NUMPY_SERIALIZATION:
        return array_of(array_view(array))
    view = read_npy(array.data)
    same_fields = array.dtype == _dtype_name(view.dtype) and tuple(array.shape) == view.shape
    return array if same_fields and is_npy_bytes(array.data, view) else array_of(view)


def array_view(array: Array) -> np.ndarray:
    """One Array as a read-only view of its bytes (``Array.numpy()`` without the copy).

    The ``.npy`` header is parsed once per distinct header
    (:func:`lips_flwr._npy.read_npy`); ``Array.numpy()`` parses each one as a
    Python literal, which is most of a small model's conversion time. Other
    serializations go through ``Array.numpy()`` (which refuses them).
    """
    return read_npy(array.data) if array.stype == NUMPY_SERIALIZATION else array.numpy()


def record_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``name -> ndarray`` writable copy of an ArrayRecord, in its order (as ``Array.numpy()`` gives)."""
    return {name: np.array(array_view(array)) for name, array in record.items()}


def record_views(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``name -> ndarray`` of an ArrayRecord, in its order, as read-only views.

    No copy, no header parsed twice (:func:`array_view`): for arrays that
    are only read (updates, scores, norms) or serialized again. Use
    :func:`record_to_numpy` for arrays that will be written or handed on.
    """
    return {name: array_view(array) for name, array in record.items()}


def numpy_to_record(
    arrays: Mapping[str, np.ndarray],
    template: ArrayRecord | None = None,
    changed: Iterable[str] | None = None,
    order: Iterable[str] | None = None,
) -> ArrayRecord:
    """An ArrayRecord of ``arrays``.

    With a ``template``, the record has the template's names (in ``order``
    when given, else the template's) and reuses its Arrays except for the
    names in ``changed`` (saves re-serializing tensors that did not change):
    the same objects (:func:`record_of`).
    """
    if template is None:
        return record_of({n: array_of(a) for n, a in arrays.items()})
    changed = set(arrays if changed is None else changed)
    return record_of(
        {
            name: array_of(arrays[name]) if name in changed else template[name]
            for name in (template if order is None else order)
        }
    )


def record_of(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ArrayRecord of these ``Array`` objects, in their order, each kept as it is.

    ``ArrayRecord(dict_of_arrays)`` builds a new ``Array`` of the same fields
    for each one (Flower's ``from_array_dict``, ~15 us an array): for Arrays
    just made, or reused unchanged from a template, that is a second build.
    An ``Array`` is a value here: nothing in the package or in Flower's
    strategies changes one's fields in place. (Flower's constructor would
    also make a subclass a plain ``Array`` and its ``shape`` a tuple; these
    are kept as given.)
    """
    record = ArrayRecord()
    for name, array in arrays.items():
        record[name] = array
    return record
