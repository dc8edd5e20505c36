"""The fast paths of the reply checks decide as the plain per-array checks do.

A good round is checked in C loops over whole lists (``ModelHeaders.all_same_in_order``),
with each reply's records read once (``read_train_reply``) and the global model's
headers read once per model; these tests hold each shortcut to the plain
computation it replaces, on good and on spoiled input.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from flower_fakes import (
    client_manager,
    client_models,
    fit_result,
    grid,
    reply,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
)
from lips_flwr._npy import read_npy
from lips_flwr.strategies import LIPS, LegacyLIPS
from lips_flwr.strategies.replies.headers import ModelHeaders
from lips_flwr.strategies.replies.message_access import (
    consistent,
    in_arrival_order,
    read_train_reply,
    record_dict,
    signature,
)

pytestmark = pytest.mark.usefixtures("task_identity")


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


class Bytes(bytes):
    """A bytes subclass: the fast path takes exact ``bytes`` only, as the per-name loop did."""


def plain_all_same(model: dict[str, bytes], tensors: dict) -> bool:
    """The check as it was written before the fast path: one array at a time, by name."""
    heads = {}
    for name, data in model.items():
        size = np.load(io.BytesIO(data)).nbytes
        heads[name] = (data[: len(data) - size], len(data))
    if len(tensors) != len(model):
        return False
    for name, data in tensors.items():
        head = heads.get(name)
        if head is None or type(data) is not bytes or len(data) != head[1] or not data.startswith(head[0]):
            return False
    return True


def _model_bytes() -> dict[str, bytes]:
    return {name: npy(array) for name, array in tiny_model().items()}


def _spoiled(model: dict[str, bytes]) -> dict[str, dict]:
    names = list(model)
    first, last = names[0], names[-1]
    weights = tiny_model()[first]
    return {
        "same": dict(model),
        "other values": {n: npy(np.asarray(v) + 1) for n, v in tiny_model().items()},
        "other order": dict(reversed(list(model.items()))),
        "transposed": {**model, first: npy(np.ascontiguousarray(weights.reshape(weights.shape[::-1])))},
        "float64": {**model, first: npy(weights.astype(np.float64))},
        "fortran order": {**model, first: npy(np.asfortranarray(weights))},
        "truncated": {**model, last: model[last][:-4]},
        "trailing bytes": {**model, last: model[last] + b"\0\0\0\0"},
        "bytearray": {**model, first: bytearray(model[first])},
        "bytes subclass": {**model, first: Bytes(model[first])},
        "memoryview": {**model, first: memoryview(model[first])},
        "None": {**model, first: None},
        "missing array": {n: d for n, d in model.items() if n != last},
        "extra array": {**model, "extra": model[first]},
        "renamed array": {("renamed" if n == last else n): d for n, d in model.items()},
        "empty": {},
    }


@pytest.mark.parametrize("case", list(_spoiled(_model_bytes())))
def test_all_same_decides_as_the_per_name_loop(case):
    model = _model_bytes()
    tensors = _spoiled(model)[case]
    headers = ModelHeaders(model)
    fast = len(tensors) == len(headers.shape) and headers.all_same(tensors)
    assert fast == plain_all_same(model, tensors)
    if tuple(tensors) == headers.names:  # what the adapters call on arrays in the model's order
        assert headers.all_same_in_order(list(tensors.values())) == fast
    assert fast == (case in ("same", "other values", "other order"))


@pytest.mark.parametrize("case", list(_spoiled(_model_bytes())))
def test_replied_headers_decide_as_the_per_name_loop_against_what_was_replied(case):
    """The second fast path (last round's reply headers) accepts exactly what matches those headers."""
    replied = _model_bytes()  # what the clients sent: the tiny model's own dtypes
    buffers = [n for n in replied if n.endswith("num_batches_tracked")]
    global_model = {n: npy(np.asarray(read_npy(d), np.float64)) if n in buffers else d  # FedAvg's
                    for n, d in replied.items()}
    headers = ModelHeaders(global_model, {n: replied[n] for n in buffers})
    tensors = _spoiled(replied)[case]
    if tuple(tensors) != headers.names:
        return  # the adapters call it on arrays in the model's order only
    found = headers.dtypes_in_order(list(tensors.values()))
    assert (found is headers.replied_dtype) == plain_all_same(replied, tensors)
    assert found is not headers.dtype  # none of them is like FedAvg's float64 buffers


@pytest.mark.parametrize("case", list(_spoiled(_model_bytes())))
def test_read_in_order_views_the_arrays_as_read_npy_does(case):
    model = _model_bytes()
    tensors = _spoiled(model)[case]
    headers = ModelHeaders(model)
    datas = list(tensors.values())
    try:
        expected = [read_npy(data) for data in datas]
    except (ValueError, TypeError):  # unreadable, or not bytes at all
        with pytest.raises((ValueError, TypeError)):
            headers.read_in_order(datas)
        return
    if len(datas) != len(headers.names):
        with pytest.raises(ValueError, match="arrays, expected"):
            headers.read_in_order(datas)
        return
    views = headers.read_in_order(datas)
    for view, want in zip(views, expected):
        assert view.dtype == want.dtype and view.shape == want.shape
        np.testing.assert_array_equal(view, want)
        assert view.flags.writeable == want.flags.writeable  # read-only views of bytes


def test_read_in_order_reads_a_fortran_order_model_as_read_npy_does():
    model = {n: npy(np.asfortranarray(a)) for n, a in tiny_model().items()}
    headers = ModelHeaders(model)
    fresh = {n: npy(np.asfortranarray(np.asarray(a) * 2)) for n, a in tiny_model().items()}  # its headers
    for view, data in zip(headers.read_in_order(list(fresh.values())), fresh.values()):
        np.testing.assert_array_equal(view, read_npy(data))


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_fortran_order_model_is_masked_as_the_same_model_in_c_order(api):
    # The aggregate's views must not scramble an array whose header says Fortran order:
    # the scores and the broadcast masked layers would be in the wrong places.
    def masked_round(layout):
        model = {n: layout(a) for n, a in tiny_model().items()}
        replies = [{n: layout(a) for n, a in m.items()} for m in client_models(tiny_model(), 3, seed=5)]
        if api == "message":  # records of the arrays as they are (to_record makes C-order copies)
            record = lambda m: ArrayRecord({n: Array(a) for n, a in m.items()})  # noqa: E731
            strategy = LIPS(FedAvg(), num_rounds=10, tau0=0.5)
            list(strategy.configure_train(1, record(model), ConfigRecord(), grid()))
            answers = [reply(m, 10 * (i + 1), i + 1) for i, m in enumerate(replies)]
            for answer, m in zip(answers, replies):
                answer.content["arrays"] = record(m)
            out, _ = strategy.aggregate_train(1, answers)
            return to_numpy(out)
        strategy = LegacyLIPS(LegacyFedAvg(), param_names=list(model), num_rounds=10, tau0=0.5)
        strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
        out, _ = strategy.aggregate_fit(
            1, [fit_result(m, 10 * (i + 1), str(i + 1)) for i, m in enumerate(replies)], [])
        return dict(zip(model, (read_npy(t) for t in out.tensors)))

    c_order = masked_round(lambda a: np.array(a, order="C"))
    fortran = masked_round(lambda a: np.array(a, order="F"))
    assert not tiny_model()["conv2.weight"].flags.f_contiguous  # the two runs differ in layout
    for name in c_order:
        np.testing.assert_array_equal(fortran[name], c_order[name], err_msg=name)


def test_model_headers_views_are_the_global_model():
    model = tiny_model()
    headers = ModelHeaders({n: npy(a) for n, a in model.items()})
    assert list(headers.views) == list(model) == list(headers.names)
    for name, array in model.items():
        np.testing.assert_array_equal(headers.views[name], array)
        assert not headers.views[name].flags.writeable


def test_record_dict_is_a_copy_of_the_records_arrays():
    record = to_record(tiny_model())
    copied = record_dict(record)
    assert type(copied) is dict and copied == dict(record.items())
    assert list(copied) == list(record)
    name = next(iter(record))
    record[name] = Array(np.zeros(3, np.float32))
    assert copied[name] is not record[name]


def _replies() -> tuple[dict, list]:
    model = tiny_model()
    trained = client_models(model, 6, seed=3)
    replies = [reply(m, 10 * (i + 1), i + 1) for i, m in enumerate(trained)]
    arrays, metrics = to_record(trained[0]), {"num-examples": 10, "train-loss": 0.5}
    replies[1].content = RecordDict({"arrays": arrays, "metrics": MetricRecord({**metrics, "extra": 1.0})})
    replies[2].content = RecordDict({"weights": arrays, "metrics": MetricRecord(metrics)})
    listed = MetricRecord({**metrics, "train-loss": [1.0]})
    replies[3].content = RecordDict({"arrays": arrays, "metrics": listed})
    reordered = ArrayRecord({n: arrays[n] for n in reversed(list(arrays))})
    replies[4].content = RecordDict({"arrays": reordered, "metrics": MetricRecord(metrics)})
    return model, replies


def test_read_train_reply_builds_the_signature_that_consistent_would():
    model, replies = _replies()
    headers = ModelHeaders({n: npy(a) for n, a in model.items()})
    read = [read_train_reply(msg, headers, "num-examples") for msg in replies]
    assert all(found.reason is None for found in read)
    assert [found.signature for found in read] == [signature(msg, True) for msg in replies]
    assert consistent(replies, True, [found.signature for found in read]) == consistent(replies, True)
    kept, reasons = consistent(replies, True)
    assert [replies.index(m) for m in kept] == [0, 4, 5] and sorted(reasons) == [1, 2, 3]


def test_consistent_with_one_signature_keeps_every_reply():
    _, replies = _replies()
    good = [replies[0], replies[4], replies[5]]
    assert consistent(good, True) == (good, {})
    assert consistent(good, True, [signature(m, True) for m in good]) == (good, {})


def test_in_arrival_order_without_drops_is_a_new_list_of_the_replies():
    _, replies = _replies()
    out = in_arrival_order(replies, list(replies))
    assert out == replies and out is not replies
    assert in_arrival_order(replies, [replies[0], replies[4]]) == [replies[0], replies[4]]


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_the_model_headers_are_read_once_per_global_model_and_follow_a_change(api):
    model = tiny_model()
    if api == "message":
        strategy = LIPS(FedAvg(), num_rounds=10)
        previous = to_record(model)
        list(strategy.configure_train(2, previous, ConfigRecord(), grid()))
    else:
        strategy = LegacyLIPS(LegacyFedAvg(), param_names=list(model), num_rounds=10)
        previous = ndarrays_to_parameters(list(model.values()))
        strategy.configure_fit(2, previous, client_manager())
    model_headers = lambda: strategy._lips_gate.model_headers(strategy._lips_previous)  # noqa: E731
    previous_views = lambda: strategy._lips_gate.previous_views(strategy._lips_previous)  # noqa: E731
    headers = model_headers()
    assert model_headers() is headers  # read once
    assert previous_views() is headers.views
    name = list(model)[0]
    changed = np.zeros(model[name].shape[::-1], model[name].dtype)
    if api == "message":
        previous[name] = Array(changed)  # the caller's record changed after configure_train
    else:
        previous.tensors[0] = npy(changed)
    fresh = model_headers()
    assert fresh is not headers and fresh.shape[name] == changed.shape
    np.testing.assert_array_equal(previous_views()[name], changed)
    if api == "message":  # a new round's global model: read again
        list(strategy.configure_train(3, to_record(model), ConfigRecord(), grid()))
    else:
        strategy.configure_fit(3, ndarrays_to_parameters(list(model.values())), client_manager())
    assert model_headers() is not fresh


def test_replied_headers_are_a_second_fast_path_for_their_dtypes_only():
    model = tiny_model()
    buffers = [n for n in model if n.endswith("num_batches_tracked")]
    as_fedavg_sends = {n: npy(np.asarray(a, np.float64) if n in buffers else a) for n, a in model.items()}
    as_clients_send = {n: npy(a) for n, a in model.items()}  # int64 buffers
    plain = ModelHeaders(as_fedavg_sends)
    assert plain.replied_dtype is plain.dtype and plain.dtypes_in_order(list(as_clients_send.values())) is None
    headers = ModelHeaders(as_fedavg_sends, {n: as_clients_send[n] for n in buffers})
    assert not headers.all_same_in_order(list(as_clients_send.values()))
    assert headers.dtypes_in_order(list(as_clients_send.values())) is headers.replied_dtype
    assert headers.dtypes_in_order(list(as_fedavg_sends.values())) is headers.dtype  # still a fast path
    assert {n: headers.replied_dtype[n] for n in buffers} == {n: np.dtype(np.int64) for n in buffers}
    assert {n: d for n, d in headers.replied_dtype.items() if n not in buffers} == \
        {n: d for n, d in headers.dtype.items() if n not in buffers}
    other = dict(as_clients_send, **{buffers[0]: npy(np.zeros(3, np.int64))})  # another shape
    assert headers.dtypes_in_order(list(other.values())) is None
    wrong = ModelHeaders(as_fedavg_sends, {buffers[0]: npy(np.zeros(3, np.int64)),  # not its shape
                                           buffers[1]: npy(np.array(["x"]))})      # not a number
    assert wrong.replied_dtype is wrong.dtype


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_rounds_after_fedavg_made_the_buffers_float64_take_the_fast_path_with_the_same_aggregate(
        api, monkeypatch):
    """Round 2's global model has FedAvg's float64 buffers, the clients send int64: from round 3 the
    replies match the headers learned in round 2, with the aggregate the per-name checks give."""
    import lips_flwr.strategies.replies.gate as module  # both APIs' checks

    slow_calls = []
    real = module.fast_reply_problem
    monkeypatch.setattr(module, "fast_reply_problem", lambda *a, **k: slow_calls.append(1) or real(*a, **k))
    model = tiny_model()
    trained = client_models(model, 3, seed=5)

    def run(strategy, rounds):
        global_model, slow = None, []
        for rnd in range(1, rounds + 1):
            slow_calls.clear()
            if api == "message":
                arrays = to_record(model) if global_model is None else global_model
                list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid()))
                global_model, _ = strategy.aggregate_train(rnd, [reply(m, 10 * (i + 1), i + 1)
                                                                 for i, m in enumerate(trained)])
            else:
                params = ndarrays_to_parameters(list(model.values())) if global_model is None else global_model
                strategy.configure_fit(rnd, params, client_manager())
                global_model, _ = strategy.aggregate_fit(
                    rnd, [fit_result(m, 10 * (i + 1), str(i + 1)) for i, m in enumerate(trained)], [])
            slow.append(len(slow_calls))
        return global_model, slow

    if api == "message":
        make = lambda: LIPS(FedAvg(), num_rounds=10, tau0=0.0)  # noqa: E731
    else:
        # inplace=False: legacy FedAvg's in-place sum keeps int64 buffers, its plain mean does not
        make = lambda: LegacyLIPS(LegacyFedAvg(inplace=False), param_names=list(model),  # noqa: E731
                                  num_rounds=10, tau0=0.0)
    got, slow = run(make(), 4)
    assert slow == [0, 3, 0, 0]  # round 2's replies miss the float64 headers; later rounds do not
    fresh = make()
    fresh._lips_gate.headers.remember = lambda *args: None  # every round through the per-name checks
    want, slow_want = run(fresh, 4)
    assert slow_want == [0, 3, 3, 3]
    assert got is not None
    if api == "message":
        for name in model:  # the same aggregate as the per-name checks give (round 4 of the same replies)
            np.testing.assert_array_equal(to_numpy(got)[name], to_numpy(want)[name])
    else:
        assert got.tensors == want.tensors


