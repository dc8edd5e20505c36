"""Conversions between Flower records and ``name -> ndarray`` dicts (adapters only)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord

from ._npy import NUMPY_SERIALIZATION, is_npy_bytes, npy_bytes, read_npy

_V = TypeVar("_V")
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
    own argument parsing; this builds the Array of those fields at once
    (:func:`new_array`), the bytes from :func:`lips_flwr._npy.npy_bytes`
    (the header made once per dtype and shape). A non-C-contiguous array is
    serialized in C order, as ``Array(np.asarray(ndarray, order="C"))``.
    """
    ndarray = np.asarray(ndarray, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    # (An object array is refused by np.save without pickle, as in Flower: a ValueError.)
    return new_array(_dtype_name(ndarray.dtype), tuple(ndarray.shape), NUMPY_SERIALIZATION,
                     npy_bytes(ndarray))


def viewed_array_of(ndarray: np.ndarray) -> ViewedArray:
    """:func:`array_of` as a :class:`ViewedArray` (the same fields and bytes), for an Array that is
    read again in this process: a reply that the client's mods (LIPS, FedBN, the state files) and
    the batched Grid's server each read parses its bytes once, not once per reader."""
    return ViewedArray.copy_of(array_of(ndarray))


def as_npy_array(array: Array) -> Array:
    """``array_of(array_view(array))``: ``array`` itself when it is already that (the same bytes,
    dtype and shape: :func:`lips_flwr._npy.is_npy_bytes`), else that copy of its values (from Fortran
    order or another header, without bytes past the array's end). To keep a record's Array."""
    if array.stype != NUMPY_SERIALIZATION:
        return array_of(array_view(array))
    view = array_view(array)
    same_fields = array.dtype == _dtype_name(view.dtype) and tuple(array.shape) == view.shape
    return array if same_fields and is_npy_bytes(array.data, view) else array_of(view)


def array_view(array: Array) -> np.ndarray:
    """One Array as a read-only view of its bytes (``Array.numpy()`` without the copy).

    The ``.npy`` header is parsed once per distinct header
    (:func:`lips_flwr._npy.read_npy`); ``Array.numpy()`` parses each one as a
    Python literal, which is most of a small model's conversion time. A
    :class:`ViewedArray` gives the view it parsed already. Other
    serializations go through ``Array.numpy()`` (which refuses them).
    """
    if isinstance(array, ViewedArray):
        return array.view()
    return read_npy(array.data) if array.stype == NUMPY_SERIALIZATION else array.numpy()


class ViewedArray(Array):
    """An ``Array`` whose bytes are parsed once: equal to, and deflated as, a Flower ``Array`` of the
    same fields.

    :meth:`view` parses the ``.npy`` bytes (:func:`lips_flwr._npy.read_npy`)
    the first time and keeps the read-only view while ``data`` is the same
    bytes object; a copy made after that (:meth:`copy_of`) shares it, so the
    batched Grid parses a broadcast model once for all the clients of a
    delivery, not in each client's every reader (restore, LIPS, the app).
    :meth:`numpy` is ``Array.numpy()``: a new, writable array of the values.
    Pickling drops the view (the bytes are pickled, as an ``Array``'s).
    ``isinstance(a, Array)`` holds and it equals an ``Array`` of its fields, so
    strategies and apps see Flower's records.
    """

    def view(self) -> np.ndarray:
        """A read-only view of the values, parsed once per bytes object; ``ValueError`` for bytes that
        are not a ``.npy`` array, Flower's ``TypeError`` for another serialization."""
        if self.stype != NUMPY_SERIALIZATION:
            return super().numpy()  # Flower's own TypeError
        parsed = self.__dict__.get("_parsed")
        if parsed is None or parsed[0] is not self.data:  # (a mod may give its own copy other bytes)
            view = read_npy(self.data)
            view.flags.writeable = False  # (shared by copies: read_npy's rare copies are writable)
            parsed = self.__dict__["_parsed"] = (self.data, view)
        return parsed[1]

    def numpy(self) -> np.ndarray:
        """``Array.numpy()``: a new, writable ndarray of the array's values.

        For ``.npy`` bytes of an array, what ``np.load`` gives; other bytes
        raise ``ValueError`` (``np.load`` reads an ``.npz`` archive too, and
        words its errors otherwise).
        """
        return np.array(self.view())  # (order "K": a Fortran-order array stays so, as np.load's)

    def __eq__(self, other: object) -> bool:
        # The dataclass's __eq__ wants the same class: an Array of the same fields is equal.
        if not isinstance(other, Array):
            return NotImplemented
        return (self.dtype, self.shape, self.stype, self.data) == (other.dtype, other.shape, other.stype,
                                                                   other.data)

    __hash__ = None  # type: ignore[assignment]  # (as Array's: a mutable dataclass)

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.__dict__.items() if name != "_parsed"}

    @classmethod
    def copy_of(cls, array: Array) -> ViewedArray:
        """A shallow copy of ``array`` as a ViewedArray: its attributes, as ``copy.copy`` copies them
        (its fields, over the same bytes, and a view a ViewedArray parsed; Flower's constructor would
        cost ~3x as much)."""
        viewed = cls.__new__(cls)
        viewed.__dict__.update(vars(array))
        return viewed

    def deflate(self) -> bytes:
        """Flower's wire form of an ``Array`` of these fields (its header names the class ``Array``, which
        Flower's inflation knows), so its ``object_id`` is that ``Array``'s too."""
        return Array(dtype=self.dtype, shape=tuple(self.shape), stype=self.stype, data=self.data).deflate()


