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
from collections.abc import Callable

import numpy as np

CHUNK = 8192  # terms per BLAS call: below OpenBLAS's threshold for threads (10,000 terms)
BLOCK = 16 * CHUNK  # values :func:`norm` turns into float64 at a time (1 MiB), whole chunks
_SPARE_BLOCKS: list[np.ndarray] = []  # norm's float64 buffers of BLOCK values, between calls
_SELF_CHECKED = (np.dtype(np.float32), np.dtype(np.float64))  # what np.vecdot may sum (_rows_alike)


def dot(x: np.ndarray, y: np.ndarray) -> float:
    """``x @ y`` of two 1-d arrays of one length and dtype, as a float: ``np.dot`` of each
    :data:`CHUNK`-term slice, summed in order in float64 (one BLAS call, ``np.dot``'s bits, for up
    to :data:`CHUNK` terms). A chunk's overflow gives ``inf``; NaN and ``inf`` terms come through.
    Arrays of other shapes are a ``ValueError``, as ``np.dot``'s."""
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"dot of arrays of shapes {x.shape} and {y.shape}: two 1-d arrays of one length")
    if x.shape[0] <= CHUNK:
        return float(np.dot(x, y))
    return _add_parts(0.0, x, y)


def _add_parts(total: float, x: np.ndarray, y: np.ndarray) -> float:
    """``total`` plus ``np.dot`` of each :data:`CHUNK`-term slice of ``x`` and ``y``, added in order."""
    size = x.shape[0]
    whole = size - size % CHUNK if _VECDOT_AS_DOT and _rows_alike(x, y) else 0
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
    """Whether np.vecdot over CHUNK-term rows of ``x`` and ``y`` gives np.dot's parts: float32 or
    float64 (the dtypes checked at import; vecdot conjugates complex ones, and a longdouble's parts
    would stay longdouble), one dtype (no cast buffer), both contiguous (the strides np.dot hands BLAS)."""
    return x.dtype in _SELF_CHECKED and x.dtype == y.dtype and x.flags.c_contiguous and y.flags.c_contiguous


def _vecdot_is_np_dot() -> bool:
    """Whether this numpy has ``np.vecdot`` (2.0 and later) and it gives ``np.dot``'s bits on rows of
    :data:`CHUNK` terms in both float dtypes (checked once, on made-up values, at import: under 1 ms)."""
    if not hasattr(np, "vecdot"):
        return False
    terms = np.arange(2 * CHUNK, dtype=np.float64)
    spread = (terms * 0.6180339887, terms * 0.4142135624)  # (fractional parts: irregular values in [0, 1))
    x64, y64 = (part - np.floor(part) - 0.5 for part in spread)
    for dtype in _SELF_CHECKED:
        x, y = x64.astype(dtype), y64.astype(dtype)
        rows = np.vecdot(x.reshape(2, CHUNK), y.reshape(2, CHUNK)).tolist()
        if rows != [float(np.dot(x[:CHUNK], y[:CHUNK])), float(np.dot(x[CHUNK:], y[CHUNK:]))]:
            return False
    return True


_VECDOT_AS_DOT = _vecdot_is_np_dot()


def norm(x: np.ndarray) -> float:
    """The L2 norm of an array, in float64: ``sqrt(dot(v, v))`` of its values ``v`` flattened in C
    order (``np.linalg.norm``'s formula, bit for bit up to :data:`CHUNK` values).

    A float array of more than :data:`BLOCK` values is turned into float64 a
    block at a time, in a buffer kept for the next call, rather than whole: a
    new float64 copy of a large layer costs more in page faults than its dot
    product (ResNet8's 1.26M values: ~2 ms a training call in a batched run).
    The parts and their sum are the same. (An array that is not C-contiguous
    is first flattened, a copy in its own dtype.)
    """
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.size <= BLOCK:
        flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
        return math.sqrt(dot(flat, flat))
    values = np.ravel(x)  # (C order: a view of a C-contiguous array, else a copy in x's own dtype)
    if values.dtype == np.float64:
        return math.sqrt(dot(values, values))
    return _blockwise_norm(values.shape[0],
                           lambda start, block: np.copyto(block, values[start:start + BLOCK]))


def difference_norm(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> float:
    """``norm(np.subtract(a, b, dtype=dtype))``, bit for bit, for arrays of one shape; for a float
    ``dtype`` and more than :data:`BLOCK` values, the difference is made a block at a time, in
    float64, and never as a whole array (see :func:`norm`)."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or np.shape(a) != np.shape(b) or np.size(a) <= BLOCK:
        return norm(np.subtract(a, b, dtype=dtype))
    left, right = np.ravel(a), np.ravel(b)
    # (the subtraction runs in ``dtype``, as the whole array's; its result is cast to float64)
    return _blockwise_norm(left.shape[0], lambda start, block: np.subtract(
        left[start:start + BLOCK], right[start:start + BLOCK], out=block, dtype=dtype))


def _blockwise_norm(size: int, fill: Callable[[int, np.ndarray], object]) -> float:
    """``sqrt`` of the in-order parts of ``size`` float64 values that ``fill(start, block)`` writes
    into ``block`` (the values from ``start`` on), a :data:`BLOCK` at a time into a kept buffer."""
    try:
        buffer = _SPARE_BLOCKS.pop()  # (one step: another thread cannot take it between test and pop)
    except IndexError:
        buffer = np.empty(BLOCK, dtype=np.float64)
    try:
        total = 0.0
        for start in range(0, size, BLOCK):  # (BLOCK is whole chunks: the parts of the whole array)
            block = buffer[:min(BLOCK, size - start)]
            fill(start, block)
            total = _add_parts(total, block, block)
    finally:
        _SPARE_BLOCKS.append(buffer)  # (list.pop and .append are atomic: threads take their own)
    return math.sqrt(total)


__all__ = ["BLOCK", "CHUNK", "difference_norm", "dot", "norm"]