def test_replies_are_checked_against_the_global_model_as_it_is_when_they_come(caplog):
    """A global model changed in place between configure_train and aggregate_train is read again."""
    model = tiny_model()
    previous = to_record(model)
    strategy = LIPS(FedAvg(), num_rounds=10)
    list(strategy.configure_train(2, previous, ConfigRecord(), grid()))
    strategy._lips_gate.model_headers(previous)  # read for the old shapes
    name = list(model)[0]
    reshaped = dict(model, **{name: np.ascontiguousarray(model[name].reshape(model[name].shape[::-1]))})
    previous[name] = Array(reshaped[name])
    replies = [reply(reshaped, 10, 1), reply(model, 10, 2)]
    with caplog.at_level(logging.WARNING):
        new, _ = strategy.aggregate_train(2, replies)
    assert new is not None and to_numpy(new)[name].shape == reshaped[name].shape
    assert "ignoring reply from node 2" in caplog.text and "ignoring reply from node 1" not in caplog.text


def test_legacy_fast_path_results_keep_the_fedavg_aggregate():
    model = tiny_model()
    trained = client_models(model, 4, seed=5)
    results = [fit_result(m, 10 * (i + 1), str(i + 1)) for i, m in enumerate(trained)]
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=list(model),
                          num_rounds=10, tau0=0.0)
    bare = LegacyFedAvg()
    strategy.configure_fit(2, ndarrays_to_parameters(list(model.values())), client_manager())
    got, _ = strategy.aggregate_fit(2, results, [])
    want, _ = bare.aggregate_fit(2, results, [])
    assert got.tensors == want.tensors


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ">f4", np.int64, np.uint8, np.bool_,
                                   np.complex64])
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 0, 3), (4, 1, 3, 3)])
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_a_masked_layer_is_serialized_as_flower_serializes_it(dtype, shape, layout):
    from lips_flwr._records import array_of

    array = (np.arange(int(np.prod(shape)) * 2) % 7).astype(dtype)[: int(np.prod(shape))].reshape(shape)
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    want = Array(np.asarray(array, order="C"))
    for _ in range(2):  # the first array of a dtype and shape, then one with its kept header
        got = array_of(array)
        assert (got.data, got.dtype, got.shape, got.stype) == (want.data, want.dtype, want.shape, want.stype)
        np.testing.assert_array_equal(got.numpy(), array)
        array = array.copy(order="K")


