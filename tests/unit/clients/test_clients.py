"""Client side: Message API mods and the legacy NumPyClient wrapper, on real records."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.client import NumPyClient

from flower_fakes import MIDDLE, task_identity, tiny_model, to_numpy, to_record  # noqa: F401
from lips_flwr.clients import LIPSNumPyClient, fedbn_mod, lips_mod, make_fedbn_mod
from lips_flwr.core.layers import batch_norm_names
from lips_flwr.protocol import parse_train_config as parse_round

pytestmark = pytest.mark.usefixtures("task_identity")
NAMES = list(tiny_model())
LAYERS = json.dumps([NAMES.index(n) for n in MIDDLE])


def context() -> Context:
    return Context(run_id=1, node_id=42, node_config={}, state=RecordDict(), run_config={})


def lips_config(rnd: int, tau: float = 0.0, mode: str = "client") -> dict:
    config = {"lips-round": rnd, "lips-mode": mode, "lips-tau": tau}
    if tau > 0:
        config.update({"lips-score": "sensitivity", "lips-seed": 0, "lips-layers": LAYERS})
    return config


def message(model: dict, config: dict, kind: str = MessageType.TRAIN) -> Message:
    content = RecordDict({"arrays": to_record(model), "config": ConfigRecord(config)})
    return Message(content=content, dst_node_id=42, message_type=kind)


class FakeApp:
    """A ClientApp train function: adds a fixed update to every float tensor."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.received: list[dict] = []

    def update_for(self, model):
        return {k: self.rng.normal(scale=0.1, size=v.shape).astype(v.dtype)
                for k, v in model.items() if np.issubdtype(v.dtype, np.floating)}

    def __call__(self, msg: Message, ctx: Context) -> Message:
        received = to_numpy(msg.content["arrays"])
        self.received.append(received)
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return Message(RecordDict({"metrics": MetricRecord({"acc": 1.0})}), reply_to=msg)
        self.last_update = self.update_for(received)
        trained = {k: v + self.last_update.get(k, 0) for k, v in received.items()}
        content = RecordDict({"arrays": to_record(trained),
                              "metrics": MetricRecord({"num-examples": 10})})
        return Message(content, reply_to=msg)


def test_lips_mod_reports_update_norms_and_keeps_server_mode_models_intact():
    app, ctx, model = FakeApp(), context(), tiny_model()
    reply = lips_mod(message(model, lips_config(1, mode="server")), ctx, app)
    for name in NAMES:
        np.testing.assert_array_equal(app.received[0][name], model[name])
    metrics = reply.content["metrics"]
    expected = np.linalg.norm(app.last_update["conv2.weight"].astype(np.float64))
    assert metrics["lips-update-norm/conv2.weight"] == pytest.approx(expected, rel=1e-5)
    assert "lips-update-norm/bn1.weight" not in metrics  # candidates only
    assert metrics["num-examples"] == 10
    assert "lips-signal" not in ctx.state  # only client mode needs the signal


def test_server_mode_reports_the_update_norms_of_client_mode_without_making_the_updates(monkeypatch):
    from lips_flwr.clients import state
    from lips_flwr.core.client_masking import local_update

    model = tiny_model()
    trained = {k: v + FakeApp().update_for(model).get(k, 0) for k, v in model.items()}
    kept = state.after_training(RecordDict(), model, trained, parse_round(lips_config(1, mode="client")))

    def refuse(*args):
        raise AssertionError("server mode made the updates")

    monkeypatch.setattr(state, "iter_local_update", refuse)
    reported = state.after_training(RecordDict(), model, trained, parse_round(lips_config(1, mode="server")))
    assert reported == kept  # every norm, bit for bit
    per_layer = {f"lips-update-norm/{name}" for name in local_update(model, trained)}
    assert set(reported) == {"lips-update-norm", *per_layer}


def test_client_mode_first_round_falls_back_to_magnitude():
    app, ctx, model = FakeApp(), context(), tiny_model()
    reply = lips_mod(message(model, lips_config(1, tau=0.5)), ctx, app)
    got = app.received[0]
    for name in NAMES:
        if name in MIDDLE:
            k = math.ceil(model[name].size * 0.5)
            zeroed = got[name] == 0
            assert zeroed.sum() == k
            assert np.abs(model[name][zeroed]).max() <= np.abs(model[name][~zeroed]).min()
        else:
            np.testing.assert_array_equal(got[name], model[name])
    assert reply.content["metrics"]["lips-client-fallback"] == 1.0
    assert reply.content["metrics"]["lips-client-zeros"] == sum(
        math.ceil(model[n].size * 0.5) for n in MIDDLE)
    assert "lips-signal" in ctx.state


