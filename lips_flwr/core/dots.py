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
:data:`CHUNK` terms, it is ``np.dot`` itself, bit for bit.
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
    total = 0.0
    for start in range(0, size, CHUNK):
        total += float(np.dot(x[start:start + CHUNK], y[start:start + CHUNK]))
    return total


def norm(x: np.ndarray) -> float:
    """The L2 norm of an array, in float64: ``sqrt(dot(v, v))`` of its values ``v`` flattened in C
    order (``np.linalg.norm``'s formula, bit for bit up to :data:`CHUNK` values)."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    return math.sqrt(dot(flat, flat))


__all__ = ["CHUNK", "dot", "norm"]
