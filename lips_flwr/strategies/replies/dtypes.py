"""The dtypes a round's replies are aggregated in, and the cast to them (no flwr import).

Flower's aggregation accumulates into the first reply's dtype: a float16 or
integer reply listed first would otherwise narrow the whole aggregate. The
gate votes per array (:func:`round_dtypes`) and re-serializes the arrays of
the other dtypes (:func:`cast_array`) before the wrapped strategy sees them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ..._npy import read_npy


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
    aggregated in these dtypes whatever their order.
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


def cast_array(data: bytes, dtype: np.dtype) -> np.ndarray:
    """The serialized array ``data`` as a C-ordered array of ``dtype``.

    ``astype(order="C")``, not ``ascontiguousarray``: that makes a 0-d array 1-d.
    """
    return read_npy(data).astype(dtype, order="C")


__all__ = ["cast_array", "common_dtypes", "round_dtypes"]
