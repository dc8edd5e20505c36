"""Unit tests for lips_flwr.core.scores."""

from __future__ import annotations

import numpy as np
import pytest

from lips_flwr.core.scores import (
    SCORES,
    compute_score,
    magnitude_score,
    needs_rng,
    needs_update,
    random_score,
    sensitivity_score,
    validate_score,
)


def test_score_names():
    assert SCORES == ("sensitivity", "magnitude", "random")


def test_sensitivity_is_abs_product():
    w = np.array([[1.0, -2.0], [3.0, -0.5]], dtype=np.float32)
    dw = np.array([[-0.5, 0.25], [0.0, -4.0]], dtype=np.float32)
    s = sensitivity_score(w, dw)
    np.testing.assert_array_equal(s, np.abs(w * dw))
    assert (s >= 0).all()
    assert s.shape == w.shape


def test_sensitivity_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        sensitivity_score(np.ones((2, 3)), np.ones((3, 2)))


def test_magnitude_is_abs():
    w = np.array([[-3.0, 0.0, 2.0]], dtype=np.float64)
    np.testing.assert_array_equal(magnitude_score(w), [[3.0, 0.0, 2.0]])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_score_dtype_at_least_float32(dtype):
    w = np.ones((3, 4), dtype=dtype)
    assert magnitude_score(w).dtype == (np.float64 if dtype == np.float64 else np.float32)
    s = sensitivity_score(w, np.ones((3, 4), dtype=dtype))
    assert s.dtype in (np.float32, np.float64)
    assert np.dtype(s.dtype).itemsize >= 4


def test_float16_sensitivity_does_not_underflow():
    # float16 products of ~1e-4 * 1e-5 underflow to 0 in float16
    w = np.array([[1e-4, 2e-4, 3e-4, 4e-4]], dtype=np.float16)
    dw = np.array([[1e-5, 1e-5, 1e-5, 1e-5]], dtype=np.float16)
    assert (w * dw == 0).all()  # the trap the scores avoid
    s = sensitivity_score(w, dw)
    assert (s > 0).all()
    assert len(np.unique(s)) == 4
    assert list(np.argsort(s.ravel())) == [0, 1, 2, 3]


def test_random_score_reproducible_and_in_unit_interval():
    w = np.zeros((5, 7), dtype=np.float16)
    a = random_score(w, np.random.default_rng(3))
    b = random_score(w, np.random.default_rng(3))
    c = random_score(w, np.random.default_rng(4))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == w.shape
    assert ((a >= 0) & (a < 1)).all()


def test_inputs_not_mutated():
    w = np.array([[-1.0, 2.0]], dtype=np.float32)
    dw = np.array([[-3.0, 4.0]], dtype=np.float32)
    w0, dw0 = w.copy(), dw.copy()
    compute_score("sensitivity", w, dw)
    compute_score("magnitude", w)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(dw, dw0)


def test_compute_score_dispatch():
    w = np.array([[1.0, -2.0]])
    dw = np.array([[3.0, 1.0]])
    np.testing.assert_array_equal(compute_score("sensitivity", w, dw), [[3.0, 2.0]])
    np.testing.assert_array_equal(compute_score("magnitude", w), [[1.0, 2.0]])
    r = compute_score("random", w, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(r, np.random.default_rng(0).random(w.shape))


def test_compute_score_missing_inputs():
    w = np.ones((2, 2))
    with pytest.raises(ValueError, match="update"):
        compute_score("sensitivity", w)
    with pytest.raises(ValueError, match="rng"):
        compute_score("random", w)


@pytest.mark.parametrize("bad", ["taylor", "", None, 0, "Magnitude"])
def test_unknown_score(bad):
    with pytest.raises(ValueError, match="score"):
        compute_score(bad, np.ones((2, 2)))
    with pytest.raises(ValueError, match="score"):
        validate_score(bad)


@pytest.mark.parametrize("name", SCORES)
def test_validate_score_ok(name):
    assert validate_score(name) == name


def test_each_score_declares_what_it_needs():
    assert [name for name in SCORES if needs_update(name)] == ["sensitivity"]
    assert [name for name in SCORES if needs_rng(name)] == ["random"]
    with pytest.raises(ValueError, match="score"):
        needs_update("taylor")


def test_sensitivity_score_can_reuse_the_update_array():
    rng = np.random.default_rng(0)
    weights, update = rng.normal(size=(5, 6)), rng.normal(size=(5, 6))
    expected = np.abs(update * weights)
    own = update.copy()
    got = sensitivity_score(weights, own, reuse_update=True)
    assert got is own and got.tobytes() == expected.tobytes()
    # Not into an update it may not write, or of another dtype than the scores'
    read_only = update.copy()
    read_only.flags.writeable = False
    assert sensitivity_score(weights, read_only, reuse_update=True) is not read_only
    narrow = update.astype(np.float32)
    got = sensitivity_score(weights, narrow, reuse_update=True)
    assert got is not narrow and got.dtype == np.float64
    assert sensitivity_score(weights, update.copy()).tobytes() == expected.tobytes()
