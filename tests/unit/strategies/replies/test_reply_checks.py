"""The flwr-free reply checks shared by both strategy adapters (lips_flwr.strategies.replies.checks)."""

from __future__ import annotations

import ast
import io
import math
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lips_flwr._npy import read_npy
from lips_flwr.core.checks import all_finite, names_problem, nonfinite_arrays
from lips_flwr.strategies.replies.checks import (
    MISSING,
    model_shapes,
    num_examples_problem,
    reply_problem,
    serialization_problem,
)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def npy(array: np.ndarray, version=None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("module", ["lips_flwr.strategies.replies.checks", "lips_flwr._npy",
                                    "lips_flwr.core.checks"])
def test_flwr_free(module):
    source = open(sys.modules[module].__file__).read()
    imports = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in imports for a in n.names] + [n.module or "" for n in imports
                                                          if isinstance(n, ast.ImportFrom)]
    assert not any(name.split(".")[0] == "flwr" for name in names)


@SETTINGS
@given(
    array=hnp.arrays(
        dtype=st.sampled_from([np.float16, np.float32, np.float64, np.int8, np.int64,
                               np.uint8, np.bool_, np.dtype(">f4"), np.complex64]),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    ),
    fortran=st.booleans(),
    version=st.sampled_from([None, (1, 0), (2, 0), (3, 0)]),
)
def test_read_npy_equals_np_load_without_copying(array, fortran, version):
    if fortran:
        array = np.asfortranarray(array)
    data = npy(array, version)
    view = read_npy(data)
    expected = np.load(io.BytesIO(data), allow_pickle=False)
    assert view.shape == expected.shape and view.dtype == expected.dtype
    np.testing.assert_array_equal(view, expected)
    if version != (3, 0) and array.size:
        assert not view.flags.writeable  # a view of the immutable bytes, not a copy
        assert np.shares_memory(view, np.frombuffer(data, np.uint8))


@pytest.mark.parametrize(
    "data",
    [b"", b"not an array", npy(np.ones((4, 4), np.float32))[:-8],
     npy(np.ones(3))[:20], b"\x93NUMPY\x01\x00"],
    ids=["empty", "garbage", "truncated-data", "truncated-header", "magic-only"],
)
def test_read_npy_rejects_unreadable_bytes(data):
    with pytest.raises(ValueError):
        read_npy(data)


def test_read_npy_rejects_object_arrays():
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="object arrays are not allowed"):
        read_npy(buffer.getvalue())


# Exactly representable, and their squares overflow (hypothesis refuses a value the dtype rounds).
_F32_MAX = float(np.finfo(np.float32).max)
_HUGE = {np.float32: [_F32_MAX, -_F32_MAX, 2.0 ** 64], np.float64: [1.7e308, -1e200, 2.0 ** 512]}


@SETTINGS
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]), fortran=st.booleans())
def test_all_finite_is_isfinite_all_even_where_the_dot_product_overflows(data, dtype, fortran):
    array = data.draw(hnp.arrays(
        dtype=dtype,
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=8),
        elements=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                           st.sampled_from([*_HUGE[dtype], 0.0, -0.0])),
    ))
    array = np.asfortranarray(array) if fortran else array
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning escapes the dot product
        assert all_finite(array) == bool(np.isfinite(array).all())
        if array.ndim:
            assert all_finite(array[::2]) == bool(np.isfinite(array[::2]).all())


@SETTINGS
@given(
    array=hnp.arrays(
        dtype=st.sampled_from([np.float16, np.float32, np.float64]),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=8),
        elements=st.floats(allow_nan=True, allow_infinity=True, width=16),
    ),
)
def test_nonfinite_detection_matches_isfinite(array):
    model = {"w": array, "i": np.arange(4)}
    expected = [] if np.isfinite(array).all() else ["w"]
    assert nonfinite_arrays(model) == expected
    reason = reply_problem({"w": array.shape, "i": (4,)}, {"w": npy(array), "i": npy(np.arange(4))})
    assert (reason is None) == (not expected)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (10, None), (0.5, None), (2**53, None),
        (MISSING, "no 'num-examples' in its metrics"),
        (0, "'num-examples' is 0: it must be > 0 and <= 2**53"),
        (-1, "'num-examples' is -1"),
        (2**53 + 1, "must be > 0 and <= 2**53"),
        (math.nan, "'num-examples' is nan"),
        (-math.inf, "'num-examples' is -inf"),
        (True, "'num-examples' is True, not a number"),
        ("10", "'num-examples' is '10', not a number"),
        ([1, 2], "not a number"),
    ],
)
def test_num_examples_problem(value, problem):
    got = num_examples_problem(value)
    assert got is None if problem is None else problem in got


def test_reply_problem_order_and_texts():
    expected = {"w": (2, 2), "b": (2,)}
    good = {"w": npy(np.ones((2, 2), np.float32)), "b": npy(np.zeros(2, np.float32))}
    assert reply_problem(expected, good) is None  # the weight is the gate's (num_examples_problem)
    assert reply_problem(expected, {**good, "b": b"junk"}).startswith("array 'b' is unreadable")
    assert reply_problem(expected, {"w": good["w"]}) == "missing arrays ['b']"
    assert reply_problem(expected, {**good, "w": npy(np.ones(4, np.float32))}) == \
        "array 'w' has shape (4,), expected (2, 2)"
    assert reply_problem(expected, {**good, "b": npy(np.array(["a", "b"]))}) == \
        "array 'b' has dtype <U1, not a real number type"
    assert num_examples_problem(-3, "num_examples") == \
        "'num_examples' is -3: it must be > 0 and <= 2**53"
    nan = npy(np.array([[1, np.nan], [np.inf, 0]], np.float32))
    assert reply_problem(expected, {**good, "w": nan}) == "NaN or Inf in arrays ['w']"
    assert reply_problem(expected, {**good, "w": nan}, finite=False) is None  # the NaN/Inf pass skipped
    # other real dtypes are accepted: Flower's own aggregation changes them
    drift = {"w": npy(np.ones((2, 2), np.float64)), "b": npy(np.zeros(2, np.int64))}
    assert reply_problem(expected, drift) is None


def test_model_shapes_serialization_and_names():
    assert model_shapes({"a": npy(np.ones((3, 1))), "s": npy(np.array(5))}) == {"a": (3, 1), "s": ()}
    assert serialization_problem({"a": "numpy.ndarray"}) is None
    assert serialization_problem({"a": "numpy.ndarray", "b": "torch"}) == \
        "array 'b' is serialized as 'torch', expected 'numpy.ndarray'"
    assert names_problem({"bn.running_mean": np.ones(3), "bn.num_batches_tracked": np.array(1),
                          "conv.weight": np.ones((2, 2, 3, 3))}) is None
    assert names_problem({"bn.running_var": np.ones((2, 2, 3, 3))}) == \
        "'bn.running_var' names an array of shape (2, 2, 3, 3) (expected rank 1)"
    assert names_problem({"bn.num_batches_tracked": np.ones(4)}) == \
        "'bn.num_batches_tracked' names an array of shape (4,) (expected rank 0)"