def test_client_mode_uses_last_rounds_update_as_the_signal():
    app, ctx, model = FakeApp(), context(), tiny_model()
    lips_mod(message(model, lips_config(1)), ctx, app)  # not a mask round: stores the update
    signal = app.last_update
    reply = lips_mod(message(model, lips_config(2, tau=0.4)), ctx, app)
    assert reply.content["metrics"]["lips-client-fallback"] == 0.0
    for name in MIDDLE:
        zeroed = app.received[1][name] == 0
        assert zeroed.sum() == math.ceil(model[name].size * 0.4)
        score = np.abs(signal[name] * model[name])
        assert score[zeroed].max() <= score[~zeroed].min()


def test_client_mode_stale_signal_falls_back():
    app, ctx, model = FakeApp(), context(), tiny_model()
    lips_mod(message(model, lips_config(1)), ctx, app)
    reply = lips_mod(message(model, lips_config(3, tau=0.4)), ctx, app)  # skipped round 2
    assert reply.content["metrics"]["lips-client-fallback"] == 1.0
    assert all((app.received[1][n] == 0).sum() < app.received[1][n].size for n in MIDDLE)


def test_lips_mod_ignores_other_messages_and_reports_bad_config():
    app, ctx, model = FakeApp(), context(), tiny_model()
    reply = lips_mod(message(model, lips_config(1, tau=0.5), MessageType.EVALUATE), ctx, app)
    np.testing.assert_array_equal(app.received[0]["conv2.weight"], model["conv2.weight"])
    assert reply.content["metrics"]["acc"] == 1.0
    bad = lips_config(1, tau=0.5)
    bad["lips-layers"] = json.dumps([999])
    reply = lips_mod(message(model, bad), ctx, app)
    assert reply.has_error() and "positions [999]" in reply.error.reason


def test_fedbn_mod_keeps_batch_norm_local_for_train_and_evaluate():
    app, ctx = FakeApp(), context()
    first, second = tiny_model(0), tiny_model(1)
    fedbn_mod(message(first, {}), ctx, app)
    trained_bn = {n: app.received[0][n] + app.last_update.get(n, 0) for n in batch_norm_names(first)}
    fedbn_mod(message(second, {}, MessageType.EVALUATE), ctx, app)
    fedbn_mod(message(second, {}), ctx, app)
    for got in app.received[1:]:
        for name in NAMES:
            expected = trained_bn[name] if name in trained_bn else second[name]
            np.testing.assert_array_equal(got[name], expected)


def test_custom_local_tensors():
    app, ctx = FakeApp(), context()
    mod = make_fedbn_mod(local=["fc.*"])
    mod(message(tiny_model(0), {}), ctx, app)
    mod(message(tiny_model(1), {}), ctx, app)
    assert not np.array_equal(app.received[1]["fc.weight"], tiny_model(1)["fc.weight"])
    np.testing.assert_array_equal(app.received[1]["bn1.weight"], tiny_model(1)["bn1.weight"])


class UserClient(NumPyClient):
    """Someone else's NumPyClient: trains by adding a fixed update."""

    def __init__(self, app: FakeApp) -> None:
        self.app = app

    def fit(self, parameters, config):
        received = dict(zip(NAMES, parameters))
        self.app.received.append(received)
        self.app.last_update = self.app.update_for(received)
        return [v + self.app.last_update.get(k, 0) for k, v in received.items()], 10, {"loss": 0.1}

    def evaluate(self, parameters, config):
        self.app.received.append(dict(zip(NAMES, parameters)))
        return 0.5, 10, {}


def test_numpy_client_masks_like_the_mod():
    """Same received model, same signal and config: identical masks in both APIs."""
    model = tiny_model()
    app_mod, ctx_mod = FakeApp(seed=3), context()
    lips_mod(message(model, lips_config(1)), ctx_mod, app_mod)
    lips_mod(message(model, lips_config(2, tau=0.3)), ctx_mod, app_mod)

    app_np, ctx_np = FakeApp(seed=3), context()
    for rnd, tau in ((1, 0.0), (2, 0.3)):
        client = LIPSNumPyClient(UserClient(app_np), ctx_np, param_names=NAMES)  # ephemeral
        _, _, metrics = client.fit(list(model.values()), lips_config(rnd, tau))
    assert metrics["loss"] == 0.1 and metrics["lips-client-fallback"] == 0.0
    for name in NAMES:
        np.testing.assert_array_equal(app_np.received[1][name], app_mod.received[1][name])


