"""read_npy parses each distinct .npy header once; results equal np.load's."""

from __future__ import annotations

from io import BytesIO

import numpy as np
import pytest

from flower_fakes import task_identity  # noqa: F401
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


def test_numpy_to_record_keeps_the_arrays_it_builds_and_the_templates_unchanged_ones():
    from flwr.app import Array, ArrayRecord

    from lips_flwr._records import numpy_to_record, record_of

    arrays = {"a": np.ones(3, np.float32), "b": np.arange(4, dtype=np.int64)}
    built = numpy_to_record(arrays)
    flower = ArrayRecord({n: Array(a) for n, a in arrays.items()})
    assert list(built) == ["a", "b"] and all(built[n] == flower[n] for n in arrays)  # fields and bytes
    again = numpy_to_record({"a": np.zeros(3, np.float32)}, template=built, changed=["a"])
    assert again["b"] is built["b"] and again["a"] is not built["a"]  # unchanged: the same object
    assert again["a"].numpy().tolist() == [0.0, 0.0, 0.0] and built["a"].numpy().tolist() == [1.0] * 3
    kept = {"z": Array(np.ones(1)), "y": Array(np.zeros(2))}
    record = record_of(kept)
    assert list(record) == ["z", "y"] and all(record[n] is kept[n] for n in kept)  # Flower's would copy


@pytest.mark.usefixtures("task_identity")
def test_a_clients_received_copy_has_its_own_arrays_over_the_same_bytes():
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    from lips_flwr.experiments.batched.calls import received_copy

    record = ArrayRecord({"w": Array(np.ones(2, np.float32)), "b": Array(np.zeros(1, np.float32))})
    msg = Message(RecordDict({"arrays": record, "config": ConfigRecord({"k": 1})}), 7, "train")
    first, second = received_copy(msg), received_copy(msg)
    for copy in (first, second):
        arrays = copy.content["arrays"]
        assert list(arrays) == ["w", "b"] and all(arrays[n] == record[n] for n in record)
        assert all(arrays[n] is not record[n] and arrays[n].data is record[n].data for n in record)
    first.content["arrays"]["w"].data = Array(np.full(2, 5.0, np.float32)).data  # a mod edits its own
    assert second.content["arrays"]["w"].numpy().tolist() == [1.0, 1.0] == record["w"].numpy().tolist()
    assert first.metadata.dst_node_id == 7 and first.content["config"]["k"] == 1


def test_arrays_and_records_built_at_once_are_what_flowers_constructors_build():
    from flwr.app import Array, ArrayRecord

    from lips_flwr import _records
    from lips_flwr._records import array_of, new_array, record_of

    # On this Flower (CI runs the pinned and the lowest supported) the fast builds are in use.
    assert _records._FAST_ARRAYS and _records._FAST_RECORDS
    fields = {"dtype": "float32", "shape": (2, 3), "stype": "numpy.ndarray", "data": b"\x00" * 24}
    built, flower = new_array(**fields), Array(**fields)
    assert type(built) is Array and list(vars(built).items()) == list(vars(flower).items())
    assert built.object_id == flower.object_id and built.deflate() == flower.deflate()
    made = array_of(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert list(vars(made).items()) == list(vars(Array(np.arange(6, dtype=np.float32).reshape(2, 3))).items())
    arrays = {"a": flower, "b": made}
    by_items = ArrayRecord()
    for name, array in arrays.items():
        by_items[name] = array
    at_once = record_of(arrays)
    assert list(vars(at_once)) == list(vars(by_items)) and at_once == by_items
    assert all(at_once[n] is arrays[n] for n in arrays) and at_once.is_dirty
    assert at_once.object_id == by_items.object_id
    assert list(vars(record_of({}))) == list(vars(ArrayRecord()))
    with pytest.raises(TypeError, match="Key must be of type `str`"):
        record_of({1: flower})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="Value must be of type"):
        record_of({"a": np.ones(2)})  # type: ignore[dict-item]


def test_where_flower_builds_otherwise_its_own_constructors_are_used(monkeypatch):
    from flwr.app import Array

    from lips_flwr import _records

    monkeypatch.setattr(_records, "_FAST_ARRAYS", False)
    monkeypatch.setattr(_records, "_FAST_RECORDS", False)
    fields = {"dtype": "float32", "shape": (1,), "stype": "numpy.ndarray", "data": bytes(4)}
    built = _records.new_array(**fields)
    assert list(vars(built).items()) == list(vars(Array(**fields)).items())
    record = _records.record_of({"a": built})
    assert record["a"] is built and list(record) == ["a"]
    with pytest.raises(TypeError, match="Value must be of type"):
        _records.record_of({"a": 1})  # type: ignore[dict-item]
