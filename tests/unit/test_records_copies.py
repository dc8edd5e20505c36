"""Records copied and built in one process (issue 39): Flower's values, without its per-item checks.

A ClientApp call on the batched Grid copied its message's config record
through Flower's constructor (each item checked again) and parsed a reply's
Arrays once in each of its readers (LIPS, FedBN, the state files). The
copies and the replies' Arrays below hold what Flower's would, faster.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, MetricRecord

from lips_flwr import _records
from lips_flwr._records import (
    ViewedArray,
    array_of,
    array_view,
    numpy_to_record,
    record_copy,
    record_dict,
    viewed_array_of,
)

CONFIG = {"server-round": 3, "lips-tau": 0.25, "lips-layers": [1, 2], "name": "x", "raw": b"\x00", "on": True}
METRICS = {"loss": 0.5, "num-examples": 10, "per-class": [0.1, 0.2]}


@pytest.mark.parametrize("record", [ConfigRecord(CONFIG), MetricRecord(METRICS)], ids=["config", "metric"])
def test_a_record_copy_is_what_flowers_constructor_makes_of_its_items(record):
    assert _records._FAST_COPIES  # on this Flower (CI runs the pinned and the lowest supported)
    copy, flower = record_copy(record), type(record)(dict(record.items()))
    assert type(copy) is type(record) and copy == flower == record
    assert list(vars(copy)) == list(vars(flower)) and list(copy.items()) == list(flower.items())
    assert all(copy[k] is record[k] for k in record)  # the same value objects, as Flower's copy
    assert copy.object_id == flower.object_id
    copy["added"] = 1  # a copy of its own: the original does not change
    assert "added" not in record
    assert copy.object_id != record.object_id  # (record cached its id: the copy does not take it)
    assert vars(record_copy(record)).keys() == vars(type(record)(dict(record.items()))).keys()
    with pytest.raises(TypeError):
        copy["bad"] = object()  # type: ignore[assignment]  # and Flower's checks still guard it


def test_a_subclass_record_is_copied_into_flowers_class_by_its_constructor(monkeypatch):
    class Mine(ConfigRecord):
        pass

    copy = record_copy(Mine({"a": 1}))
    assert type(copy) is ConfigRecord and dict(copy.items()) == {"a": 1}
    monkeypatch.setattr(_records, "_FAST_COPIES", False)  # where Flower holds its records otherwise
    slow = record_copy(MetricRecord(METRICS))
    assert type(slow) is MetricRecord and dict(slow.items()) == METRICS


def test_record_dict_is_a_plain_dict_of_the_records_items():
    record = ConfigRecord(CONFIG)
    plain = record_dict(record)
    assert type(plain) is dict and plain == CONFIG and all(plain[k] is record[k] for k in record)
    plain["added"] = 1
    assert "added" not in record


@pytest.mark.parametrize("ndarray", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3)),
    np.array(7, dtype=np.int64),
    np.zeros((0, 2), np.float16),
], ids=["float32", "fortran", "0-d", "empty"])
def test_a_viewed_array_of_holds_array_ofs_fields_and_is_parsed_once(ndarray):
    viewed, plain = viewed_array_of(ndarray), array_of(ndarray)
    assert type(viewed) is ViewedArray and viewed == plain and plain == viewed
    assert list(vars(viewed).items()) == list(vars(plain).items())  # nothing else until it is read
    assert viewed.deflate() == plain.deflate()  # (array_of writes C order, as its docstring says)
    first = array_view(viewed)
    assert array_view(viewed) is first and not first.flags.writeable
    assert np.array_equal(first, ndarray) and first.dtype == ndarray.dtype


def test_numpy_to_record_builds_viewed_arrays_when_asked_and_keeps_the_template_s_others():
    arrays = {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float32)}
    plain = numpy_to_record(arrays)
    assert all(type(a) is Array for a in plain.values())
    viewed = numpy_to_record(arrays, viewed=True)
    assert all(type(a) is ViewedArray for a in viewed.values()) and viewed == plain
    changed = numpy_to_record({"w": np.full((2, 2), 3.0, np.float32)}, plain, ["w"], viewed=True)
    assert type(changed["w"]) is ViewedArray and changed["b"] is plain["b"]
