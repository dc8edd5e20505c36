"""The batched Grid's Arrays read their header once: the same ndarray as Flower's ``Array.numpy()``."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from flower_fakes import task_identity  # noqa: F401
from lips_flwr.experiments.batched.arrays import ViewedArray, view_records, viewed_record

CASES = {
    "float32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "float64 Fortran order": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    "0-d int64": np.array(7, dtype=np.int64),
    "big-endian float32": np.arange(5, dtype=">f4"),
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "float16 4-d": np.ones((2, 1, 3, 2), dtype=np.float16),
}


def viewed(ndarray: np.ndarray) -> Array:
    return ViewedArray.copy_of(Array(ndarray))


@pytest.mark.parametrize("name", CASES)
def test_numpy_gives_what_flowers_array_gives(name):
    flower, ours = Array(CASES[name]).numpy(), viewed(CASES[name]).numpy()
    assert ours.dtype == flower.dtype and ours.shape == flower.shape
    assert np.array_equal(ours, flower)
    for flag in ("C_CONTIGUOUS", "F_CONTIGUOUS", "WRITEABLE"):
        assert ours.flags[flag] == flower.flags[flag], flag


def test_each_call_gives_an_array_of_its_own_and_the_bytes_stay():
    array = viewed(np.arange(4, dtype=np.float32))
    data = array.data
    first = array.numpy()
    first[:] = -1
    assert array.numpy().tolist() == [0, 1, 2, 3] and array.data is data


def test_bad_bytes_and_other_serializations_raise_as_flowers_do():
    good = Array(np.arange(4, dtype=np.float32))
    truncated = Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=good.data[:-4])
    for flower, ours in ((truncated, viewed(np.zeros(1))),):
        ours.data = flower.data
        with pytest.raises(ValueError):
            flower.numpy()
        with pytest.raises(ValueError):
            ours.numpy()
    other = Array(dtype="float32", shape=(1,), stype="torch", data=b"1234")
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        Array.numpy(other)
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        ViewedArray.copy_of(other).numpy()


def test_view_records_puts_copies_in_place_and_leaves_the_senders_objects_alone():
    class Custom(Array):
        pass

    record = ArrayRecord({"a": Array(np.ones(2, np.float32))})
    record["b"] = Custom(np.ones(2, np.float32))  # (the constructor would copy it into an Array)
    content = RecordDict({"arrays": record, "metrics": MetricRecord({"x": 1.0}),
                          "config": ConfigRecord({"k": "v"})})
    plain, custom = record["a"], record["b"]
    view_records(content)
    new = content["arrays"]
    assert new is not record and list(new) == ["a", "b"]
    assert type(new["a"]) is ViewedArray and new["a"] == plain and new["a"].data is plain.data
    assert type(new["b"]) is Custom and new["b"] is not custom and new["b"].data is custom.data
    assert record["a"] is plain and type(plain) is Array and record["b"] is custom  # the sender's, as they were
    assert content["metrics"]["x"] == 1.0 and content["config"]["k"] == "v"
    assert type(viewed_record(new)["a"]) is ViewedArray and new["a"].numpy().tolist() == [1.0, 1.0]


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_the_grid_carries_viewed_arrays_both_ways_with_flowers_values(engine):
    from flwr.app import Message

    from lips_flwr.experiments.batched import BatchedGrid

    received = []

    def see(array: Array, pid: int) -> np.ndarray:
        received.append((type(array), array.numpy().tolist()))
        return np.full(2, float(pid), np.float32)

    grid = BatchedGrid(app_replying(see), num_nodes=2, run_config={}, engine=engine)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32))}), "config": ConfigRecord()})
    replies = list(grid.send_and_receive([Message(content, n, "train") for n in (1000, 1001)], timeout=30))
    assert received == [(ViewedArray, [1.0, 1.0])] * 2
    arrays = sorted((type(r.content["arrays"]["w"]), r.content["arrays"]["w"].numpy().tolist()) for r in replies)
    assert arrays == [(ViewedArray, [0.0, 0.0]), (ViewedArray, [1.0, 1.0])]


def test_a_viewed_array_is_equal_to_and_deflates_as_flowers_array():
    flower = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    ours = viewed(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert ours == flower and flower == ours and not (ours != flower)
    assert ours != viewed(np.zeros(6, np.float32).reshape(2, 3)) and ours != "Array"
    assert ArrayRecord({"x": flower}) == record_with(ours)
    if not hasattr(flower, "deflate"):
        return  # (a flwr without Flower's wire objects: nothing to deflate)
    assert ours.deflate() == flower.deflate() and ours.object_id == flower.object_id
    inflatable = pytest.importorskip("flwr.supercore.inflatable.inflatable_utils")
    inflate_object_from_contents = inflatable.inflate_object_from_contents

    children = {chunk_id: chunk for chunk_id, chunk in ours.children.items()}
    back = inflate_object_from_contents(ours.object_id, {ours.object_id: ours.deflate(),
                                                          **{k: v.deflate() for k, v in children.items()}})
    assert type(back) is Array and back == flower


def record_with(array: Array) -> ArrayRecord:
    record = ArrayRecord()
    record["x"] = array
    return record


def test_a_viewed_array_parses_its_bytes_once_and_again_for_other_bytes():
    from lips_flwr._records import array_view

    array = viewed(np.arange(4, dtype=np.float32))
    first = array.view()
    assert array.view() is first and array_view(array) is first and not first.flags.writeable
    copy = ViewedArray.copy_of(array)
    assert copy.view() is first  # a copy made after the parse shares it
    copy.data = Array(np.full(3, 5.0, np.float32)).data  # a mod gives its own copy other bytes
    assert copy.view().tolist() == [5.0, 5.0, 5.0] and array.view() is first
    assert array.numpy() is not first and array.numpy().flags.writeable
    writable = viewed(np.arange(3, dtype=np.float32))
    writable.data = bytearray(writable.data)  # (bytes a view could write through: the shared view cannot)
    assert not writable.view().flags.writeable and writable.numpy().tolist() == [0.0, 1.0, 2.0]
    array.stype = "torch"  # another serialization after the parse: refused as Flower refuses it
    with pytest.raises(TypeError, match="Unsupported serialization type"):
        array.view()


def test_pickling_a_viewed_array_leaves_its_view_behind():
    import pickle

    array = viewed(np.arange(10_000, dtype=np.float32))
    unparsed = len(pickle.dumps(array))
    array.view()
    back = pickle.loads(pickle.dumps(array))
    assert len(pickle.dumps(array)) == unparsed  # (the bytes once, not their view as well)
    assert back == array and "_parsed" not in vars(back) and np.array_equal(back.numpy(), array.numpy())


def test_copies_of_a_broadcast_share_one_parse_in_a_delivery_and_bad_bytes_wait_for_the_client():
    broadcast = Array(np.arange(6, dtype=np.float32))
    bad = Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=b"not npy")
    record = ArrayRecord()
    record["w"], record["bad"] = broadcast, bad
    shared: dict = {}
    first, second = viewed_record(record, shared), viewed_record(record, shared)
    assert first["w"] is not second["w"] and first["w"] is not broadcast and first["w"].data is broadcast.data
    assert first["w"].view() is second["w"].view()  # parsed once, for both
    assert viewed_record(record)["w"].view() is not first["w"].view()  # (without `shared`: its own parse)
    with pytest.raises(ValueError):
        second["bad"].numpy()  # in the client's own call, as Array.numpy() would
    other = ArrayRecord()
    other["w"] = Array(np.zeros(6, np.float32))
    assert viewed_record(other, shared)["w"].view().tolist() == [0.0] * 6  # another Array: another parse


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("engine", ["sequential", "stacked"])
def test_the_clients_of_a_delivery_read_one_parse_of_the_broadcast_model(engine):
    from flwr.app import Message

    from lips_flwr._records import array_view
    from lips_flwr.experiments.batched import BatchedGrid

    seen = []

    def see(array: Array, pid: int) -> np.ndarray:
        seen.append((array, array_view(array), array_view(array).tolist()))  # (kept: ids stay unique)
        return np.ones(2, np.float32)

    grid = BatchedGrid(app_replying(see), num_nodes=3, run_config={}, engine=engine)
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.full(2, 3.0, np.float32))}),
                          "config": ConfigRecord()})
    for _ in range(2):
        list(grid.send_and_receive([Message(content, n, "train") for n in (1000, 1001, 1002)], timeout=30))
    first, second = seen[:3], seen[3:]
    assert len({id(array) for array, _, _ in first}) == 3  # each client its own Array object
    assert len({id(view) for _, view, _ in first}) == 1  # one parse for the delivery's clients
    assert all(values == [3.0, 3.0] for _, _, values in seen)
    assert len({id(view) for _, view, _ in second}) == 1 and second[0][1] is not first[0][1]  # one a delivery


def app_replying(see):
    """A ClientApp whose train call hands the received ``w`` and its partition id to ``see`` and
    replies with the array ``see`` returns."""
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        reply = see(msg.content["arrays"]["w"], int(context.node_config["partition-id"]))
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(reply)}),
                                   "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    return app
