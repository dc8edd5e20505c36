"""Dot products and norms that never wake a BLAS thread pool.

numpy's wheels compute a dot product with OpenBLAS, which splits one of more
than 10,000 terms over its threads (one per core). After such a call those
threads busy-wait for their next task for about a tenth of a second: one
18,432-term ``x.dot(x)`` kept another core busy for 100-110 ms of a 200 ms
sleep that followed it (measured on the development machine). LIPS computes
norms after every training call and in every server step, so the threads
never rested: in the batched Grid they took a third of the process's CPU time
and the core its state file writer and the clients' calls needed. Their
partition also depends on the machine's core count, and with it the last bits
of the sum.

Here a dot product is the in-order sum of BLAS dot products of at most
:data:`CHUNK` terms, each of which BLAS computes in the calling thread. Up to
:data:`CHUNK` terms, it is ``np.dot`` itself, bit for bit; beyond, each part
is ``np.dot`` of its chunk, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

CHUNK = 8192  # terms per BLAS call: below OpenBLAS's threshold for threads (10,000 terms)


def dot(x: np.ndarray, y: np.ndarray) -> float:
    """``x @ y`` of two 1-d arrays of one length and dtype, as a float: ``np.dot`` of each
    :data:`CHUNK`-term slice, summed in order in float64 (one BLAS call, ``np.dot``'s bits, for up
    to :data:`CHUNK` terms). A chunk's overflow gives ``inf``; NaN and ``inf`` terms come through.
    Arrays of other shapes are a ``ValueError``, as ``np.dot``'s."""
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"dot of arrays of shapes {x.shape} and {y.shape}: two 1-d arrays of one length")
    size = x.shape[0]
    if size <= CHUNK:
        return float(np.dot(x, y))
    whole = size - size % CHUNK if _VECDOT_AS_DOT and _rows_alike(x, y) else 0
    total = 0.0
    if whole:
        # One call for the whole chunks: np.vecdot runs, on each row, the dtype's dot loop that
        # np.dot runs on a 1-d pair, so each part has np.dot's bits (2x faster at 1.26M terms than
        # one np.dot per chunk, and the GIL let go once, not once per chunk).
        for part in np.vecdot(x[:whole].reshape(-1, CHUNK), y[:whole].reshape(-1, CHUNK)).tolist():
            total += part
    for start in range(whole, size, CHUNK):
        total += float(np.dot(x[start:start + CHUNK], y[start:start + CHUNK]))
    return total


def _rows_alike(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether np.vecdot over CHUNK-term rows of ``x`` and ``y`` gives np.dot's parts: real floats
    (vecdot conjugates complex ones) of one dtype (no cast buffer), both contiguous (the strides
    that np.dot hands BLAS)."""
    return (x.dtype.kind == "f" and x.dtype == y.dtype
            and x.flags.c_contiguous and y.flags.c_contiguous)


def _vecdot_is_np_dot() -> bool:
    """Whether this numpy has ``np.vecdot`` (2.0 and later) and it gives ``np.dot``'s bits on rows
    (checked once at import, on made-up rows of 1,000 terms in both float dtypes: ~0.1 ms)."""
    if not hasattr(np, "vecdot"):
        return False
    terms = np.arange(2000, dtype=np.float64)
    for dtype in (np.float32, np.float64):
        x, y = ((terms * 0.7071) % 3.3 - 1.6).astype(dtype), ((terms * 0.3183) % 2.9 - 1.3).astype(dtype)
        rows = np.vecdot(x.reshape(2, 1000), y.reshape(2, 1000)).tolist()
        if rows != [float(np.dot(x[:1000], y[:1000])), float(np.dot(x[1000:], y[1000:]))]:
            return False
    return True


_VECDOT_AS_DOT = _vecdot_is_np_dot()


def norm(x: np.ndarray) -> float:
    """The L2 norm of an array, in float64: ``sqrt(dot(v, v))`` of its values ``v`` flattened in C
    order (``np.linalg.norm``'s formula, bit for bit up to :data:`CHUNK` values)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    return math.sqrt(dot(flat, flat))


__all__ = ["CHUNK", "dot", "norm"]