def test_numpy_client_without_names_uses_positions():
    app, ctx, model = FakeApp(), context(), tiny_model()
    client = LIPSNumPyClient(UserClient(app), ctx)
    _, _, metrics = client.fit(list(model.values()), lips_config(1, tau=0.5))
    assert metrics["lips-client-zeros"] > 0
    assert f"lips-update-norm/{NAMES.index('conv2.weight')}" in metrics


def test_numpy_client_fedbn():
    app, ctx = FakeApp(), context()
    LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local="batchnorm").fit(
        list(tiny_model(0).values()), {})
    trained_bn = {n: app.received[0][n] + app.last_update.get(n, 0)
                  for n in batch_norm_names(tiny_model(0))}
    LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local="batchnorm").evaluate(
        list(tiny_model(1).values()), {})
    for name in NAMES:
        expected = trained_bn.get(name, tiny_model(1)[name])
        np.testing.assert_array_equal(app.received[1][name], expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"keep_local": "batchnorm"}, "needs `param_names`"),
        ({"keep_local": "batchnorm", "param_names": ["a.weight", "b.weight"]}, "found no batch norm"),
        ({"keep_local": "everything", "param_names": NAMES}, "must be 'batchnorm' or a sequence"),
        ({"keep_local": [99], "param_names": NAMES}, r"positions \[99\] are outside"),
        ({"keep_local": ["bn9.*"], "param_names": NAMES}, r"patterns \['bn9.\*'\] match no name"),
        ({"param_names": "conv1.weight"}, "not one string"),
    ],
)
def test_numpy_client_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LIPSNumPyClient(UserClient(FakeApp()), context(), **kwargs)


def test_numpy_client_reports_wrong_array_count():
    client = LIPSNumPyClient(UserClient(FakeApp()), context(), param_names=NAMES)
    with pytest.raises(ValueError, match="server sent 3 arrays"):
        client.fit([np.zeros(1)] * 3, {})


def test_keep_local_positions_map_through_the_names():
    app, ctx = FakeApp(), context()
    position = NAMES.index("fc.bias")
    client = LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local=[position])
    client.fit(list(tiny_model(0).values()), {})
    trained = app.received[0]["fc.bias"] + app.last_update["fc.bias"]
    client.evaluate(list(tiny_model(1).values()), {})
    np.testing.assert_array_equal(app.received[1]["fc.bias"], trained)


def test_only_the_user_clients_optional_methods_are_exposed():
    try:
        from flwr.compat.client.numpy_client import has_evaluate, has_get_parameters
    except ImportError:  # Flower < 1.2x kept it in flwr.client
        from flwr.client.numpy_client import has_evaluate, has_get_parameters

    class FitOnly(NumPyClient):
        def fit(self, parameters, config):
            return parameters, 1, {}

    wrapped = LIPSNumPyClient(FitOnly(), context())
    assert not has_evaluate(wrapped) and not has_get_parameters(wrapped)
    assert has_evaluate(LIPSNumPyClient(UserClient(FakeApp()), context()))
    wrapped.to_client()  # still a valid client


def test_subclassing_runs_lips_around_the_users_fit():
    class LIPSUserClient(LIPSNumPyClient, UserClient):
        def __init__(self, context, app):
            UserClient.__init__(self, app)
            LIPSNumPyClient.__init__(self, context=context, param_names=NAMES)

    app, ctx, model = FakeApp(), context(), tiny_model()
    _, _, metrics = LIPSUserClient(ctx, app).fit(list(model.values()), lips_config(1, tau=0.5))
    assert metrics["loss"] == 0.1 and metrics["lips-client-zeros"] > 0
    assert (app.received[0]["conv2.weight"] == 0).sum() == math.ceil(model["conv2.weight"].size * 0.5)
    _, _, metrics = LIPSUserClient(ctx, app).fit(list(model.values()), lips_config(2, tau=0.4))
    assert metrics["lips-client-fallback"] == 0.0  # the signal survived the new object
    with pytest.raises(ValueError, match="`client` is required"):
        LIPSNumPyClient(context=ctx)


