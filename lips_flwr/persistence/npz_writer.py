"""``np.savez`` for the files of :mod:`.npz_store`, written in one pass without ``zipfile``.

An ``.npz`` is a zip archive of ``.npy`` members, stored (not compressed).
``np.savez`` writes it through ``zipfile``: per member a ``ZipInfo``, a local
header written, the ``.npy`` header built and formatted, the data streamed,
then a seek back to rewrite the header with the CRC and sizes. That is tens of
microseconds of Python per member: most of a client state file's save (30
small arrays, 10 KB, once per training call). Here each member's CRC-32 is
computed first, so that its local header is written once, followed by the
``.npy`` bytes of :func:`lips_flwr._npy.npy_parts` (the header made once per
dtype and shape, the array's own buffer: no copy); the central directory
follows. The members, their order and their ``.npy`` bytes are ``np.savez``'s;
its zip records differ in their fixed time stamp (1980-01-01, so equal arrays
give equal files) and in having no zip64 extra fields (``np.savez`` adds them
to every member, version 4.5; these are plain version 2.0 records).
``np.load`` reads the archive through ``zipfile``, which verifies each
member's CRC as it reads it.

An archive beyond the plain zip format's limits (4 GiB, 65,535 members) is
written by ``np.savez``, which writes zip64 records.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import IO, Any, cast

import numpy as np

from .._npy import npy_parts

_LOCAL = struct.Struct("<4s2B4HL2L2H")  # zipfile's structFileHeader
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # structCentralDir
_END = struct.Struct("<4s4H2LH")  # structEndArchive
_VERSION = 20  # "2.0": stored members, folders; what zipfile writes without zip64
_UNIX = 3  # the system that made the archive (zipfile's create_system on POSIX)
_UTF8_NAME = 0x800  # general purpose flag: the member's name is UTF-8
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest date a zip record holds
_DOS_TIME = 0
_PERMISSIONS = 0o600 << 16  # external attributes: rw------- (as zipfile's open(..., "w"))
_LIMIT = 0xFFFFFFFF  # a size or offset that needs zip64
_MAX_MEMBERS = 0xFFFF


def write_npz(file: IO[bytes], arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``file`` as ``np.savez(file, **arrays)`` does (members ``<name>.npy``).

    ``file`` is written from its current position, which must be the start of
    the archive (a new file). Object arrays are refused as by ``np.save``
    without pickle (``ValueError``).
    """
    entries = [(*_member_name(name), npy_parts(np.asarray(array))) for name, array in arrays.items()]
    sizes = [sum(map(len, parts)) for _, _, parts in entries]
    total = sum(_LOCAL.size + len(encoded) + size for (encoded, _, _), size in zip(entries, sizes))
    directory = sum(_CENTRAL.size + len(encoded) for encoded, _, _ in entries)
    if len(entries) > _MAX_MEMBERS or total + directory > _LIMIT:
        # numpy's stub would match a **dict against savez's `allow_pickle: bool`.
        np.savez(file, **cast(dict[str, Any], dict(arrays)))
        return
    records, offset = [], 0
    for (encoded, flags, parts), size in zip(entries, sizes):
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        file.write(_LOCAL.pack(b"PK\x03\x04", _VERSION, 0, flags, 0, _DOS_TIME, _DOS_DATE, crc, size, size,
                               len(encoded), 0))
        file.write(encoded)
        for part in parts:
            file.write(part)
        records.append(_CENTRAL.pack(b"PK\x01\x02", _VERSION, _UNIX, _VERSION, 0, flags, 0, _DOS_TIME,
                                     _DOS_DATE, crc, size, size, len(encoded), 0, 0, 0, 0, _PERMISSIONS,
                                     offset) + encoded)
        offset += _LOCAL.size + len(encoded) + size
    file.write(b"".join(records))
    file.write(_END.pack(b"PK\x05\x06", 0, 0, len(records), len(records), directory, offset, 0))


def _member_name(name: str) -> tuple[bytes, int]:
    """The member's name ``<name>.npy`` as bytes, with the UTF-8 flag where it is not ASCII."""
    member = f"{name}.npy"
    try:
        return member.encode("ascii"), 0
    except UnicodeEncodeError:
        return member.encode("utf-8"), _UTF8_NAME


__all__ = ["write_npz"]
