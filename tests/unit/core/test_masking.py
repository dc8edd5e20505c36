"""Unit tests for lips_flwr.core.masking."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from lips_flwr.core.masking import (
    kth_smallest, lowest_indices, lowest_mask, mask_layers, mask_lowest, model_update, num_zeros, zero_where,
)
from lips_flwr.core.masking import _SAMPLE_SIZE, _bracket, _bracketed_lowest
from lips_flwr.core.schedule import MaskSchedule

FLOATS = [np.float16, np.float32, np.float64]


def reference_positions(weights: np.ndarray, scores: np.ndarray, k: int) -> set[int]:
    """Brute force: stable argsort, already-zero weights first, NaN scores last."""
    flat_w = np.asarray(weights).reshape(-1)
    flat_s = np.asarray(scores, dtype=np.float64).reshape(-1)
    zero_first = np.where(flat_w == 0, -np.inf, flat_s)
    return set(np.argsort(zero_first, kind="stable")[:k].tolist())


def zero_positions(array: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.asarray(array).reshape(-1) == 0).tolist())


# --------------------------------------------------------------------------- num_zeros
@pytest.mark.parametrize(
    "n,tau,expected",
    [
        (100, 0.07, 7),  # 100 * 0.07 == 7.000000000000001
        (10, 0.3, 3),  # 10 * 0.3 == 3.0000000000000004
        (100, 0.29, 29),  # 100 * 0.29 == 28.999999999999996
        (1000, 0.035, 35),
        (10**8, 0.07, 7_000_000),  # 7000000.000000001: noise on a large tensor
        (10, 0.11, 2),
        (10, 0.5, 5),
        (9, 0.5, 5),
        (1, 0.5, 1),
        (3, 0.0001, 1),
        (10, 1e-12, 1),  # any tau > 0 zeroes something: ceil(1e-11) == 1
        (10, 5e-324, 1),
        (7, 1.0, 7),
        (7, 0.999999, 7),
        (2359296, 0.35, 825754),  # 825753.6
        (64, 0.0, 0),
        (0, 0.5, 0),
        (5, 2.0, 5),  # clamped to size
    ],
)
def test_num_zeros(n, tau, expected):
    assert num_zeros(n, tau) == expected


@pytest.mark.parametrize("tau0", [0.5, 0.7, 0.3, 0.45])
@pytest.mark.parametrize("num_rounds", [7, 40, 300])
def test_num_zeros_matches_exact_ceil_on_schedule_taus(tau0, num_rounds):
    """ceil(n * tau(t)) computed exactly from the decimal tau0 and t/T."""
    sched = MaskSchedule(num_rounds=num_rounds, tau0=tau0, every=1)
    exact_tau0 = Fraction(str(tau0))
    sizes = [1, 3, 7, 100, 576, 600, 1000, 4608, 36864, 147456, 2359296]
    for server_round in sched.mask_rounds():
        t = server_round - 1
        exact = exact_tau0 * (1 - Fraction(t, num_rounds))
        tau = sched.tau(server_round)
        for n in sizes:
            assert num_zeros(n, tau) == math.ceil(n * exact), (n, tau, server_round)


# --------------------------------------------------------------------------- lowest_indices
def test_lowest_indices_basic_sorted_output():
    s = np.array([5.0, 1.0, 4.0, 0.5, 3.0])
    idx = lowest_indices(s, 3)
    assert idx.tolist() == [1, 3, 4]  # ascending index order, not score order
    assert idx.dtype == np.intp


def test_lowest_indices_ties_go_to_lowest_positions():
    s = np.array([2.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    assert lowest_indices(s, 1).tolist() == [3]
    assert lowest_indices(s, 2).tolist() == [1, 3]
    assert lowest_indices(s, 3).tolist() == [1, 2, 3]
    assert lowest_indices(np.ones(10), 4).tolist() == [0, 1, 2, 3]


def test_lowest_indices_nan_ranks_highest():
    s = np.array([np.nan, 3.0, np.nan, 1.0, 2.0])
    assert lowest_indices(s, 3).tolist() == [1, 3, 4]
    assert lowest_indices(s, 4).tolist() == [0, 1, 3, 4]  # first NaN by index
    assert lowest_indices(np.full(4, np.nan), 2).tolist() == [0, 1]


def test_lowest_indices_edges():
    s = np.array([[3.0, 2.0], [1.0, 0.0]])
    assert lowest_indices(s, 0).tolist() == []
    assert lowest_indices(s, -1).tolist() == []
    assert lowest_indices(s, 4).tolist() == [0, 1, 2, 3]
    assert lowest_indices(s, 9).tolist() == [0, 1, 2, 3]
    assert lowest_indices(s, 1).tolist() == [3]  # flat index of a 2-D array


def test_lowest_indices_matches_reference_with_heavy_ties():
    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(1, 300))
        s = rng.integers(0, 4, size=n).astype(np.float64)
        s[rng.random(n) < 0.1] = np.nan
        for k in {0, 1, n // 3, n // 2, n - 1, n}:
            expected = sorted(np.argsort(s, kind="stable")[:k].tolist()) if k > 0 else []
            assert lowest_indices(s, k).tolist() == expected


# --------------------------------------------------------------------------- mask_lowest
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(10, 10), (4, 3, 3, 3), (1, 7), (13, 1, 1, 1), (2, 2, 2)])
@pytest.mark.parametrize("tau", [0.07, 0.1, 0.25, 0.5, 0.7, 0.99, 1.0])
def test_mask_lowest_exact_count_and_positions(dtype, shape, tau):
    rng = np.random.default_rng(0)
    w = rng.normal(size=shape).astype(dtype)
    w[w == 0] = 1  # no pre-existing zeros in this test
    scores = np.abs(w.astype(np.float64))
    w_copy = w.copy()
    masked, k = mask_lowest(w, scores, tau)
    n = w.size
    assert k == num_zeros(n, tau)
    assert int((masked == 0).sum()) == k
    assert zero_positions(masked) == reference_positions(w, scores, k)
    assert masked.dtype == dtype
    assert masked.shape == shape
    np.testing.assert_array_equal(w, w_copy)  # input not mutated
    keep = masked != 0
    np.testing.assert_array_equal(masked[keep], w[keep])  # survivors unchanged


def test_mask_lowest_count_100_at_007_is_7():
    w = np.arange(1, 101, dtype=np.float32).reshape(10, 10)
    masked, k = mask_lowest(w, np.abs(w), 0.07)
    assert k == 7
    assert zero_positions(masked) == set(range(7))


def test_mask_lowest_tau_zero_returns_same_object():
    w = np.ones((3, 3), np.float32)
    masked, k = mask_lowest(w, np.ones((3, 3)), 0.0)
    assert masked is w
    assert k == 0


def test_mask_lowest_already_zero_weights_rank_first():
    w = np.array([[5.0, 0.0, 1.0, 2.0, 0.0, 3.0]], dtype=np.float32)
    scores = np.array([[0.1, 9.0, 0.2, 0.3, 8.0, 0.4]])  # zeros have the highest scores
    masked, k = mask_lowest(w, scores, 0.5)
    assert k == 3
    assert zero_positions(masked) == {1, 4, 0}


def test_mask_lowest_already_zero_beat_negative_scores():
    # mask_lowest promises already-zero weights rank below every other entry
    w = np.array([1.0, 0.0, 2.0, 3.0])
    masked, _ = mask_lowest(w, np.array([-5.0, 1.0, -3.0, 0.0]), 0.5)
    assert zero_positions(masked) == {1, 0}


def test_mask_lowest_more_zeros_than_k_keeps_zero_set():
    w = np.array([0.0, 1.0, 0.0, 0.0, 2.0, 3.0])
    masked, k = mask_lowest(w, np.abs(w), 0.34)  # k = ceil(2.04) = 3
    assert k == 3
    np.testing.assert_array_equal(masked, w)


def test_mask_lowest_negative_zero_counts_as_zero():
    w = np.array([1.0, -0.0, 2.0, 3.0], dtype=np.float32)
    masked, k = mask_lowest(w, np.array([0.0, 5.0, 1.0, 2.0]), 0.25)
    assert k == 1
    assert zero_positions(masked) == {1}


def test_mask_lowest_ties_broken_by_lowest_index():
    w = np.ones((4, 5), dtype=np.float32)
    masked, k = mask_lowest(w, np.ones((4, 5)), 0.3)
    assert k == 6
    assert zero_positions(masked) == set(range(6))
    # deterministic: same again
    again, _ = mask_lowest(w, np.ones((4, 5)), 0.3)
    np.testing.assert_array_equal(masked, again)


def test_mask_lowest_tie_at_threshold():
    w = np.arange(1, 9, dtype=np.float64)
    scores = np.array([3.0, 1.0, 2.0, 2.0, 0.5, 2.0, 9.0, 2.0])
    masked, k = mask_lowest(w, scores, 0.5)  # k = 4: 0.5, 1.0, then two of the 2.0s
    assert zero_positions(masked) == {4, 1, 2, 3}


def test_mask_lowest_nan_scores_rank_highest():
    w = np.arange(1, 7, dtype=np.float32)
    scores = np.array([np.nan, 1.0, np.nan, 2.0, 0.5, np.nan])
    masked, k = mask_lowest(w, scores, 0.5)
    assert zero_positions(masked) == {1, 3, 4}
    masked, k = mask_lowest(w, scores, 0.8)  # k = 5: all finite + first two NaN
    assert zero_positions(masked) == {0, 1, 2, 3, 4}
    assert zero_positions(masked) == reference_positions(w, scores, k)


def test_mask_lowest_nan_weights_magnitude():
    w = np.array([np.nan, 1.0, 2.0, np.nan], dtype=np.float32)
    masked, k = mask_lowest(w, np.abs(w), 0.5)
    assert zero_positions(masked) == {1, 2}
    assert np.isnan(masked[[0, 3]]).all()


@pytest.mark.parametrize("dtype", FLOATS)
def test_mask_lowest_non_contiguous_input(dtype):
    base = np.arange(1, 49, dtype=dtype).reshape(6, 8)
    views = [base.T, base[:, ::2], np.asfortranarray(base)]
    for w in views:
        w_copy = w.copy()
        masked, k = mask_lowest(w, np.abs(w.astype(np.float64)), 0.25)
        assert masked.shape == w.shape and masked.dtype == w.dtype
        assert zero_positions(masked) == reference_positions(w, np.abs(w), k)
        np.testing.assert_array_equal(w, w_copy)
    np.testing.assert_array_equal(base, np.arange(1, 49, dtype=dtype).reshape(6, 8))


def test_mask_lowest_full_mask():
    w = np.arange(1, 10, dtype=np.float16).reshape(3, 3)
    masked, k = mask_lowest(w, np.abs(w), 1.0)
    assert k == 9
    assert (masked == 0).all()
    assert masked.dtype == np.float16


@pytest.mark.parametrize("n,tau,k", [(100, 0.07, 7), (10, 0.3, 3), (100, 0.29, 29), (50, 0.5, 25)])
def test_mask_lowest_float_noise_counts(n, tau, k):
    w = np.linspace(1, 2, n).reshape(1, n)
    masked, placed = mask_lowest(w, np.abs(w), tau)
    assert placed == k
    assert int((masked == 0).sum()) == k


# --------------------------------------------------------------------------- model_update
def test_model_update():
    new = {"a": np.array([[3.0, 1.0]], np.float32), "b": np.ones((2, 2)), "c": np.ones(2)}
    old = {"a": np.array([[1.0, 2.0]], np.float32), "b": np.zeros((2, 2)), "c": np.zeros(2)}
    upd = model_update(new, old, ["a", "b"])
    assert list(upd) == ["a", "b"]
    np.testing.assert_array_equal(upd["a"], [[2.0, -1.0]])
    assert upd["a"].dtype == np.float32
    assert upd["b"].dtype == np.float64


def test_model_update_float16_is_widened():
    new = {"a": np.array([[1.0009765625]], np.float16)}
    old = {"a": np.array([[1.0]], np.float16)}
    upd = model_update(new, old, ["a"])
    assert upd["a"].dtype == np.float32
    assert upd["a"][0, 0] == pytest.approx(0.0009765625)


# --------------------------------------------------------------------------- mask_layers
def make_model(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "stem.weight": rng.normal(size=(4, 3, 3, 3)).astype(dtype),
        "stem.bias": rng.normal(size=4).astype(dtype),
        "bn.running_mean": rng.normal(size=4).astype(dtype),
        "bn.num_batches_tracked": np.array(7, np.int64),
        "mid.weight": rng.normal(size=(8, 4, 3, 3)).astype(dtype),
        "mid2.weight": rng.normal(size=(8, 8, 1, 1)).astype(dtype),
        "head.weight": rng.normal(size=(10, 8)).astype(dtype),
        "head.bias": rng.normal(size=10).astype(dtype),
    }


MID = ["mid.weight", "mid2.weight"]


def test_sparsify_tau_zero_is_identity():
    model = make_model()
    out, zeros = mask_layers(model, MID, 0.0, score="magnitude")
    assert zeros == {}
    assert list(out) == list(model)
    assert all(out[k] is model[k] for k in model)
    assert out is not model  # a new dict, the caller's dict is not handed back


def test_sparsify_unselected_are_same_objects_and_order_kept():
    model = make_model()
    copies = {k: v.copy() for k, v in model.items()}
    out, zeros = mask_layers(model, MID, 0.3, score="magnitude")
    assert list(out) == list(model)
    for name in model:
        if name in MID:
            assert out[name] is not model[name]
        else:
            assert out[name] is model[name]
    assert zeros == {n: num_zeros(model[n].size, 0.3) for n in MID}
    for name in model:  # nothing mutated
        np.testing.assert_array_equal(model[name], copies[name])


def test_sparsify_zero_counts_and_positions_magnitude():
    model = make_model()
    out, zeros = mask_layers(model, MID, 0.45, score="magnitude")
    for name in MID:
        k = num_zeros(model[name].size, 0.45)
        assert zeros[name] == k
        assert int((out[name] == 0).sum()) == k
        assert zero_positions(out[name]) == reference_positions(model[name], np.abs(model[name]), k)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sparsify_preserves_dtype_and_shape(dtype):
    model = make_model(dtype)
    updates = {n: np.ones_like(model[n]) for n in MID}
    for score in ("sensitivity", "magnitude", "random"):
        out, _ = mask_layers(model, MID, 0.5, score=score, updates=updates, seed=1)
        for name in model:
            assert out[name].dtype == model[name].dtype
            assert out[name].shape == model[name].shape


def test_sparsify_layer_order_does_not_matter_for_key_order():
    model = make_model()
    out, zeros = mask_layers(model, ["mid2.weight", "mid.weight"], 0.2, score="magnitude")
    assert list(out) == list(model)
    assert list(zeros) == ["mid2.weight", "mid.weight"]


def test_sparsify_sensitivity_vs_magnitude_choose_differently():
    w = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    dw = np.array([[4.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    model = {"w": w}
    by_mag, _ = mask_layers(model, ["w"], 0.25, score="magnitude")
    by_sens, _ = mask_layers(model, ["w"], 0.25, score="sensitivity", updates={"w": dw})
    # |w| = 1, 2, 3, 4 -> zero index 0; |dw*w| = 4, 2, 3, 4 -> zero index 1
    assert zero_positions(by_mag["w"]) == {0}
    assert zero_positions(by_sens["w"]) == {1}


def test_sparsify_sensitivity_matches_reference():
    rng = np.random.default_rng(3)
    model = make_model(seed=3)
    updates = {n: rng.normal(size=model[n].shape).astype(np.float32) for n in MID}
    out, zeros = mask_layers(model, MID, 0.6, score="sensitivity", updates=updates)
    for name in MID:
        scores = np.abs(updates[name].astype(np.float64) * model[name].astype(np.float64))
        assert zero_positions(out[name]) == reference_positions(model[name], scores, zeros[name])


def test_sparsify_float16_sensitivity_does_not_collapse_to_ties():
    # every product |dw * w| underflows to 0 in float16; ranked in float32 they differ
    w = np.array([[4e-4, 3e-4, 2e-4, 1e-4, 5e-4, 6e-4]], dtype=np.float16)
    dw = np.full_like(w, 1e-5)
    assert ((w * dw) == 0).all()
    out, zeros = mask_layers({"w": w}, ["w"], 0.5, score="sensitivity", updates={"w": dw})
    assert zeros == {"w": 3}
    assert zero_positions(out["w"]) == {1, 2, 3}  # the three smallest, not indices 0-2
    assert out["w"].dtype == np.float16


def test_sparsify_float16_weights_with_float32_update():
    w = (np.arange(1, 17, dtype=np.float16) * np.float16(1e-3)).reshape(4, 4)
    dw = (np.arange(16, 0, -1, dtype=np.float32) ** 2 * 1e-7).reshape(4, 4)
    out, zeros = mask_layers({"w": w}, ["w"], 0.25, score="sensitivity", updates={"w": dw})
    scores = np.abs(dw.astype(np.float64) * w.astype(np.float64))
    assert zero_positions(out["w"]) == reference_positions(w, scores, 4)


def test_sparsify_random_deterministic_and_salted():
    model = {"w": np.arange(1, 401, dtype=np.float32).reshape(20, 20)}
    a, _ = mask_layers(model, ["w"], 0.5, score="random", seed=7, salt=(3,))
    b, _ = mask_layers(model, ["w"], 0.5, score="random", seed=7, salt=(3,))
    c, _ = mask_layers(model, ["w"], 0.5, score="random", seed=7, salt=(4,))
    d, _ = mask_layers(model, ["w"], 0.5, score="random", seed=8, salt=(3,))
    np.testing.assert_array_equal(a["w"], b["w"])
    assert zero_positions(a["w"]) != zero_positions(c["w"])
    assert zero_positions(a["w"]) != zero_positions(d["w"])
    for out in (a, c, d):
        assert int((out["w"] == 0).sum()) == 200


def test_sparsify_random_matches_documented_rng():
    model = {"a": np.ones((10, 10), np.float32), "b": np.ones((5, 8), np.float32)}
    out, _ = mask_layers(model, ["a", "b"], 0.3, score="random", seed=11, salt=(2, 9))
    for index, name in enumerate(["a", "b"]):
        scores = np.random.default_rng([11, 2, 9, index]).random(model[name].shape)
        k = num_zeros(model[name].size, 0.3)
        assert zero_positions(out[name]) == reference_positions(model[name], scores, k)


def test_sparsify_random_independent_of_history():
    model = {"w": np.ones((30, 30), np.float32)}
    a, _ = mask_layers(model, ["w"], 0.4, score="random", seed=1, salt=(5,))
    np.random.default_rng(123).random(1000)
    np.random.seed(0)
    np.random.random(77)
    b, _ = mask_layers(model, ["w"], 0.4, score="random", seed=1, salt=(5,))
    np.testing.assert_array_equal(a["w"], b["w"])


def test_sparsify_full_tau():
    model = make_model()
    out, zeros = mask_layers(model, MID, 1.0, score="magnitude")
    for name in MID:
        assert (out[name] == 0).all()
        assert zeros[name] == model[name].size


@pytest.mark.parametrize("tau", [-0.1, 1.01, float("nan"), float("inf")])
def test_sparsify_bad_tau(tau):
    with pytest.raises(ValueError, match="tau"):
        mask_layers(make_model(), MID, tau, score="magnitude")


def test_sparsify_sensitivity_needs_updates():
    model = make_model()
    with pytest.raises(ValueError, match="update"):
        mask_layers(model, MID, 0.5, score="sensitivity")
    with pytest.raises(ValueError, match="update"):
        mask_layers(model, MID, 0.5, score="sensitivity", updates={"mid.weight": np.ones((8, 4, 3, 3))})


def test_sparsify_unknown_score():
    with pytest.raises(ValueError, match="score"):
        mask_layers(make_model(), MID, 0.5, score="taylor")


def test_sparsify_empty_layers():
    model = make_model()
    out, zeros = mask_layers(model, [], 0.5, score="magnitude")
    assert zeros == {}
    assert all(out[k] is model[k] for k in model)


def test_sparsify_already_sparse_weights_stay_zero():
    model = make_model()
    w = model["mid.weight"].copy()
    w.reshape(-1)[::3] = 0  # 96 of 288 already zero
    model["mid.weight"] = w
    out, zeros = mask_layers(model, ["mid.weight"], 0.25, score="magnitude")  # k = 72 < 96
    np.testing.assert_array_equal(out["mid.weight"], w)
    out, zeros = mask_layers(model, ["mid.weight"], 0.5, score="magnitude")  # k = 144
    assert int((out["mid.weight"] == 0).sum()) == 144
    assert zero_positions(w) <= zero_positions(out["mid.weight"])


# ------------------------------------------------- mask_lowest: the branch-free zeroing
def _mask_lowest_by_indices(weights, scores, tau):
    """The straightforward implementation: a copy, then fancy-index assignment."""
    k = num_zeros(weights.size, tau)
    if k == 0:
        return weights, 0
    scores = np.where(weights == 0, -np.inf, scores)
    masked = np.array(weights, copy=True, order="C")
    masked.reshape(-1)[lowest_indices(scores, k)] = 0
    return masked, k


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4", ">f8", np.longdouble])
@pytest.mark.parametrize("tau", [0.01, 0.3, 0.5, 1.0])
def test_mask_lowest_is_bitwise_equal_to_index_assignment(dtype, tau):
    rng = np.random.default_rng(7)
    weights = rng.normal(size=(6, 5, 3, 3)).astype(dtype)
    flat = weights.reshape(-1)
    flat[::11] = 0
    flat[1::13] = -0.0
    flat[2::17] = np.nan
    flat[3::19] = -np.inf
    flat[4::23] = 1e-30  # subnormal in float32, 0 in float16
    scores = np.abs(rng.normal(size=weights.shape))
    scores.reshape(-1)[5::7] = 0.25  # ties
    for w in (weights, weights.transpose(2, 0, 3, 1)):  # contiguous and not
        s = scores.transpose(2, 0, 3, 1) if w is not weights else scores
        got, k = mask_lowest(w, s, tau)
        want, k_want = _mask_lowest_by_indices(w, s, tau)
        assert k == k_want and got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.c_contiguous
        assert got.tobytes() == want.tobytes()  # bit for bit: NaN payloads, -0.0, +0.0


# --------------------------------------------- kth_smallest: sampled bracket, exact result
def _large_score_arrays():
    rng = np.random.default_rng(3)
    n = 50_000
    normal = np.abs(rng.normal(size=n)).astype(np.float32)
    with_nan = normal.copy()
    with_nan[rng.integers(0, n, 5_000)] = np.nan
    mostly_nan = np.full(n, np.nan)
    mostly_nan[:100] = 1.0
    zeros_first = normal.copy()
    zeros_first[: n // 2] = -np.inf  # already-zero weights rank -inf
    periodic = np.tile(np.arange(6, dtype=np.float64), n // 6)  # aliased with the stride
    return {
        "normal": normal,
        "with nan": with_nan,
        "mostly nan": mostly_nan,
        "half -inf": zeros_first,
        "sorted": np.sort(normal),
        "reversed": np.sort(normal)[::-1].copy(),
        "periodic": periodic,
        "constant": np.ones(n, np.float32),
        "few values": rng.integers(0, 3, n).astype(np.float32),
        "random f64": rng.random(n),
        "int scores": rng.integers(-5, 5, n),
    }


@pytest.mark.parametrize("name", list(_large_score_arrays()))
def test_kth_smallest_equals_partition(name):
    flat = _large_score_arrays()[name]
    n = flat.size
    for kth in (0, 1, n // 100, n // 10, n // 3, n // 2, n - 101, n - 1):
        got, want = kth_smallest(flat, kth), np.partition(flat, kth)[kth]
        assert (np.isnan(got) and np.isnan(want)) or got == want, (name, kth)


@pytest.mark.parametrize("name", ["normal", "with nan", "half -inf", "few values", "periodic"])
def test_lowest_indices_large_match_stable_argsort(name):
    flat = _large_score_arrays()[name]
    for k in (1, flat.size // 7, flat.size // 2):
        expected = np.sort(np.argsort(flat, kind="stable")[:k])  # NaN sorts last
        np.testing.assert_array_equal(lowest_indices(flat, k), expected)


def _plain_lowest_mask(flat, k):
    """lowest_mask's definition, written out: the k-th smallest by a full partition, the entries
    below it, then the ties at the lowest positions (NaN last)."""
    threshold = np.partition(flat, k - 1)[k - 1]
    if np.isnan(threshold):
        chosen, ties = ~np.isnan(flat), np.isnan(flat)
    else:
        chosen, ties = flat < threshold, flat == threshold
    chosen[np.flatnonzero(ties)[: k - int(np.count_nonzero(chosen))]] = True
    return chosen


@pytest.mark.parametrize("name", list(_large_score_arrays()))
def test_lowest_mask_within_the_bracket_is_the_plain_mask(name):
    """The large-array path (issue 36: two passes fewer) gives the plain path's mask, bit for bit."""
    flat = _large_score_arrays()[name]
    n = flat.size
    for k in (1, 2, n // 100, n // 10, n // 3, n // 2, n // 2 + 1, n - 100, n - 1):
        got = lowest_mask(flat, k)
        assert got.dtype == bool and int(np.count_nonzero(got)) == k, (name, k)
        np.testing.assert_array_equal(got, _plain_lowest_mask(flat, k), err_msg=f"{name} k={k}")
    if name != "mostly nan":  # (its sample's ranks are NaN: the plain path)
        assert _bracketed_lowest(flat, n // 3) is not None, name  # the bracket path is the one tested


def _one_call_bracket(flat, kth):
    """_bracket as it was before 2026-12-05: both sample ranks in one np.partition call."""
    sample = flat[:: max(flat.size // _SAMPLE_SIZE, 16)]
    m = sample.size
    at, margin = kth * m // flat.size, 2 * math.isqrt(m) + 2
    ranks = (max(at - margin, 0), min(at + margin, m - 1))
    sample = np.partition(sample, ranks)
    return sample[ranks[0]], sample[ranks[1]]


@pytest.mark.parametrize("name", list(_large_score_arrays()))
def test_bracket_by_two_partitions_is_the_one_call_bracket(name):
    """Each rank by its own partition (6x faster in numpy 2.4) gives the same two values, NaN last."""
    flat = _large_score_arrays()[name]
    n = flat.size
    for kth in (0, 1, n // 100, n // 3, n // 2, n - 101, n - 1):
        got, want = _bracket(flat, kth), _one_call_bracket(flat, kth)
        for g, w in zip(got, want):
            assert (np.isnan(g) and np.isnan(w)) or g == w, (name, kth)


@pytest.mark.parametrize("dtype", [*FLOATS, np.int8, np.int64, np.complex128, bool])
def test_zero_where_is_np_where_bit_for_bit(dtype):
    rng = np.random.default_rng(5)
    weights = (rng.normal(size=(6, 7)) * 50).astype(dtype)
    if np.dtype(dtype).kind == "f":
        weights.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
    mask = rng.random((6, 7)) < 0.4
    expected = np.where(mask, np.zeros_like(weights), weights)
    for given in (mask, mask.reshape(-1)):
        out = zero_where(weights, given)
        assert out.dtype == weights.dtype and out.shape == weights.shape
        assert out.tobytes() == expected.tobytes()
    assert zero_where(weights[:, ::2], mask[:, ::2]).tobytes() == np.where(
        mask[:, ::2], 0, weights[:, ::2]).astype(dtype).tobytes()
