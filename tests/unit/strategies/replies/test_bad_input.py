"""Bad input to the LIPS strategies of both APIs: rejected with a reason, or a clear error.

docs/robustness.md cites these tests by input. Replies are mocked (no Ray): Message
API ``Mock(spec=Message)`` replies, legacy ``FitRes`` with mocked proxies.
"""

from __future__ import annotations

import io
import logging
import math
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, FedAvgM, FedMedian

from flower_fakes import (
    MIDDLE,
    client_manager,
    client_models,
    fit_result,
    grid,
    params_to_model,
    reply,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
)
from lips_flwr.core.lips import LIPSCore
from lips_flwr.strategies import LIPS, LegacyLIPS, LegacyLIPSFedAvg, LIPSFedAvg
from lips_flwr.strategies.replies.dtypes import round_dtypes

pytestmark = pytest.mark.usefixtures("task_identity")
NUM_ROUNDS = 10
NAMES = list(tiny_model())
GOOD_EXAMPLES = [10, 30]


def fedavg_of(models, weights):
    total = sum(weights)
    return {k: sum(m[k] * (w / total) for m, w in zip(models, weights)) for k in models[0]}


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def message_with(content: RecordDict, node_id: int) -> Message:
    msg = Mock(spec=Message)
    msg.content = content
    msg.has_error.return_value = False
    msg.metadata.src_node_id = node_id
    return msg


class MessageAPI:
    """Drives a Message API LIPS strategy on mocked replies."""

    name = "message"
    weight = "'num-examples'"

    def __init__(self, strategy=None, **lips) -> None:
        self.strategy = strategy or LIPS(FedAvg(), num_rounds=NUM_ROUNDS, **lips)

    @staticmethod
    def who(node: int) -> str:
        return f"node {node}"

    def configure(self, rnd: int, model: dict) -> None:
        list(self.strategy.configure_train(rnd, to_record(model), ConfigRecord(), grid()))

    def reply(self, model: dict, num_examples, node: int):
        return reply(model, num_examples, node_id=node)

    def aggregate(self, rnd: int, replies: list):
        new, metrics = self.strategy.aggregate_train(rnd, replies)
        return (None if new is None else to_numpy(new)), metrics

    def failed(self, node: int):
        msg = Mock(spec=Message)
        msg.has_error.return_value = True
        msg.error.reason = "client crashed"
        msg.metadata.src_node_id = node
        return msg


class LegacyAPI:
    """Drives a legacy LIPS strategy on FitRes results."""

    name = "legacy"
    weight = "'num_examples'"

    def __init__(self, strategy=None, **lips) -> None:
        self.strategy = strategy or LegacyLIPS(
            LegacyFedAvg(), param_names=NAMES, num_rounds=NUM_ROUNDS, **lips)

    @staticmethod
    def who(node: int) -> str:
        return f"client {node}"

    def configure(self, rnd: int, model: dict) -> None:
        self.strategy.configure_fit(rnd, ndarrays_to_parameters(list(model.values())),
                                    client_manager(3))

    def reply(self, model: dict, num_examples, node: int):
        return fit_result(model, num_examples, cid=str(node))

    def aggregate(self, rnd: int, replies: list, failures=None):
        new, metrics = self.strategy.aggregate_fit(rnd, replies, failures or [])
        return (None if new is None else params_to_model(new, self.strategy.param_names)), metrics

    def failed(self, node: int):
        return Exception(f"client {node} crashed")


APIS = [MessageAPI, LegacyAPI]
api_param = pytest.mark.parametrize("api", APIS, ids=["message", "legacy"])


def round_with_one_bad_reply(api, bad_model, rnd=2, num_examples=10, bad_node=7):
    """A round with two good replies and one bad one; returns (good models, result, metrics)."""
    model = tiny_model()
    api.configure(rnd, model)
    good = client_models(model, 2, seed=rnd)
    replies = [api.reply(m, n, node=i + 1) for i, (m, n) in enumerate(zip(good, GOOD_EXAMPLES))]
    replies.append(api.reply(bad_model(good[0]), num_examples, node=bad_node))
    new, metrics = api.aggregate(rnd, replies)
    return good, new, metrics