@pytest.mark.parametrize("dtype", [np.float32, ">f8", np.dtype(np.float64, metadata={"unit": "m"}),
                                   np.dtype([("a", "<f4"), ("b", ">i2")]), "U3", np.int8])
@pytest.mark.filterwarnings("ignore:metadata on a dtype is not saved")  # (np.save's, in both)
def test_an_arrays_dtype_name_is_flowers_twice(dtype):
    """The remembered name of a builtin dtype (array_of) is str(dtype), and so is every other's."""
    from lips_flwr._records import array_of

    array = np.zeros(4, dtype=dtype)
    assert [array_of(array).dtype for _ in range(2)] == [Array(array).dtype] * 2


def test_a_structured_array_whose_header_np_save_may_write_in_another_format_is_serialized_by_np_save():
    from lips_flwr._records import array_of

    array = np.zeros(3, dtype=[(f"field{i}", "<f4") for i in range(40)])
    for _ in range(2):
        assert array_of(array).data == Array(array).data


def test_arrays_of_one_dtype_and_shape_reuse_one_header_but_not_their_data():
    from lips_flwr import _npy
    from lips_flwr._records import array_of

    first, second = np.zeros((3, 4), np.float32), np.arange(12, dtype=np.float32).reshape(3, 4)
    assert array_of(first).data == Array(first).data
    assert (np.dtype(np.float32), (3, 4)) in _npy._write_headers
    assert array_of(second).data == Array(second).data
    assert array_of(second[::-1]).data == Array(np.ascontiguousarray(second[::-1])).data  # strided
    assert array_of(np.float64(2.5)).shape == () and array_of(np.array(7)).numpy().shape == ()


def test_the_kept_headers_are_bounded(monkeypatch):
    from lips_flwr import _npy

    monkeypatch.setattr(_npy, "_MAX_WRITE_HEADERS", 5)
    monkeypatch.setattr(_npy, "_write_headers", {})
    for n in range(1, 20):
        array = np.arange(n, dtype=np.int32)
        assert _npy.npy_bytes(array) == Array(array).data
        assert len(_npy._write_headers) <= 5


def test_an_object_array_is_refused_as_flower_refuses_it():
    from lips_flwr._records import array_of

    with pytest.raises(ValueError):
        Array(np.array([object()], dtype=object))
    with pytest.raises(ValueError):
        array_of(np.array([object()], dtype=object))
