"""Flower ``Array``s read without parsing their ``.npy`` header on every ``numpy()`` call.

Inside one process a model still goes to each client and back as Flower's
``Array``s: ``np.save`` bytes, read again by ``Array.numpy()`` (``np.load``)
wherever Flower's code or an app wants an ndarray. ``np.load`` parses every
header as a Python literal (~20-40 us an array): for 100 replies of a
56-array model that is most of Flower's FedAvg step (0.33 s against 0.14 s
with the header parsed once, on the development machine), and each client
pays it again for the model it receives.

:class:`ViewedArray` is an ``Array`` whose ``numpy()`` reads the bytes
through :func:`lips_flwr._npy.read_npy` (the header parsed once per distinct
header) and returns a copy: the same values, dtype, shape and memory order as
``Array.numpy()``, writable and the caller's own. In the batched Grid, each
client's copy of an instruction and each reply hold ViewedArrays
(:func:`viewed_record`: shallow copies over the same bytes);
``isinstance(a, Array)`` holds, a ViewedArray equals and deflates as an
``Array`` of its fields, so strategies and apps see Flower's records.
"""

from __future__ import annotations

import copy

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from ..._npy import NUMPY_SERIALIZATION, read_npy
from ..._records import record_of


class ViewedArray(Array):
    """An ``Array`` whose :meth:`numpy` parses its ``.npy`` header once per distinct header; equal to,
    and deflated as, a Flower ``Array`` of the same fields."""

    def numpy(self) -> np.ndarray:
        """``Array.numpy()``: a new, writable ndarray of the array's values.

        For ``.npy`` bytes of an array, what ``np.load`` gives; other bytes
        raise ``ValueError`` (``np.load`` reads an ``.npz`` archive too, and
        words its errors otherwise).
        """
        if self.stype != NUMPY_SERIALIZATION:
            return super().numpy()  # Flower's own TypeError
        return np.array(read_npy(self.data))  # (order "K": a Fortran-order array stays so, as np.load's)

    def __eq__(self, other: object) -> bool:
        # The dataclass's __eq__ wants the same class: an Array of the same fields is equal.
        if not isinstance(other, Array):
            return NotImplemented
        return (self.dtype, self.shape, self.stype, self.data) == (other.dtype, other.shape, other.stype,
                                                                   other.data)

    __hash__ = None  # type: ignore[assignment]  # (as Array's: a mutable dataclass)

    @classmethod
    def copy_of(cls, array: Array) -> ViewedArray:
        """A shallow copy of ``array`` as a ViewedArray: its attributes, as ``copy.copy`` copies them
        (its fields, over the same bytes; Flower's constructor would cost ~3x as much)."""
        viewed = cls.__new__(cls)
        viewed.__dict__.update(vars(array))
        return viewed

    def deflate(self) -> bytes:
        """Flower's wire form of an ``Array`` of these fields (its header names the class ``Array``, which
        Flower's inflation knows), so its ``object_id`` is that ``Array``'s too."""
        return Array(dtype=self.dtype, shape=tuple(self.shape), stype=self.stype, data=self.data).deflate()


def viewed_record(record: ArrayRecord) -> ArrayRecord:
    """A new ArrayRecord of shallow copies of ``record``'s Arrays (their fields, over the same bytes):
    :class:`ViewedArray` copies of plain ``Array``s, ``copy.copy`` of any subclass's."""
    return record_of({name: ViewedArray.copy_of(array) if type(array) is Array else copy.copy(array)
                      for name, array in record.items()})


def view_records(content: RecordDict) -> None:
    """Put :func:`viewed_record` of each of ``content``'s ArrayRecords in its place (the records and
    Arrays the sender holds stay as they were)."""
    for name, record in list(content.items()):
        if isinstance(record, ArrayRecord):
            content[name] = viewed_record(record)


__all__ = ["ViewedArray", "view_records", "viewed_record"]
