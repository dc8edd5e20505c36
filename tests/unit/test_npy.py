"""read_npy parses each distinct .npy header once; results equal np.load's."""

from __future__ import annotations

from io import BytesIO

import numpy as np
import pytest

from lips_flwr._npy import _parse_header, read_npy


def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = BytesIO()
    if version is None:
        np.save(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


ARRAYS = [
    np.float32(3).reshape(()),
    np.array(7, np.int64),
    np.arange(12, dtype=">f4").reshape(3, 4),
    np.asfortranarray(np.arange(60, dtype=np.float64).reshape(3, 4, 5)),
    np.zeros((0, 3), np.float16),
    np.array([True, False]),
    np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
@pytest.mark.parametrize("version", [None, (1, 0), (2, 0)])
def test_read_npy_equals_np_load(array, version):
    data = npy(array, version)
    for _ in range(2):  # parsed, then from the cache
        got, want = read_npy(data), np.load(BytesIO(data), allow_pickle=False)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.flags.f_contiguous == want.flags.f_contiguous
        assert not got.flags.writeable
        np.testing.assert_array_equal(got, want)


def test_same_header_other_data_reads_the_new_data():
    a, b = np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32)[::-1].copy()
    da, db = npy(a), npy(b)
    assert da[:128] == db[:128]  # one header, two payloads
    np.testing.assert_array_equal(read_npy(da), a)
    np.testing.assert_array_equal(read_npy(db), b)


def test_headers_are_parsed_once():
    data = npy(np.ones((17, 3, 5), np.float32))
    read_npy(data)
    hits = _parse_header.cache_info().hits
    read_npy(data)
    assert _parse_header.cache_info().hits == hits + 1


@pytest.mark.parametrize("cut", [4, 9, 60, -4])
def test_truncated_or_broken_bytes_still_raise_value_error(cut):
    data = npy(np.ones(10, np.float32))
    with pytest.raises(ValueError):
        read_npy(data[:cut])
    with pytest.raises(ValueError):  # again: errors are not cached as results
        read_npy(data[:cut])


def test_garbage_header_raises_and_is_not_cached():
    data = npy(np.ones(4, np.float32))
    bad = data[:10] + data[10:].replace(b"'descr'", b"'dexcr'", 1)
    before = _parse_header.cache_info().currsize
    with pytest.raises(ValueError, match="not a .npy"):
        read_npy(bad)
    assert _parse_header.cache_info().currsize == before


def test_object_arrays_are_refused_from_the_cache_too():
    header = npy(np.ones(2, np.float32)).replace(b"'<f4'", b"'|O' ", 1)
    for _ in range(2):
        with pytest.raises(ValueError, match="object"):
            read_npy(header)


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}-{a.shape}")
def test_record_conversions_equal_flowers_own(array):
    from flwr.app import Array, ArrayRecord

    from lips_flwr._records import array_view, record_to_numpy, record_views

    record = ArrayRecord({"x": Array(np.asarray(array))})
    flower = record["x"].numpy()
    view, copy = array_view(record["x"]), record_to_numpy(record)["x"]
    for got in (view, copy, record_views(record)["x"]):
        assert got.dtype == flower.dtype and got.shape == flower.shape
        np.testing.assert_array_equal(got, flower)
    assert not view.flags.writeable
    assert copy.flags.writeable and not np.shares_memory(copy, view)  # a copy to write, as numpy() gives
    odd = Array(dtype=str(array.dtype), shape=array.shape, stype="torch.Tensor", data=record["x"].data)
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        array_view(odd)