def assert_is_fedavg_of_good(new, good):
    expected = fedavg_of(good, GOOD_EXAMPLES)
    for name in NAMES:
        np.testing.assert_allclose(new[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


# --------------------------------------------------------------------------- NaN / Inf
@api_param
@pytest.mark.parametrize(
    ("name", "value"),
    [("conv2.weight", np.nan), ("fc.bias", np.inf), ("bn1.running_var", -np.inf)],
    ids=["nan-middle-layer", "inf-classifier-bias", "minus-inf-bn-buffer"],
)
def test_nan_or_inf_in_a_client_update_is_rejected(api, name, value, caplog):
    api = api()

    def poisoned(model):
        out = dict(model)
        out[name] = model[name].copy()
        out[name].reshape(-1)[1] = value
        return out

    with caplog.at_level(logging.WARNING):
        good, new, metrics = round_with_one_bad_reply(api, poisoned)
    assert api.who(7) in caplog.text and f"NaN or Inf in arrays ['{name}']" in caplog.text
    assert all(np.isfinite(new[n]).all() for n in NAMES if new[n].dtype.kind == "f")
    assert_is_fedavg_of_good(new, good)


@api_param
def test_nan_reply_on_a_mask_round_does_not_stop_the_mask(api, caplog):
    api = api()

    def poisoned(model):
        return {**model, "conv3.weight": np.full_like(model["conv3.weight"], np.nan)}

    with caplog.at_level(logging.WARNING):
        _, new, metrics = round_with_one_bad_reply(api, poisoned, rnd=1)
    assert "NaN or Inf in arrays ['conv3.weight']" in caplog.text
    assert metrics["lips-mask-round"] == 1
    for name in MIDDLE:
        assert np.isfinite(new[name]).all()
        assert metrics[f"lips-zeros/{name}"] == math.ceil(new[name].size * 0.5)


# --------------------------------------------------------------------------- tensors
@api_param
def test_reply_with_an_extra_tensor_is_rejected(api, caplog):
    api = api()
    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(
            api, lambda m: {**m, "extra.weight": np.ones((2, 2), np.float32)})
    assert api.who(7) in caplog.text
    reason = "unexpected arrays ['extra.weight']" if api.name == "message" else f"{len(NAMES) + 1} arrays, expected {len(NAMES)}"
    assert reason in caplog.text
    assert_is_fedavg_of_good(new, good)


def test_renamed_tensors_are_rejected(caplog):
    """A client that sends ``module.``-prefixed names (DataParallel) does not fit the model."""
    api = MessageAPI()
    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(api, lambda m: {f"module.{k}": v for k, v in m.items()})
    assert "node 7" in caplog.text
    assert "missing arrays ['conv1.weight'" in caplog.text
    assert "unexpected arrays ['module.conv1.weight'" in caplog.text
    assert_is_fedavg_of_good(new, good)


def test_array_whose_metadata_hides_another_shape_is_rejected(caplog):
    """The shape checked is the one the data decodes to, not the Array's own metadata."""
    api = MessageAPI()
    model = tiny_model()
    api.configure(2, model)
    good = client_models(model, 2, seed=2)
    lying = to_record(good[0])
    flat = good[0]["conv2.weight"].reshape(-1)
    lying["conv2.weight"] = Array(dtype="float32", shape=model["conv2.weight"].shape,
                                  stype="numpy.ndarray", data=npy(flat))
    bad = message_with(RecordDict({"arrays": lying, "metrics": MetricRecord({"num-examples": 10})}), 7)
    with caplog.at_level(logging.WARNING):
        new, _ = api.strategy.aggregate_train(2, [api.reply(good[0], 10, 1), api.reply(good[1], 30, 2), bad])
    assert f"array 'conv2.weight' has shape ({flat.size},), expected (8, 4, 3, 3)" in caplog.text
    assert_is_fedavg_of_good(to_numpy(new), good)


@api_param
def test_unreadable_array_bytes_are_rejected(api, caplog):
    api = api()
    model = tiny_model()
    api.configure(2, model)
    good = client_models(model, 2, seed=2)
    replies = [api.reply(m, n, node=i + 1) for i, (m, n) in enumerate(zip(good, GOOD_EXAMPLES))]
    garbage = api.reply(good[0], 10, node=7)
    truncated = npy(good[0]["conv2.weight"])[:-40]
    if api.name == "message":
        garbage.content["arrays"]["fc.weight"] = Array(dtype="float32", shape=(10, 8),
                                                       stype="numpy.ndarray", data=b"not an array")
        garbage.content["arrays"]["conv2.weight"] = Array(dtype="float32", shape=(8, 4, 3, 3),
                                                          stype="numpy.ndarray", data=truncated)
    else:
        garbage[1].parameters.tensors[NAMES.index("conv2.weight")] = truncated
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(2, replies + [garbage])
    assert api.who(7) in caplog.text and "is unreadable" in caplog.text
    assert_is_fedavg_of_good(new, good)


def test_non_numpy_serialization_and_two_array_records_are_rejected(caplog):
    api = MessageAPI()
    model = tiny_model()
    api.configure(2, model)
    good = client_models(model, 2, seed=2)
    torch_like = to_record(good[0])
    torch_like["fc.bias"] = Array(dtype="float32", shape=(10,), stype="torch.Tensor", data=b"x" * 40)
    two = RecordDict({"arrays": to_record(good[0]), "more": to_record(good[0]),
                      "metrics": MetricRecord({"num-examples": 10})})
    replies = [api.reply(good[0], 10, 1), api.reply(good[1], 30, 2),
               message_with(RecordDict({"arrays": torch_like, "metrics": MetricRecord({"num-examples": 10})}), 7),
               message_with(two, 8)]
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(2, replies)
    assert "node 7: array 'fc.bias' is serialized as 'torch.Tensor'" in caplog.text
    assert "node 8: expected one ArrayRecord, got 2" in caplog.text
    assert_is_fedavg_of_good(new, good)


@pytest.mark.parametrize("inner", [FedAvg, FedAvgM, FedMedian])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_numpy_bytes_under_another_stype_are_dropped_when_the_wrapped_strategy_cannot_read_them(
        inner, position, caplog):
    # The header checks leave stype unread on a good round: bytes exactly like the global
    # model's under another stype pass them, and the wrapped strategy's Array.numpy() raises.
    api = MessageAPI(LIPS(inner(), num_rounds=NUM_ROUNDS))
    model = tiny_model()
    api.configure(2, model)
    good = client_models(model, 2, seed=2)
    record = to_record(good[0])
    array = record["fc.bias"]
    record["fc.bias"] = Array(dtype=array.dtype, shape=array.shape, stype="torch.Tensor", data=array.data)
    metrics = MetricRecord({"num-examples": 10, "train-loss": 0.5})
    odd = message_with(RecordDict({"arrays": record, "metrics": metrics}), 7)
    replies = [api.reply(good[0], 10, 1), api.reply(good[1], 30, 2)]
    replies.insert(position, odd)
    with caplog.at_level(logging.WARNING):
        new, metrics = api.aggregate(2, replies)
    assert "node 7: array 'fc.bias' is serialized as 'torch.Tensor'" in caplog.text
    assert f"{inner.__name__} raised TypeError" in caplog.text  # the wrapped strategy's error, logged
    plain = MessageAPI(LIPS(inner(), num_rounds=NUM_ROUNDS))  # the same round without that reply
    plain.configure(2, model)
    expected, expected_metrics = plain.aggregate(2, [api.reply(good[0], 10, 1), api.reply(good[1], 30, 2)])
    for name in NAMES:
        np.testing.assert_array_equal(new[name], expected[name], err_msg=name)
    timeless = lambda m: {k: v for k, v in m.items() if k != "lips-seconds"}  # noqa: E731
    assert timeless(metrics) == timeless(expected_metrics)


def test_an_error_of_the_wrapped_strategy_itself_propagates():
    class Broken(FedAvg):
        def aggregate_train(self, server_round, replies):
            raise RuntimeError("a bug in the wrapped strategy")

    api = MessageAPI(LIPS(Broken(), num_rounds=NUM_ROUNDS))
    model = tiny_model()
    api.configure(2, model)
    good = client_models(model, 2, seed=2)
    with pytest.raises(RuntimeError, match="a bug in the wrapped strategy"):
        api.aggregate(2, [api.reply(m, n, i + 1) for i, (m, n) in enumerate(zip(good, GOOD_EXAMPLES))])


@api_param
def test_complex_or_text_arrays_are_rejected(api, caplog):
    api = api()
    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(
            api, lambda m: {**m, "fc.bias": m["fc.bias"].astype(np.complex64)})
    assert "array 'fc.bias' has dtype complex64, not a real number type" in caplog.text
    assert_is_fedavg_of_good(new, good)


# --------------------------------------------------------------------------- names
def test_legacy_param_names_in_the_wrong_order_fail_before_any_state_changes():
    inner = LegacyFedAvg()
    inner.configure_fit = Mock(side_effect=inner.configure_fit)
    strategy = LegacyLIPS(inner, param_names=NAMES[::-1], num_rounds=NUM_ROUNDS)
    with pytest.raises(ValueError, match=r"`param_names` do not match the model's arrays: "
                                         r"'bn2\.num_batches_tracked' names an array of shape \(4,\)"):
        LegacyAPI(strategy).configure(1, tiny_model())
    assert strategy._lips_previous is None and strategy.core.state()["layers"] is None
    inner.configure_fit.assert_not_called()


def test_legacy_param_names_of_the_wrong_length_fail_before_any_state_changes():
    inner = LegacyFedAvg()
    inner.configure_fit = Mock(side_effect=inner.configure_fit)
    strategy = LegacyLIPS(inner, param_names=NAMES + ["extra"], num_rounds=NUM_ROUNDS)
    match = f"`param_names` has {len(NAMES) + 1} names but the model has {len(NAMES)} arrays"
    with pytest.raises(ValueError, match=match):
        LegacyAPI(strategy).configure(1, tiny_model())
    assert strategy._lips_previous is None and strategy.core.state()["layers"] is None
    inner.configure_fit.assert_not_called()


# --------------------------------------------------------------------------- dtypes
def mixed_dtype_model(seed: int = 0) -> dict[str, np.ndarray]:
    """TinyNet with a float16 and a float64 middle layer and an int rank-2 buffer between them."""
    model = tiny_model(seed)
    out = {}
    for name, array in model.items():
        if name == "conv2.weight":
            array = array.astype(np.float16)
        elif name == "conv3.weight":
            out["lookup.index"] = np.arange(12, dtype=np.int32).reshape(3, 4)
            array = array.astype(np.float64)
        out[name] = array
    return out


@api_param
def test_float16_float64_and_integer_tensors(api):
    """Float16/float64 layers are masked in their own dtype; integer tensors are never touched.

    Message API FedAvg returns the int32 buffer as float64: it stays excluded
    in round 2, because the layers are chosen on the initial global model.
    """
    model = mixed_dtype_model()
    names = list(model)
    api = api()
    if api.name == "message":
        api.strategy, plain = LIPS(FedAvg(), num_rounds=NUM_ROUNDS, every=1), FedAvg()
    else:
        api.strategy = LegacyLIPS(LegacyFedAvg(), param_names=names, num_rounds=NUM_ROUNDS, every=1)
        plain = LegacyFedAvg()
    current = model
    for rnd in (1, 2):
        api.configure(rnd, current)
        trained = client_models(current, 3, seed=rnd)
        make = lambda: [api.reply(m, n, node=i + 1) for i, (m, n) in enumerate(zip(trained, [10, 30, 60]))]  # noqa: E731
        new, metrics = api.aggregate(rnd, make())
        if api.name == "message":
            dense = to_numpy(plain.aggregate_train(rnd, make())[0])
        else:
            dense = params_to_model(plain.aggregate_fit(rnd, make(), [])[0], names)
        assert metrics["lips-layers-masked"] == 2
        tau = 0.5 * (1 - (rnd - 1) / NUM_ROUNDS)
        for name, dtype in (("conv2.weight", np.float16), ("conv3.weight", np.float64)):
            assert new[name].dtype == dtype
            assert metrics[f"lips-zeros/{name}"] == math.ceil(new[name].size * tau)
            assert int((new[name] == 0).sum()) == math.ceil(new[name].size * tau)
        # integer tensors: whatever the inner strategy made of them, LIPS does not touch them
        for name in ("lookup.index", "bn1.num_batches_tracked"):
            assert f"lips-zeros/{name}" not in metrics
            assert new[name].dtype == dense[name].dtype
            np.testing.assert_array_equal(new[name], dense[name])
        current = new


@api_param
def test_other_real_dtypes_in_a_reply_are_accepted(api, caplog):
    """float64 for a float32 tensor, integers for a float tensor: real numbers, aggregated as usual."""
    api = api()

    def drifted(model):
        return {**model, "conv2.weight": model["conv2.weight"].astype(np.float64),
                "fc.bias": np.round(model["fc.bias"]).astype(np.int64)}

    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(api, drifted)
    assert "LIPS: ignoring" not in caplog.text
    expected = fedavg_of([good[0], good[1], drifted(good[0])], GOOD_EXAMPLES + [10])
    np.testing.assert_allclose(new["conv2.weight"], expected["conv2.weight"], rtol=1e-5)
    np.testing.assert_allclose(new["fc.bias"], expected["fc.bias"], rtol=1e-5, atol=1e-7)


@api_param
def test_a_zero_dimensional_buffer_cast_to_the_others_dtype_keeps_its_shape(api, caplog):
    """One reply's ``num_batches_tracked`` (0-d) in float64 among int64 ones: cast, still 0-d.

    Before: the cast went through ``np.ascontiguousarray``, which makes a 0-d
    array 1-d: the Message API's aggregate got shape (1,) (and the next round
    rejected every reply), the legacy FedAvg raised on broadcasting.
    """
    api = api()
    name = "bn1.num_batches_tracked"

    def float_buffer(model):
        return {**model, name: np.asarray(model[name], dtype=np.float64)}

    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(api, float_buffer)
    assert "LIPS: ignoring" not in caplog.text
    assert new is not None and new[name].shape == () == tiny_model()[name].shape
    api.configure(3, new)  # the next round takes every reply
    trained = client_models(new, 2, seed=3)
    replies = [api.reply(m, n, node=i + 1) for i, (m, n) in enumerate(zip(trained, GOOD_EXAMPLES))]
    again, _ = api.aggregate(3, replies)
    assert again is not None and again[name].shape == ()
    assert "LIPS: ignoring" not in caplog.text


@api_param
@pytest.mark.parametrize(("dtype", "odd"), [("int32", 3), ("float16", 3), ("bool", 3), ("int32", 5),
                                            ("float16", 5)])
def test_odd_dtypes_from_most_replies_do_not_narrow_the_honest_ones(api, dtype, odd, caplog):
    """Issue 28, 3: 3 (or all 5) of 5 replies in int32, float16 or bool for float32 layers, listed first.

    Before: they won the dtype vote: the float32 replies were cast to int32 (and
    the model became float64), to float16 (the model too), or to 0/1 (bool
    counted as a number). Now every reply is aggregated in the model's dtypes;
    a bool for a float layer drops the reply.
    """
    api = api()
    model = tiny_model()
    api.configure(2, model)
    trained = client_models(model, 5, seed=2)
    sent = [{k: v.astype(dtype) if v.dtype == np.float32 else v for k, v in m.items()}
            if i < odd else m for i, m in enumerate(trained)]
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(2, [api.reply(m, 10, node=i + 1) for i, m in enumerate(sent)])
    if dtype == "bool":
        for node in (1, 2, 3):
            assert (f"ignoring reply from {api.who(node)}: array 'conv1.weight' has dtype bool, not a "
                    "real number type for the model's float32") in caplog.text
        kept = trained[odd:]
    else:
        assert "LIPS: ignoring" not in caplog.text
        kept = [{k: v.astype(model[k].dtype) for k, v in m.items()} for m in sent]
    expected = fedavg_of(kept, [10] * len(kept))
    for name, array in model.items():
        if array.dtype == np.float32:
            assert new[name].dtype == np.float32, name
            np.testing.assert_allclose(new[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_replies_in_what_flower_made_of_their_dtype_are_aggregated_as_sent():
    """The exceptions to the model's dtypes: 64-bit integers or float32 for a float64 model, from every
    reply.

    Flower's FedAvg makes integer buffers float64 and FedAdam makes a float32
    model float64, while clients go on sending their own dtypes: no cast, and
    the same dtype map (the fast path of the next round). Anything else, and
    any mix, is cast to the model's dtype; narrower integers too (see
    :func:`test_narrow_integer_replies_are_cast_before_flowers_legacy_aggregate`).
    """
    f64, f32, f16, i64, i32, u64, i8 = map(np.dtype, (np.float64, np.float32, np.float16, np.int64, np.int32,
                                                       np.uint64, np.int8))
    model = {"w": f64, "n": f64, "u": f64, "i": i64}
    as_sent = {"w": f32, "n": i64, "u": u64, "i": i64}
    assert round_dtypes([as_sent, as_sent], model) == (as_sent, False)
    assert round_dtypes([as_sent, as_sent], model)[0] is as_sent
    assert round_dtypes([model, model], model) == (model, False)
    assert round_dtypes([as_sent, model], model) == ({"w": f64, "n": f64, "u": f64, "i": i64}, True)
    for narrow, chosen in (({"w": f16, "n": i64, "u": u64, "i": i32}, {"w": f64, "n": i64, "u": u64, "i": i64}),
                           ({"w": f32, "n": i32, "u": i8, "i": f64}, {"w": f32, "n": f64, "u": f64, "i": i64})):
        assert round_dtypes([narrow, narrow], model) == (chosen, True)
    assert round_dtypes([{"w": f64}], {"w": f32}) == ({"w": f32}, True)  # wider than the model: cast
    assert round_dtypes([{"i": i32}] * 2, {"i": i64}) == ({"i": i64}, True)  # narrower integers: cast


@pytest.mark.parametrize(("model_dtype", "sent", "inplace"), [
    ("float64", "int8", False), ("int64", "int16", False), ("float64", "int32", False), ("float64", "int8", True),
])
def test_narrow_integer_replies_are_cast_before_flowers_legacy_aggregate(model_dtype, sent, inplace):
    """Before: every reply's narrow integers were kept as sent (they cast safely to the model's
    dtype), and Flower's legacy ``aggregate`` multiplies ``layer * num_examples`` in the reply's
    dtype: int8 or int16 by 10**8 raised OverflowError out of aggregate_fit (the run ended), int32
    wrapped silently; ``inplace`` FedAvg cast the weight 1/3 to int8, 0. Now they are cast to the
    model's dtype first."""
    model = tiny_model()
    model["bn1.num_batches_tracked"] = np.array(7, dtype=model_dtype)  # float64: what FedAvgM made of it
    names = list(model)
    strategy = LegacyLIPS(LegacyFedAvg(inplace=inplace), param_names=names, num_rounds=NUM_ROUNDS, tau0=0.0)
    strategy.configure_fit(1, ndarrays_to_parameters(list(model.values())), client_manager(3))
    trained = client_models(model, 3, seed=1)
    for i, sent_model in enumerate(trained):
        sent_model["bn1.num_batches_tracked"] = np.array(100 + i, dtype=sent)
    new, _ = strategy.aggregate_fit(1, [fit_result(m, 10**8, str(i + 1)) for i, m in enumerate(trained)], [])
    assert params_to_model(new, names)["bn1.num_batches_tracked"] == pytest.approx(101)


# --------------------------------------------------------------------------- empty / failed rounds
@api_param
def test_empty_round_returns_no_model_and_the_next_round_works(api, caplog):
    api = api()
    model = tiny_model()
    api.configure(1, model)
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(1, [])
    assert new is None
    assert "round 1 has no aggregate (no usable reply): nothing masked" in caplog.text
    api.configure(2, model)
    trained = client_models(model, 2, seed=2)
    new, metrics = api.aggregate(2, [api.reply(m, n, i) for i, (m, n) in enumerate(zip(trained, GOOD_EXAMPLES))])
    assert_is_fedavg_of_good(new, trained)
    assert metrics["lips-mask-round"] == 0


@api_param
def test_all_clients_failed(api, caplog):
    api = api()
    model = tiny_model()
    api.configure(1, model)
    with caplog.at_level(logging.WARNING):
        if api.name == "message":
            new, metrics = api.aggregate(1, [api.failed(1), api.failed(2)])
        else:
            new, metrics = api.aggregate(1, [], [api.failed(1), api.failed(2)])
    assert new is None
    assert "round 1 has no aggregate" in caplog.text


@api_param
def test_all_replies_rejected_is_an_empty_round(api, caplog):
    api = api()
    model = tiny_model()
    api.configure(1, model)
    bad = [{**m, "fc.bias": np.full_like(m["fc.bias"], np.nan)} for m in client_models(model, 2, seed=1)]
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(1, [api.reply(m, 10, node=i + 1) for i, m in enumerate(bad)])
    assert new is None
    assert caplog.text.count("NaN or Inf in arrays ['fc.bias']") == 2
    assert "round 1 has no aggregate" in caplog.text


# --------------------------------------------------------------------------- num-examples
@api_param
@pytest.mark.parametrize(
    "value",
    [-5, 0, float("nan"), float("inf"), 2**60],
    ids=["negative", "zero", "nan", "inf", "absurd"],
)
def test_bad_num_examples_is_rejected(api, value, caplog):
    api = api()
    with caplog.at_level(logging.WARNING):
        good, new, _ = round_with_one_bad_reply(api, dict, num_examples=value)
    assert api.who(7) in caplog.text
    assert f"{api.weight} is {value!r}: it must be > 0 and <= 2**53" in caplog.text
    assert_is_fedavg_of_good(new, good)


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        (None, "expected one MetricRecord, got 0"),
        ([MetricRecord({"num-examples": 10}), MetricRecord({"loss": 1.0})],
         "expected one MetricRecord, got 2"),
        ([MetricRecord({"train-loss": 0.5})], "no 'num-examples' in its metrics"),
        ([MetricRecord({"num-examples": [10, 20]})], "'num-examples' is [10, 20], not a number"),
    ],
    ids=["no-metric-record", "two-metric-records", "missing-key", "list"],
)
def test_reply_without_a_usable_weight_is_rejected_instead_of_stopping_the_run(metrics, reason, caplog):
    """Flower's FedAvg raises InconsistentMessageReplies (ending the run); LIPS drops the reply first."""
    model = tiny_model()
    good = client_models(model, 2, seed=2)
    content = {"arrays": to_record(good[0])}
    for i, record in enumerate(metrics or []):
        content[f"metrics{i}"] = record
    make_bad = lambda: message_with(RecordDict(content), 7)  # noqa: E731
    make_good = lambda: [reply(m, n, node_id=i + 1) for i, (m, n) in enumerate(zip(good, GOOD_EXAMPLES))]  # noqa: E731
    plain = FedAvg()
    with pytest.raises(InconsistentMessageReplies):
        plain.aggregate_train(2, make_good() + [make_bad()])
    api = MessageAPI()
    api.configure(2, model)
    with caplog.at_level(logging.WARNING):
        new, _ = api.aggregate(2, make_good() + [make_bad()])
    assert f"node 7: {reason}" in caplog.text
    assert_is_fedavg_of_good(new, good)


def test_weight_key_follows_the_inner_strategy():
    """FedAvg(weighted_by_key=...) is honoured, below DP wrappers too."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    api = MessageAPI(LIPS(DifferentialPrivacyServerSideFixedClipping(
        FedAvg(weighted_by_key="samples"), 0.0, 100.0, 3), num_rounds=NUM_ROUNDS))
    assert api.strategy._weight_key() == "samples"
    assert LIPSFedAvg(weighted_by_key="n").\
        _weight_key() == "n"


# --------------------------------------------------------------------------- hyperparameters
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tau0": float("inf")}, r"`tau0` must be in \[0, 1\)"),
        ({"tau0": "0.5"}, r"`tau0` must be a number in \[0, 1\)"),
        ({"tau0": True}, r"`tau0` must be a number in \[0, 1\)"),
        ({"every": -1}, r"`every` must be an integer >= 1"),
        ({"every": 2.5}, r"`every` must be an integer >= 1"),
        ({"every": True}, r"`every` must be an integer >= 1"),
        ({"num_rounds": -1}, r"`num_rounds` must be an integer >= 1"),
        ({"num_rounds": True}, r"`num_rounds` must be an integer >= 1"),
        ({"start_round": 11}, r"`start_round` must be <= num_rounds \(10\)"),
        ({"score": "Sensitivity"}, r"`score` must be one of"),
        ({"layers": "MIDDLE"}, r"`layers` must be one of"),
        ({"layers": ["conv2.weight", 3]}, r"`layers` must be one of"),
    ],
)
@pytest.mark.parametrize("make", [
    lambda **kw: LIPS(FedAvg(), **kw),
    lambda **kw: LIPSFedAvg(**kw),
    lambda **kw: LegacyLIPS(LegacyFedAvg(), **kw),
    lambda **kw: LegacyLIPSFedAvg(**kw),
], ids=["LIPS", "LIPSFedAvg", "LegacyLIPS", "LegacyLIPSFedAvg"])
def test_out_of_range_hyperparameters_raise_at_construction(make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**{"num_rounds": 10, **kwargs})


def test_start_with_num_rounds_below_one_fails_before_the_grid_is_used():
    strategy = LIPS(FedAvg())
    g = grid()
    with pytest.raises(ValueError, match=r"`num_rounds` must be an integer >= 1, got 0"):
        strategy.start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=0)
    g.send_and_receive.assert_not_called()
    assert strategy.core.num_rounds is None and strategy._lips_previous is None


@api_param
def test_unknown_layer_names_fail_before_any_state_changes(api):
    model = tiny_model()
    if api is MessageAPI:
        inner = FedAvg()
        inner.configure_train = Mock(side_effect=inner.configure_train)
        strategy = LIPS(inner, num_rounds=NUM_ROUNDS, layers=["conv2.weight", "conv9.*"])
        configure = inner.configure_train
    else:
        inner = LegacyFedAvg()
        inner.configure_fit = Mock(side_effect=inner.configure_fit)
        strategy = LegacyLIPS(inner, param_names=NAMES, num_rounds=NUM_ROUNDS,
                              layers=["conv2.weight", "conv9.*"])
        configure = inner.configure_fit
    with pytest.raises(ValueError, match=r"'conv9\.\*' matches no eligible tensor"):
        api(strategy).configure(1, model)
    assert strategy._lips_previous is None
    configure.assert_not_called()


# --------------------------------------------------------------------------- bad aggregates
class NaNFedAvg(FedAvg):
    """A Message API strategy whose aggregate has a NaN (no LIPS-side filtering can prevent it)."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        bias = arrays["fc.bias"].numpy()
        bias[0] = np.nan
        arrays["fc.bias"] = Array(bias)
        return arrays, metrics


class LegacyNaNFedAvg(LegacyFedAvg):
    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        arrays = params_to_model(parameters, NAMES)
        arrays["fc.bias"][0] = np.nan
        return ndarrays_to_parameters(list(arrays.values())), metrics


@api_param
def test_nonfinite_aggregate_of_the_wrapped_strategy_is_never_broadcast(api, caplog):
    """The wrapped strategy itself makes NaN (no reply explains it): no model leaves the server.

    Before the robustness issue the aggregate was returned unchanged (unmasked);
    now an aggregate that is not finite is never broadcast: the round keeps
    the previous global model, with an ERROR naming the strategy and tensors.
    """
    inner = NaNFedAvg() if api is MessageAPI else LegacyNaNFedAvg()
    if api is MessageAPI:
        wrapped = LIPS(inner, num_rounds=NUM_ROUNDS)
    else:
        wrapped = LegacyLIPS(inner, param_names=NAMES, num_rounds=NUM_ROUNDS)
    driver = api(wrapped)
    model = tiny_model()
    trained = client_models(model, 2, seed=1)
    replies = [driver.reply(m, n, i + 1) for i, (m, n) in enumerate(zip(trained, GOOD_EXAMPLES))]
    driver.configure(1, model)
    with caplog.at_level(logging.ERROR):
        new, metrics = driver.aggregate(1, replies)
    name = type(inner).__name__
    assert (f"LIPS: round 1: the aggregate of {name} has NaN or Inf in ['fc.bias'] and no reply "
            "explains it; it is not broadcast") in caplog.text
    assert new is None
    assert not any(key.startswith("lips-") for key in (metrics or {}))


def test_nonfinite_previous_model_skips_the_mask():
    """A NaN in the previous global model makes dw NaN: the round is not masked."""
    model = tiny_model()
    previous = {k: v.copy() for k, v in model.items()}
    previous["conv2.weight"].reshape(-1)[3] = np.nan
    outcome = LIPSCore(num_rounds=NUM_ROUNDS).round(1, model, previous)
    masked, metrics, reasons = outcome.model, outcome.metrics, [outcome.problem]
    assert masked is None and metrics["lips-skipped"] == 1
    assert reasons == ["the update dw (aggregate - previous global model) has NaN or Inf "
                       "in ['conv2.weight']"]
    # the score that needs no dw masks the same round
    outcome = LIPSCore(num_rounds=NUM_ROUNDS, score="magnitude").round(1, model, previous)
    masked, metrics = outcome.model, outcome.metrics
    assert masked is not None and "lips-skipped" not in metrics
