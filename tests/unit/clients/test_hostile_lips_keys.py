"""Issue 28, defect 10: a hostile ``lips-*`` value is the mod's error reply naming the key, never a crash.

Before: ``lips-round=inf`` and ``lips-seed=inf`` raised ``OverflowError`` out of
``lips_mod``, ``lips-layers`` nested 100,000 deep ``RecursionError``;
``lips-layers='[7.9, 8]'`` was taken as ``[7, 8]`` and ``lips-round=True`` as
round 1. Under the legacy API the same values make ``LIPSNumPyClient.fit``
raise a ``ValueError`` naming the key (Flower's error reply carries it).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import MessageType

from flower_fakes import task_identity, tiny_model  # noqa: F401
from lips_flwr.clients import LIPSNumPyClient, lips_mod
from lips_flwr.protocol import parse_train_config
from test_client_persist import chain, new_run_context
from test_clients import LAYERS, NAMES, FakeApp, UserClient, context, lips_config, message

pytestmark = pytest.mark.usefixtures("task_identity")
DEEP = "[" * 100_000 + "]" * 100_000

# (key, hostile value): each must be refused naming its key.
HOSTILE = [
    ("lips-round", float("inf")), ("lips-round", float("-inf")), ("lips-round", float("nan")),
    ("lips-round", 1e300), ("lips-round", 2.5), ("lips-round", 2.0), ("lips-round", True),
    ("lips-round", False), ("lips-round", "2"), ("lips-round", 0), ("lips-round", -3),
    ("lips-round", 2**63), ("lips-round", b"\x02"),
    ("lips-seed", float("inf")), ("lips-seed", float("nan")), ("lips-seed", 1.5), ("lips-seed", True),
    ("lips-seed", -1), ("lips-seed", "0"),
    ("lips-layers", DEEP), ("lips-layers", "[7.9, 8]"), ("lips-layers", "[8, 7.0]"),
    ("lips-layers", "[1e1]"), ("lips-layers", "[-1]"), ("lips-layers", "[true]"),
    ("lips-layers", "[[2], 3]"), ("lips-layers", '{"a": 1}'), ("lips-layers", "[2, 2]"),
    ("lips-layers", "[" + "9" * 5000 + "]"), ("lips-layers", "[" + "1," * 600_000 + "1]"),
    ("lips-layers", "[1,\u00a02]"), ("lips-layers", 7), ("lips-layers", b"[2]"),
    ("lips-tau", True), ("lips-tau", "0.3"),
    ("lips-mode", "x" * 10_000), ("lips-score", 3),
]


def hostile_config(key: str, value: object) -> dict:
    """A client-mode mask round's config (valid) with one key replaced."""
    return {**lips_config(2, tau=0.3), key: value}


def _ids(case) -> str:
    key, value = case
    return f"{key}={value!r}"[:40]


@pytest.mark.parametrize("case", HOSTILE, ids=_ids)
def test_the_parser_names_the_key(case):
    key, value = case
    with pytest.raises(ValueError, match=f"malformed lips-\\* keys in the train config: {key} ") as info:
        parse_train_config(hostile_config(key, value))
    assert len(str(info.value)) < 300  # a hostile value does not flood the log


@pytest.mark.parametrize("case", HOSTILE, ids=_ids)
def test_lips_mod_replies_with_its_error_naming_the_key(case):
    key, value = case
    app, ctx = FakeApp(), context()
    reply = lips_mod(message(tiny_model(2), hostile_config(key, value)), ctx, app)
    assert reply.has_error() and key in reply.error.reason and reply.error.reason.startswith("lips_mod:")
    assert app.received == []  # nothing trained on a config it could not read


@pytest.mark.parametrize("case", HOSTILE[:3] + [("lips-round", True), ("lips-layers", DEEP)], ids=_ids)
def test_the_whole_mod_chain_replies_with_the_error(tmp_path, case):
    """persistent_state_mod and fedbn_mod come first: neither may fail on the value."""
    key, value = case
    reply = chain(message(tiny_model(2), {**hostile_config(key, value), "lips-run-key": "a" * 32}),
                  new_run_context(tmp_path), FakeApp())
    assert reply.has_error() and key in reply.error.reason


@pytest.mark.parametrize("case", HOSTILE, ids=_ids)
def test_numpy_client_raises_a_value_error_naming_the_key(case):
    key, value = case
    app = FakeApp()
    client = LIPSNumPyClient(UserClient(app), context(), param_names=NAMES)
    with pytest.raises(ValueError, match=f"{key} "):
        client.fit(list(tiny_model(2).values()), hostile_config(key, value))
    assert app.received == []


def test_an_evaluate_message_with_a_hostile_round_is_passed_on(tmp_path):
    """An evaluate config is not parsed for masking; persisting reads only an int round."""
    app = FakeApp()
    for value in (float("inf"), True, DEEP):
        reply = chain(message(tiny_model(1), {"lips-round": value, "lips-run-key": "a" * 32},
                              MessageType.EVALUATE), new_run_context(tmp_path), app)
        assert not reply.has_error() and reply.content["metrics"]["acc"] == 1.0


@pytest.mark.parametrize("layers", [LAYERS, " [ 2 , 4 ] ", json.dumps([2, 4], indent=2), "[]"])
def test_what_a_lips_server_sends_still_parses(layers):
    parsed = parse_train_config({**lips_config(2, tau=0.3), "lips-layers": layers,
                                 "lips-seed": 2**63 - 1, "lips-tau": 0})
    assert parsed is not None and parsed.layers == tuple(json.loads(layers)) and parsed.seed == 2**63 - 1
    assert parsed.tau == 0.0 and isinstance(parsed.tau, float)


def test_a_valid_mask_round_still_masks():
    app, ctx = FakeApp(), context()
    reply = lips_mod(message(tiny_model(2), lips_config(2, tau=0.3)), ctx, app)
    assert not reply.has_error()
    assert reply.content["metrics"]["lips-client-zeros"] > 0
    assert np.count_nonzero(app.received[0]["conv2.weight"] == 0) > 0
