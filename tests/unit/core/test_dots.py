"""Dot products and norms without a BLAS thread (lips_flwr.core.dots)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lips_flwr.core import dots
from lips_flwr.core.dots import BLOCK, CHUNK, dot, norm


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


def test_the_import_check_refuses_a_vecdot_that_sums_otherwise(monkeypatch):
    if not hasattr(np, "vecdot"):
        pytest.skip("numpy < 2.0 has no vecdot")
    monkeypatch.setattr(np, "vecdot", lambda a, b: np.einsum("ij,ij->i", a, b))  # another order of terms
    assert dots._vecdot_is_np_dot() is False


def test_other_float_dtypes_keep_the_chunk_by_chunk_loop_and_a_python_float():
    for dtype in (np.float16, np.longdouble):  # (not checked at import; a longdouble's parts stay longdouble)
        x = np.random.default_rng(9).normal(size=3 * CHUNK + 5).astype(dtype)
        assert not dots._rows_alike(x, x)
        assert dot(x, x) == _parts_in_order(x, x) and type(dot(x, x)) is float


def _whole_norm(x):
    """The definition: the float64 copy of all of x's values, C order, then dot."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    return math.sqrt(dot(flat, flat))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_large_norm_turned_into_float64_a_block_at_a_time_has_the_whole_copys_bits(dtype):
    rng = np.random.default_rng(21)
    for size in (BLOCK - 1, BLOCK, BLOCK + 1, BLOCK + CHUNK, 3 * BLOCK + 777, 589_824):
        x = (rng.normal(size=size) * 10.0 ** rng.uniform(-3, 3)).astype(dtype)
        assert norm(x) == _whole_norm(x)
    a = rng.normal(size=(256, 128, 3, 3)).astype(np.float32)
    for layout in (a, np.asfortranarray(a), a[:, ::2], a.transpose(1, 0, 2, 3)):  # flattened in C order
        assert norm(layout) == _whole_norm(layout)


def test_a_blocks_buffer_is_kept_for_the_next_norm_and_not_shared_by_two_at_once(monkeypatch):
    monkeypatch.setattr(dots, "_SPARE_BLOCKS", [])
    x = np.random.default_rng(4).normal(size=2 * BLOCK + 5).astype(np.float32)
    first = norm(x)
    assert len(dots._SPARE_BLOCKS) == 1
    kept = dots._SPARE_BLOCKS[0]
    assert norm(x) == first and len(dots._SPARE_BLOCKS) == 1 and dots._SPARE_BLOCKS[0] is kept
    taken: list = []
    real_add = dots._add_parts

    def nested(total, a, b):  # another norm while this one holds its buffer gets its own
        if not taken:
            taken.append(None)
            taken[0] = norm(x)
            assert len(dots._SPARE_BLOCKS) == 1 and dots._SPARE_BLOCKS[0] is not kept
        return real_add(total, a, b)

    monkeypatch.setattr(dots, "_add_parts", nested)
    assert norm(x) == first == taken[0]
    assert len(dots._SPARE_BLOCKS) == 2


def test_norms_of_whole_numbers_and_lists_are_still_taken_whole():
    assert norm(np.arange(BLOCK + 3)) == _whole_norm(np.arange(BLOCK + 3))
    assert norm([3.0, 4.0]) == 5.0


@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64),
                                    (np.float16, np.float16), (np.float32, np.float64),
                                    (np.float64, np.float32)])
def test_a_difference_norm_is_the_norm_of_the_whole_difference_bit_for_bit(dtypes):
    rng = np.random.default_rng(8)
    for size in (10, BLOCK, BLOCK + 1, 2 * BLOCK + CHUNK + 3, 589_824):
        received = rng.normal(size=size).astype(dtypes[0])
        trained = (received + rng.normal(size=size) * 1e-3).astype(dtypes[1])
        dtype = np.result_type(received, np.float32)
        whole = np.subtract(trained, received, dtype=dtype)
        assert dots.difference_norm(trained, received, dtype) == norm(whole)
    a = rng.normal(size=(256, 256, 3, 3)).astype(np.float32)
    b = np.asfortranarray(a + 1e-3)
    assert dots.difference_norm(b, a, np.float32) == norm(np.subtract(b, a, dtype=np.float32))
    strided = np.subtract(b[::2], a[::2], dtype=np.float32)
    assert dots.difference_norm(b[::2], a[::2], np.float32) == norm(strided)


def test_a_difference_norm_of_mismatched_or_whole_number_arrays_is_numpys():
    with pytest.raises(ValueError):
        dots.difference_norm(np.ones(BLOCK + 1), np.ones(BLOCK + 2), np.float64)
    ints = np.arange(BLOCK + 5)
    assert dots.difference_norm(ints, ints[::-1], np.int64) == norm(ints - ints[::-1])
