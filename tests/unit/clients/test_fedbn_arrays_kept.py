"""fedbn_mod keeps the reply's batch-norm Arrays and puts them back as they are (issue 39).

Before, each training call read the reply's local tensors as arrays and
serialized them again into ``context.state``, and each call copied them out
of the state and serialized them again into the received record: about a
tenth of a ClientApp call's overhead on the batched Grid. The Arrays now go
in and out as they are where their bytes are what that round trip writes
(``as_npy_array``); the state and the records hold the same bytes as before.
"""

from __future__ import annotations

from io import BytesIO

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict

from flower_fakes import task_identity, tiny_model, to_numpy, to_record  # noqa: F401
from lips_flwr._npy import NUMPY_SERIALIZATION, is_npy_bytes, read_npy
from lips_flwr._records import array_of, array_view, as_npy_array
from lips_flwr.clients import fedbn_mod
from lips_flwr.clients.state import LOCAL_KEY
from lips_flwr.core.layers import batch_norm_names

pytestmark = pytest.mark.usefixtures("task_identity")


def context() -> Context:
    return Context(run_id=1, node_id=42, node_config={}, state=RecordDict(), run_config={})


def message(record: ArrayRecord, kind: str = MessageType.TRAIN) -> Message:
    return Message(content=RecordDict({"arrays": record}), dst_node_id=42, message_type=kind)


class App:
    """Replies with the received model plus 1, its Arrays built by ``build``; keeps what it got."""

    def __init__(self, build=Array) -> None:
        self.build, self.got, self.sent = build, [], []

    def __call__(self, msg: Message, ctx: Context) -> Message:
        record = msg.content["arrays"]
        self.got.append(record)
        trained = {k: v + 1 if np.issubdtype(v.dtype, np.floating) else v for k, v in to_numpy(record).items()}
        self.sent.append(ArrayRecord({k: self.build(v) for k, v in trained.items()}))
        return Message(RecordDict({"arrays": self.sent[-1], "metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)


def npy(array: np.ndarray) -> bytes:
    out = BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def test_the_reply_s_arrays_are_kept_and_put_back_as_they_are():
    app, ctx, model = App(), context(), tiny_model(0)
    names = batch_norm_names(model)
    fedbn_mod(message(to_record(model)), ctx, app)
    kept = ctx.state[LOCAL_KEY]
    assert list(kept) == names and all(kept[n] is app.sent[0][n] for n in names)
    fedbn_mod(message(to_record(tiny_model(1))), ctx, app)
    received = app.got[1]
    assert all(received[n] is app.sent[0][n] for n in names)  # no copy, no new serialization
    for name in received:  # the bytes the copy-and-serialize round trip wrote before
        source = app.sent[0][name] if name in names else to_record(tiny_model(1))[name]
        assert received[name].data == array_of(np.array(array_view(source))).data


def test_arrays_in_another_form_are_kept_as_their_values():
    fortran = lambda v: Array(dtype=str(v.dtype), shape=tuple(v.shape), stype=NUMPY_SERIALIZATION,  # noqa: E731
                              data=npy(np.asfortranarray(v)) + b"\0")  # Fortran order, a byte too many
    app, ctx, model = App(build=fortran), context(), tiny_model(0)
    fedbn_mod(message(to_record(model)), ctx, app)
    for name, array in ctx.state[LOCAL_KEY].items():
        assert array is not app.sent[0][name]
        view = array_view(app.sent[0][name])
        assert array.data == array_of(view).data and is_npy_bytes(array.data, read_npy(array.data))
    fedbn_mod(message(to_record(tiny_model(1)), MessageType.EVALUATE), ctx, app)
    for name in batch_norm_names(model):
        np.testing.assert_array_equal(array_view(app.got[1][name]), array_view(app.sent[0][name]))


def test_as_npy_array_keeps_only_what_array_of_would_write():
    c_order = np.arange(12, dtype=np.float32).reshape(3, 4)
    for made in (Array(c_order), array_of(c_order)):
        assert as_npy_array(made) is made
    others = {
        "fortran": Array(dtype="float32", shape=(3, 4), stype=NUMPY_SERIALIZATION, data=npy(c_order.T.copy().T)),
        "trailing": Array(dtype="float32", shape=(3, 4), stype=NUMPY_SERIALIZATION, data=npy(c_order) + b"x"),
        "fields": Array(dtype="float64", shape=(3, 4), stype=NUMPY_SERIALIZATION, data=npy(c_order)),
    }
    for what, array in others.items():
        copy = as_npy_array(array)
        assert copy is not array, what
        assert copy.data == array_of(array_view(array)).data and copy.dtype == "float32", what
        np.testing.assert_array_equal(array_view(copy), c_order)


def test_a_state_read_back_from_its_file_goes_in_as_the_old_round_trip_wrote_it(tmp_path):
    from lips_flwr.clients.persist import load_state, save_state
    from lips_flwr.clients.state import restore_local_record

    app, ctx, model = App(), context(), tiny_model(0)
    fedbn_mod(message(to_record(model)), ctx, app)
    save_state(ctx.state, tmp_path / "client.npz", 1)
    fresh = RecordDict()
    assert load_state(fresh, tmp_path / "client.npz", 2)
    received = to_record(tiny_model(1))
    restored = restore_local_record(fresh, received, batch_norm_names(model))
    for name, array in restored.items():
        source = app.sent[0][name] if name in batch_norm_names(model) else received[name]
        assert array.data == array_of(np.array(array_view(source))).data


def test_a_kept_array_of_another_shape_is_not_put_back():
    from lips_flwr.clients.state import restore_local_record

    model = tiny_model(0)
    name = batch_norm_names(model)[0]
    state = RecordDict({LOCAL_KEY: ArrayRecord({name: array_of(np.zeros(3, np.float32))})})
    received = to_record(model)
    assert restore_local_record(state, received, [name]) is received


def test_a_damaged_local_array_is_refused_before_the_app_as_before():
    model = tiny_model(0)
    record = to_record(model)
    name = batch_norm_names(model)[0]
    record[name] = Array(dtype="float32", shape=(4,), stype=NUMPY_SERIALIZATION, data=b"not an npy")
    app = App()
    with pytest.raises(ValueError, match="npy"):
        fedbn_mod(message(record), context(), app)  # the first round: no state yet
    assert app.got == []
