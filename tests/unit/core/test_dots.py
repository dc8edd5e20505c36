"""Dot products and norms without a BLAS thread (lips_flwr.core.dots)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lips_flwr.core import dots
from lips_flwr.core.dots import CHUNK, dot, norm


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [0, 1, 7, CHUNK])
def test_up_to_a_chunk_it_is_np_dot_bit_for_bit(dtype, size):
    x = np.random.default_rng(size).normal(size=size).astype(dtype)
    y = np.random.default_rng(size + 1).normal(size=size).astype(dtype)
    assert dot(x, y) == float(np.dot(x, y)) and type(dot(x, y)) is float
    assert norm(x) == float(np.linalg.norm(x.astype(np.float64)))


@pytest.mark.parametrize("size", [CHUNK + 1, 2 * CHUNK, 18_432, 1_000_003])
def test_beyond_a_chunk_blas_gets_a_chunk_at_most_and_the_parts_are_summed_in_order(size, monkeypatch):
    x = np.random.default_rng(size).normal(size=size)
    y = np.random.default_rng(size + 1).normal(size=size)
    expected = 0.0
    for start in range(0, size, CHUNK):
        expected += float(np.dot(x[start:start + CHUNK], y[start:start + CHUNK]))
    sizes = []
    blas_dot, rows_dot = np.dot, getattr(np, "vecdot", None)

    def recorded(a, b):
        sizes.append(a.shape[0])
        return blas_dot(a, b)

    def recorded_rows(a, b):  # np.vecdot: one BLAS dot per row
        sizes.extend([a.shape[-1]] * a.shape[0])
        return rows_dot(a, b)

    monkeypatch.setattr(dots.np, "dot", recorded)  # (numpy's module: restored after the test)
    if rows_dot is not None:
        monkeypatch.setattr(dots.np, "vecdot", recorded_rows)
    assert dot(x, y) == expected
    assert max(sizes) <= CHUNK and sum(sizes) == size
    assert expected == pytest.approx(float(blas_dot(x, y)), rel=1e-12)


def test_a_norm_flattens_in_c_order_in_float64_and_matches_numpy_to_rounding():
    a = np.random.default_rng(3).normal(size=(64, 32, 3, 3)).astype(np.float32)
    for u in (a, np.asfortranarray(a), a[:, ::2]):
        flat = np.asarray(u, dtype=np.float64).reshape(-1)
        assert norm(u) == math.sqrt(dot(flat, flat))
        assert norm(u) == pytest.approx(float(np.linalg.norm(flat)), rel=1e-14)


def test_overflow_nan_and_inf_come_through_as_np_dot_gives_them():
    big = np.full(3 * CHUNK, 1e200)
    with np.errstate(over="ignore"):
        assert dot(big, big) == math.inf
    for bad in (math.nan, math.inf):
        x = np.zeros(3 * CHUNK)
        x[-1] = bad
        with np.errstate(invalid="ignore"):
            assert not math.isfinite(dot(x, x))
    with np.errstate(invalid="ignore"):
        assert math.isnan(dot(np.array([math.inf]), np.array([0.0])))


def test_arrays_of_other_shapes_are_refused():
    pairs = ((np.ones(2 * CHUNK), np.ones(3 * CHUNK)), (np.ones(3), np.ones(4)), (np.ones((2, 2)), np.ones((2, 2))))
    for x, y in pairs:
        with pytest.raises(ValueError, match="two 1-d arrays of one length"):
            dot(x, y)


def _parts_in_order(x, y):
    """The definition: np.dot of each CHUNK-term slice, summed in order."""
    total = 0.0
    for start in range(0, x.shape[0], CHUNK):
        total += float(np.dot(x[start:start + CHUNK], y[start:start + CHUNK]))
    return total


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_whole_chunks_in_one_call_give_np_dots_bits_for_every_layout(dtype):
    rng = np.random.default_rng(11)
    for size in (CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 5, 147_456, 589_824, 1_261_101):
        for offset in (0, 1, 3):  # an array that does not start on the allocator's alignment
            buffer = np.empty(size + offset, dtype=dtype)
            buffer[offset:] = rng.normal(size=size) * 10.0 ** rng.uniform(-4, 4)
            x = buffer[offset:]
            y = rng.normal(size=size).astype(dtype)
            assert dot(x, y) == _parts_in_order(x, y)
            assert dot(x, x) == _parts_in_order(x, x)
    strided = rng.normal(size=4 * CHUNK + 6)[::2]  # not contiguous: chunk by chunk, as np.dot gets them
    assert dot(strided, strided) == _parts_in_order(strided, strided)
    mixed = (rng.normal(size=3 * CHUNK).astype(np.float32), rng.normal(size=3 * CHUNK))
    assert dot(*mixed) == _parts_in_order(*mixed)


def test_numpy_without_vecdot_gives_the_same_bits(monkeypatch):
    x = np.random.default_rng(5).normal(size=5 * CHUNK + 17)
    fast = dot(x, x)
    monkeypatch.setattr(dots, "_VECDOT_AS_DOT", False)
    assert dot(x, x) == fast == _parts_in_order(x, x)
    monkeypatch.delattr(dots.np, "vecdot", raising=False)
    assert dots._vecdot_is_np_dot() is False


def test_this_numpys_vecdot_is_taken_when_it_exists():
    assert dots._VECDOT_AS_DOT is hasattr(np, "vecdot")
