"""The batched Grid's copies of a message's Arrays: each client its own, each broadcast parsed once.

Inside one process a model still goes to each client and back as Flower's
``Array``s: ``np.save`` bytes, read again by ``Array.numpy()`` (``np.load``)
wherever Flower's code or an app wants an ndarray. ``np.load`` parses every
header as a Python literal (~20-40 us an array): for 100 replies of a
56-array model that is most of Flower's FedAvg step (0.33 s against 0.14 s
with the header parsed once, on the development machine), and each client
pays it again for the model it receives, in each of its readers (FedBN's
restore, LIPS, the app's load).

Here each client's copy of an instruction and each reply hold
:class:`~lips_flwr._records.ViewedArray`\\ s (:func:`viewed_record`:
shallow copies over the same bytes), which parse their bytes once and keep
the view. With ``shared`` (one dict for a delivery's calls), the copies of
one broadcast Array are made from one template whose bytes were parsed
first, so that the clients share its view. ``isinstance(a, Array)`` holds,
a ViewedArray equals and deflates as an ``Array`` of its fields, so
strategies and apps see Flower's records.
"""

from __future__ import annotations

import contextlib
import copy

from flwr.app import Array, ArrayRecord, RecordDict

from ..._records import ViewedArray, record_of

# id of a broadcast Array -> (that Array, its parsed template), for one delivery's calls.
Shared = dict[int, tuple[Array, ViewedArray]]


def viewed_record(record: ArrayRecord, shared: Shared | None = None) -> ArrayRecord:
    """A new ArrayRecord of shallow copies of ``record``'s Arrays (their fields, over the same bytes):
    :class:`ViewedArray` copies of ``Array``s and ViewedArrays, ``copy.copy`` of any other subclass's.

    With ``shared``, an Array's copies come from one template kept there,
    whose bytes are parsed when it is made (bytes that do not parse are left
    for the client's own reader to refuse, in its call).
    """
    return record_of({name: _viewed(array, shared) for name, array in record.items()})


def _viewed(array: Array, shared: Shared | None) -> Array:
    if type(array) is not Array and type(array) is not ViewedArray:
        return copy.copy(array)
    if shared is None:
        return ViewedArray.copy_of(array)
    entry = shared.get(id(array))
    if entry is None or entry[0] is not array:  # (an id is unique only while its object lives)
        template = ViewedArray.copy_of(array)
        with contextlib.suppress(ValueError, TypeError):  # (each copy then parses again and raises in
            template.view()                               # its client's call, as Array.numpy() would)
        entry = shared[id(array)] = (array, template)
    return ViewedArray.copy_of(entry[1])


def view_records(content: RecordDict) -> None:
    """Put :func:`viewed_record` of each of ``content``'s ArrayRecords in its place (the records and
    Arrays the sender holds stay as they were)."""
    for name, record in list(content.items()):
        if isinstance(record, ArrayRecord):
            content[name] = viewed_record(record)


__all__ = ["Shared", "ViewedArray", "view_records", "viewed_record"]
