"""Unit tests for lips_flwr.core.inertia."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lips_flwr.core.dots import CHUNK
from lips_flwr.core.inertia import cosine_similarity, layer_similarities, update_norms


def test_identical_is_one():
    a = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    assert cosine_similarity(a, a) == pytest.approx(1.0, abs=1e-12)
    assert cosine_similarity(a, a.copy()) == pytest.approx(1.0, abs=1e-12)


def test_scale_invariant_and_antiparallel():
    a = np.array([[1.0, 2.0], [3.0, -4.0]])
    assert cosine_similarity(a, 7.5 * a) == pytest.approx(1.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)


def test_orthogonal_is_zero():
    a = np.array([[1.0, 0.0], [0.0, 0.0]])
    b = np.array([[0.0, 2.0], [0.0, 0.0]])
    assert cosine_similarity(a, b) == 0.0
    x = np.array([1.0, 1.0, 0.0])
    y = np.array([1.0, -1.0, 5.0])
    assert cosine_similarity(x, y) == pytest.approx(0.0, abs=1e-15)


def test_zero_vector_is_zero():
    a = np.zeros((3, 3))
    b = np.ones((3, 3))
    assert cosine_similarity(a, b) == 0.0
    assert cosine_similarity(b, a) == 0.0
    assert cosine_similarity(a, a) == 0.0


def test_known_value_and_return_type():
    a = np.array([1.0, 0.0])
    b = np.array([1.0, 1.0])
    value = cosine_similarity(a, b)
    assert isinstance(value, float)
    assert value == pytest.approx(1 / math.sqrt(2))


def test_float16_accumulated_in_float64():
    # a float16 dot product / norm would overflow (sum of squares > 65504)
    a = np.full((100, 100), 10.0, dtype=np.float16)
    assert cosine_similarity(a, a) == pytest.approx(1.0)
    assert update_norms({"a": a})["a"] == pytest.approx(1000.0)


def test_layer_similarities():
    rng = np.random.default_rng(1)
    ref = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(2, 2)), "c": np.ones(3)}
    cur = {"a": ref["a"] * 2, "b": -ref["b"], "c": np.zeros(3)}
    sims = layer_similarities(cur, ref, ["a", "b"])
    assert list(sims) == ["a", "b"]
    assert sims["a"] == pytest.approx(1.0)
    assert sims["b"] == pytest.approx(-1.0)
    assert layer_similarities(cur, ref, ["c"]) == {"c": 0.0}


def test_update_norms():
    norms = update_norms({"x": np.array([[3.0, 4.0]]), "z": np.zeros((2, 2), dtype=np.float32)})
    assert norms == {"x": pytest.approx(5.0), "z": 0.0}
    assert all(isinstance(v, float) for v in norms.values())
    assert list(norms) == ["x", "z"]
    assert update_norms({}) == {}


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (16, 1, 3, 3), (64, 32, 3, 3)])
def test_update_norms_are_np_linalg_norm_bit_for_bit_up_to_a_chunk_and_its_chunked_sum_beyond(dtype, shape):
    # Beyond CHUNK values np.linalg.norm's BLAS splits the sum over its threads (the last bits then
    # depend on the machine's cores); ours sums CHUNK-value dots in order, in the calling thread.
    rng = np.random.default_rng(7)
    update = (rng.normal(size=shape) * 1e-3).astype(dtype)
    for u in (update, np.asfortranarray(update), np.repeat(update.reshape(-1), 2)[::2]):  # (strided too)
        # The values in C order as one contiguous float64 vector, as np.linalg.norm ravels them: a dot of
        # a strided view runs another BLAS kernel, whose last bits may differ (OpenBLAS 0.3.23, AVX-512).
        flat = np.ascontiguousarray(u, dtype=np.float64).reshape(-1)
        expected = float(np.linalg.norm(flat))
        if flat.size <= CHUNK:
            assert update_norms({"layer": u}) == {"layer": expected}
        else:
            parts = np.split(flat, range(CHUNK, flat.size, CHUNK))
            chunked = math.sqrt(sum(float(np.dot(part, part)) for part in parts))
            assert update_norms({"layer": u}) == {"layer": chunked}
            assert chunked == pytest.approx(expected, rel=1e-14)