def record_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """``name -> ndarray`` writable copy of an ArrayRecord, in its order (as ``Array.numpy()`` gives)."""
    return {name: np.array(array_view(array)) for name, array in record.items()}


def record_dict(record: Mapping[str, _V]) -> dict[str, _V]:
    """``dict(record.items())``, as one C copy when ``items()`` is a view of a dict (Flower's records,
    whose item access is Python code: ~0.5 us a lookup where a dict's is ~30 ns)."""
    items = record.items()
    mapping = getattr(items, "mapping", None)  # a dict view's read-only proxy of its dict
    return mapping.copy() if type(mapping) is MappingProxyType else dict(items)


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
    *,
    viewed: bool = False,
) -> ArrayRecord:
    """An ArrayRecord of ``arrays``.

    With a ``template``, the record has the template's names (in ``order``
    when given, else the template's) and reuses its Arrays except for the
    names in ``changed`` (saves re-serializing tensors that did not change):
    the same objects (:func:`record_of`). ``viewed``: the new Arrays are
    :func:`viewed_array_of`'s.
    """
    build = viewed_array_of if viewed else array_of
    if template is None:
        return record_of({n: build(a) for n, a in arrays.items()})
    changed = set(arrays if changed is None else changed)
    return record_of(
        {
            name: build(arrays[name]) if name in changed else template[name]
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
    are kept as given.) The record is what setting each item makes, with the
    same ``TypeError`` for a name that is not a ``str`` or a value that is not
    an ``Array``, filled at once where this Flower's records are a dict and a
    dirty flag (checked at import, :func:`_builds_as_flower`): an item set
    costs ~1.9 us, most of it ``typing.cast`` evaluated at run time.
    """
    record = ArrayRecord()
    if not _FAST_RECORDS:
        for name, array in arrays.items():
            record[name] = array
        return record
    for name, array in arrays.items():
        if not isinstance(name, str) or not isinstance(array, Array):
            record[name] = array  # Flower's own TypeError
    if arrays:
        record.__dict__["_data"].update(arrays)
        record.__dict__["_is_dirty"] = True
    return record


def record_copy(record: ConfigRecord | MetricRecord) -> ConfigRecord | MetricRecord:
    """``MetricRecord(dict(record.items()))`` for a MetricRecord, ``ConfigRecord(...)`` likewise for a
    ConfigRecord: a new record of the same items (the same value objects), of Flower's class.

    Flower's constructor checks each key and value again (~2.4 us an item,
    ``typing.get_args`` at run time); they were checked when they went into
    ``record``, so a copy of a record of Flower's class is filled at once
    where this Flower's records hold their two checks and a dict
    (:func:`_copies_as_flower`): its checks and a new dict of the items,
    nothing else of ``record`` (not an ``object_id`` it cached). (A list
    value changed in place since, to hold other types, is not checked
    again.) A subclass's record goes through the constructor.
    """
    cls: type[MetricRecord] | type[ConfigRecord] = (MetricRecord if isinstance(record, MetricRecord)
                                                    else ConfigRecord)
    if not _FAST_COPIES or type(record) is not cls:
        return cls(dict(record.items()))  # type: ignore[arg-type]
    state = vars(record)
    copy = cls.__new__(cls)
    copy.__dict__.update(_check_key_fn=state["_check_key_fn"], _check_value_fn=state["_check_value_fn"],
                         _data=dict(state["_data"]))
    return copy


def new_array(dtype: str, shape: tuple[int, ...], stype: str, data: bytes) -> Array:
    """``Array(dtype=dtype, shape=shape, stype=stype, data=data)``, for arguments of those types.

    Flower's constructor sorts out which of its three forms it was called
    with and sets each field through ``__setattr__`` (~4.5 us); the Array it
    builds is its four fields and a dirty flag, set here at once (~0.4 us)
    where this Flower builds them so (checked at import,
    :func:`_builds_as_flower`), else by Flower's constructor.
    """
    if not _FAST_ARRAYS:
        return Array(dtype=dtype, shape=shape, stype=stype, data=data)
    array = Array.__new__(Array)
    array.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype=stype, data=data)
    return array


def _builds_as_flower() -> tuple[bool, bool]:
    """Whether :func:`new_array` and :func:`record_of` may fill Flower's objects at once: whether an
    Array and an ArrayRecord built by Flower hold what they would set (the same attributes, in order)."""
    fields: dict = {"dtype": "float32", "shape": (1,), "stype": NUMPY_SERIALIZATION, "data": bytes(4)}
    flower = Array(dtype="float32", shape=(1,), stype=NUMPY_SERIALIZATION, data=bytes(4))
    fast = Array.__new__(Array)
    fast.__dict__.update(_is_dirty=True, **fields)
    arrays_alike = list(vars(fast).items()) == list(vars(flower).items())
    by_items, at_once = ArrayRecord(), ArrayRecord()
    by_items["a"] = flower
    data = at_once.__dict__.get("_data")
    if isinstance(data, dict):
        data["a"] = flower
        at_once.__dict__["_is_dirty"] = True
    records_alike = (list(vars(by_items)) == list(vars(at_once))
                     and all(vars(by_items)[k] is vars(at_once)[k] or vars(by_items)[k] == vars(at_once)[k]
                             for k in vars(by_items)))
    return arrays_alike, records_alike


def _copies_as_flower() -> bool:
    """Whether :func:`record_copy` may fill a copy at once: whether a ConfigRecord and a MetricRecord
    built by Flower hold only their two checks and a dict of their items."""
    built = (ConfigRecord({"a": [1, 2], "b": "c"}), MetricRecord({"a": 1.0, "b": [2]}))
    return all(list(vars(record)) == ["_check_key_fn", "_check_value_fn", "_data"]
               and type(vars(record)["_data"]) is dict and dict(record.items()) == vars(record)["_data"]
               for record in built)


_FAST_ARRAYS, _FAST_RECORDS = _builds_as_flower()
_FAST_COPIES = _copies_as_flower()
