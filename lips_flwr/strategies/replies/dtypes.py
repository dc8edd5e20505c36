"""The dtypes a round's replies are aggregated in, and the cast to them (no flwr import).

Replies are aggregated in the dtypes of the global model the server sent,
whatever most replies send: Flower's aggregation accumulates into the first
reply's dtype, and a vote would let a majority of int32 or float16 replies
truncate or narrow the honest ones. The gate re-serializes each reply array of
another dtype (:func:`cast_array`) before the wrapped strategy sees it, except
where every reply sends one dtype :func:`kept_as_sent` leaves alone: what
Flower's own arithmetic made of the model a round earlier, so that no reply
pays a cast on a good round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..._npy import read_npy

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def kept_as_sent(sent: np.dtype, model: np.dtype) -> bool:
    """Whether replies that all send ``sent`` for a ``model`` array are aggregated as sent: the model's
    own dtype, and 64-bit integers or float32 for a float64 model (Flower's FedAvg averages integer
    buffers into float64, FedAdam returns float64 for float32).

    A narrower integer is cast: Flower's legacy ``aggregate`` multiplies each
    reply by its example count in the reply's dtype (``layer * num_examples``),
    which an int8 or int32 overflows (numpy 2 raises or wraps silently).
    """
    if sent == model:
        return True
    return model == _FLOAT64 and (sent == _FLOAT32 or (sent.kind in "iu" and sent.itemsize == 8))


def round_dtypes(
    dtypes: Sequence[Mapping[str, np.dtype]], model: Mapping[str, np.dtype]
) -> tuple[Mapping[str, np.dtype], bool]:
    """The dtypes a round's replies are aggregated in, and whether any reply must be cast to them.

    ``dtypes`` holds each kept reply's ``name -> dtype``; ``model`` is the
    global model's. Per array: the model's dtype, unless every reply sends one
    dtype :func:`kept_as_sent` leaves alone. Replies whose headers were all
    known share one map (the checks' fast path): it is read once, not per reply.
    """
    distinct = {id(found): found for found in dtypes}
    if not distinct or (len(distinct) == 1 and dtypes[0] is model):
        return model, False
    chosen = {}
    for name, dtype in model.items():
        sent = {found[name] for found in distinct.values()}
        only = sent.pop() if len(sent) == 1 else None
        chosen[name] = only if only is not None and kept_as_sent(only, dtype) else dtype
    mixed = any(found[name] != dtype for found in distinct.values() for name, dtype in chosen.items())
    if len(distinct) == 1 and not mixed:
        return dtypes[0], False  # the same object: the next round's fast path knows it
    return chosen, mixed


def cast_array(data: bytes, dtype: np.dtype) -> np.ndarray:
    """The serialized array ``data`` as a C-ordered array of ``dtype``.

    ``astype(order="C")``, not ``ascontiguousarray``: that makes a 0-d array 1-d.
    """
    return read_npy(data).astype(dtype, order="C")


__all__ = ["cast_array", "kept_as_sent", "round_dtypes"]