def test_lips_mod_handles_named_train_actions_and_reordered_replies():
    app, ctx, model = FakeApp(), context(), tiny_model()
    reply = lips_mod(message(model, lips_config(1, tau=0.5), "train.finetune"), ctx, app)
    assert (app.received[0]["conv2.weight"] == 0).sum() > 0
    assert "lips-update-norm" in reply.content["metrics"]

    def reordering_app(msg, ctx):
        out = app(msg, ctx)
        arrays = out.content["arrays"]
        out.content["arrays"] = to_record(dict(reversed(list(to_numpy(arrays).items()))))
        return out

    reply = lips_mod(message(model, lips_config(2)), ctx, reordering_app)
    assert "lips-update-norm" in reply.content["metrics"]


def test_client_mode_random_mask_is_the_same_in_every_run_of_a_simulation():
    """Simulated node ids are random per `flwr run`; the partition id is not: the random
    score's seed must come from the latter, or the same seed gives other masks in each run."""
    config = {**lips_config(1, tau=0.5), "lips-score": "random", "lips-seed": 7}
    masks = []
    for node_id in (42, 987654321):  # the same client (partition 3) in two runs
        app = FakeApp()
        ctx = Context(run_id=1, node_id=node_id, node_config={"partition-id": 3},
                      state=RecordDict(), run_config={})
        lips_mod(message(tiny_model(), config), ctx, app)
        app_np = FakeApp()
        ctx_np = Context(run_id=1, node_id=node_id, node_config={"partition-id": 3},
                         state=RecordDict(), run_config={})
        LIPSNumPyClient(UserClient(app_np), ctx_np, param_names=NAMES).fit(
            list(tiny_model().values()), config)
        np.testing.assert_array_equal(app.received[0]["conv2.weight"] == 0,
                                      app_np.received[0]["conv2.weight"] == 0)
        masks.append(app.received[0]["conv2.weight"] == 0)
    np.testing.assert_array_equal(masks[0], masks[1])
    other = Context(run_id=1, node_id=42, node_config={"partition-id": 4}, state=RecordDict(), run_config={})
    app = FakeApp()
    lips_mod(message(tiny_model(), config), other, app)
    assert not np.array_equal(app.received[0]["conv2.weight"] == 0, masks[0])  # another client differs


@pytest.mark.parametrize("local", [None, ["head.*"]])
def test_fedbn_mod_says_once_that_a_model_without_batch_norm_has_nothing_to_keep(local, caplog):
    """Issue 35: on a model without batch-norm layers the mod was silently FedAvg."""
    app, ctx = FakeApp(), context()
    mod = make_fedbn_mod(local=local)
    plain = {k: v for k, v in tiny_model(0).items() if not k.startswith("bn")}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for kind in (MessageType.TRAIN, MessageType.EVALUATE, MessageType.TRAIN):
            mod(message(plain, {}, kind), ctx, app)
    told = [r.getMessage() for r in caplog.records if "nothing to keep local" in r.getMessage()]
    assert len(told) == 1
    assert ("no batch-norm layers" if local is None else "matches local=['head.*']") in told[0]
    for got in app.received:  # passed through as sent
        for name in plain:
            np.testing.assert_array_equal(got[name], plain[name])


def test_fedbn_mod_on_a_batch_norm_model_says_nothing(caplog):
    app, ctx = FakeApp(), context()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        make_fedbn_mod()(message(tiny_model(0), {}), ctx, app)
    assert not [r for r in caplog.records if "nothing to keep" in r.getMessage()]


def test_fedbn_mod_finds_a_models_local_names_once_and_again_for_another_model(monkeypatch):
    import lips_flwr.clients.mods as mods

    found = []
    monkeypatch.setattr(mods, "batch_norm_names", lambda arrays: found.append(list(arrays)) or batch_norm_names(arrays))
    app, ctx, mod = FakeApp(), context(), make_fedbn_mod()
    model = tiny_model(0)
    for kind in (MessageType.TRAIN, MessageType.EVALUATE, MessageType.TRAIN):
        mod(message(model, {}, kind), ctx, app)
    assert found == [list(model)]
    other = {f"net.{name}": array for name, array in model.items()}  # another model: its names
    mod(message(other, {}, MessageType.TRAIN), ctx, app)
    assert found == [list(model), list(other)]
    assert all(name in ctx.state["lips-local"] for name in batch_norm_names(other))
