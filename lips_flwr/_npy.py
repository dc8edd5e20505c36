"""Flower's numpy wire format, read without copies and written without ``np.save`` (no flwr import).

Both Flower APIs serialize each array with ``np.save``: the ``data`` of a
Message API ``Array``, an entry of legacy ``Parameters.tensors``.
:func:`read_npy` parses the ``.npy`` header (once per distinct header) and
returns a read-only view of the bytes, so that reading a reply or the global
model copies no array data. :func:`npy_bytes` writes the bytes ``np.save``
writes, its header made once per dtype and shape.
"""

from __future__ import annotations

import functools
import math
from io import BytesIO

import numpy as np

NUMPY_SERIALIZATION = "numpy.ndarray"  # Flower's Array.stype for np.save bytes

_NPY_V1, _NPY_V2 = b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00"
_MAX_CACHED_HEADER = 4096  # np.save writes 64-byte aligned headers of ~128 bytes
_MAX_WRITE_HEADERS = 4096  # distinct (dtype, shape) pairs whose headers npy_bytes keeps
_write_headers: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}


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


def npy_header(data: bytes) -> tuple[bytes, tuple[int, ...], np.dtype, int] | None:
    """``(header bytes, shape, dtype, length)`` of a C-order ``.npy`` array, from its header alone.

    The header bytes are the magic string and header that ``np.save`` wrote
    (a prefix of ``data``); ``length`` is the length of a whole array with
    that header. ``None`` when ``data`` is not such an array (Fortran order,
    object dtype, an unreadable or very long header).
    """
    prefix = _header_prefix(data)
    if prefix is None:
        return None
    try:
        shape, fortran, dtype, offset = _parse_header(prefix)
    except (ValueError, EOFError, SyntaxError):
        return None
    if fortran or dtype.hasobject:
        return None
    return prefix, shape, dtype, offset + math.prod(shape) * dtype.itemsize


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes ``np.save(f, array, allow_pickle=False)`` writes: :func:`npy_parts` joined in one
    allocation (one part, an array ``np.save`` wrote, is returned as is)."""
    return b"".join(npy_parts(array))


def npy_parts(array: np.ndarray) -> tuple[bytes | memoryview, ...]:
    """The bytes ``np.save(f, array, allow_pickle=False)`` writes, as parts to write one after another.

    A model's arrays have a few dtypes and shapes, and ``np.save`` builds and
    formats the same header for every one of them (most of a small array's
    serialization time), writes the data in chunks and a ``BytesIO`` copies it
    out again. Here the header of the first array of a dtype and shape is cut
    from ``np.save``'s own output and kept; a C-contiguous array is two parts,
    that header and a view of the array's own bytes, which is what ``np.save``
    writes after the header for such an array. Any other array
    (Fortran order or strided, object or structured dtypes, dtypes with
    metadata) goes through ``np.save`` every time, with its errors: one part.
    """
    if not _header_kept_for(array):
        return (_saved(array),)
    key = (array.dtype, array.shape)
    head = _write_headers.get(key)
    if head is None:
        data = _saved(array)
        if len(_write_headers) >= _MAX_WRITE_HEADERS:  # a stream of ever new shapes: start over
            _write_headers.clear()
        head = _write_headers[key] = data[: len(data) - array.nbytes]  # (data goes: a copy of the array)
    return head, array.reshape(-1).view(np.uint8).data


def is_npy_bytes(data: bytes, array: np.ndarray) -> bool:
    """Whether ``data`` is exactly :func:`npy_bytes` of ``array``, given ``array`` = ``read_npy(data)``:
    its header is the one ``np.save`` writes for a C-contiguous array of that dtype and shape
    (made once, :func:`npy_parts`), and nothing follows the array's bytes."""
    if not _header_kept_for(array):
        return False
    key = (array.dtype, array.shape)
    if key not in _write_headers:
        npy_parts(array)  # makes and keeps the header of this dtype and shape
    head = _write_headers.get(key)
    return head is not None and len(data) == len(head) + array.nbytes and data.startswith(head)


def _header_kept_for(array: np.ndarray) -> bool:
    """Whether ``np.save`` writes ``array`` as a header kept per dtype and shape and its bytes in C
    order: a C-contiguous array of a plain dtype (not object, structured or with metadata)."""
    dtype = array.dtype
    plain = not dtype.hasobject and dtype.fields is None and not dtype.metadata
    return plain and bool(array.flags.c_contiguous)


def _saved(array: np.ndarray) -> bytes:
    buffer = BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npy_shape(data: bytes) -> tuple[int, ...]:
    """Shape of a serialized ``.npy`` array (reads the header only)."""
    return tuple(read_npy(data).shape)
