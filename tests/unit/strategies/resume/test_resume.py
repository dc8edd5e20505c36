"""A server that crashes and resumes from its checkpoint ends where the uninterrupted one ends.

Message API: the whole ``Strategy.start`` loop with a fake grid whose clients
answer deterministically from (node, round, model). Legacy API: Flower's own
``Server.fit`` loop with a real ``SimpleClientManager`` and mocked proxies.
Nodes are sampled (half of them per round), so Python's ``random`` state
matters; FedAvgM/FedAdam keep momentum and moments, so the wrapped strategy's
state matters; the inertia series and the mask schedule must continue.
"""

from __future__ import annotations

import logging
import random
from unittest.mock import Mock

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    GetParametersRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAdam as LegacyFedAdam
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.strategy import FedAvgM as LegacyFedAvgM
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideAdaptiveClipping,
    FedAdam,
    FedAvg,
    FedAvgM,
)

from lips_flwr.persistence.checkpoint import load_checkpoint
from lips_flwr.persistence.npz_store import read_groups, write_groups
from lips_flwr.strategies import LIPS, LegacyLIPS, LegacyLIPSFedAvg, LIPSFedAvg
from flower_fakes import Ledger, grid, reply, task_identity, tiny_model, to_numpy, to_record  # noqa: F401

ROUNDS, CRASH_AT = 8, 5  # round 5 is a mask round (every=2): the first resumed round masks
LIPS_KW = dict(tau0=0.5, every=2, inertia_t0=2)
VOLATILE = ("lips-seconds", "lips-checkpoint-seconds")


class Crash(Exception):
    """The server process dies."""


def client_update(model: dict[str, np.ndarray], node: int, server_round: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * node + server_round)
    return {
        k: v + rng.normal(scale=0.05, size=v.shape).astype(v.dtype)
        if np.issubdtype(v.dtype, np.floating) else v.copy()
        for k, v in model.items()
    }


# ----- Message API -----

def message_grid(sampled: list, crash_at: int | None = None, uniform: bool = False):
    g = grid(4)

    def answer(messages, timeout):
        out = []
        for msg in messages:
            server_round = int(msg.content["config"]["server-round"])
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "train":
                if server_round == crash_at:
                    raise Crash()
                sampled.append((server_round, node))
                model = client_update(to_numpy(msg.content["arrays"]), node, server_round)
                out.append(reply(model, 10 if uniform else 10 + node, node_id=node))
            else:
                ev = Mock(spec=Message)
                ev.content = RecordDict({"metrics": MetricRecord({"num-examples": 5, "acc": node / 10})})
                ev.has_error.return_value = False
                ev.metadata.src_node_id = node
                out.append(ev)
        return out

    g.send_and_receive.side_effect = answer
    return g


INNER = {
    "FedAvg": lambda: FedAvg(fraction_train=0.5, fraction_evaluate=0.5, min_available_nodes=4),
    "FedAvgM": lambda: FedAvgM(server_momentum=0.9, fraction_train=0.5, fraction_evaluate=0.5,
                               min_available_nodes=4),
    "FedAdam": lambda: FedAdam(eta=0.05, fraction_train=0.5, fraction_evaluate=0.5,
                               min_available_nodes=4),
    # Noise from numpy's global RNG; a clipping norm that evolves (a float attribute).
    "DP-adaptive(FedAvgM)": lambda: DifferentialPrivacyServerSideAdaptiveClipping(
        INNER["FedAvgM"](), noise_multiplier=0.05, num_sampled_clients=2, clipped_count_stddev=0.5),
}
MAKE = {name: (lambda name=name, **kw: LIPS(INNER[name](), **LIPS_KW, **kw)) for name in INNER}
MAKE["LIPSFedAvg"] = lambda **kw: LIPSFedAvg(fraction_train=0.5, fraction_evaluate=0.5,
                                             min_available_nodes=4, **LIPS_KW, **kw)


def run_message(make, crash_at=None, seed=7, uniform=False):
    sampled, evaluated = [], []

    def evaluate_fn(server_round, arrays):
        # A centralized evaluation that draws from both RNGs (a random test subset, say).
        evaluated.append(server_round)
        return MetricRecord({"norm": float(sum(np.abs(a).sum() for a in to_numpy(arrays).values())),
                             "draw": random.random() + np.random.random()})

    random.seed(seed)
    np.random.seed(seed)
    result = make().start(grid=message_grid(sampled, crash_at, uniform), initial_arrays=to_record(tiny_model()),
                          num_rounds=ROUNDS, evaluate_fn=evaluate_fn)
    return result, sampled, evaluated


def comparable(metrics: MetricRecord) -> dict:
    return {k: v for k, v in metrics.items() if k not in VOLATILE}


@pytest.mark.parametrize("inner", list(MAKE))
def test_message_api_resume_ends_where_the_uninterrupted_run_ends(tmp_path, task_identity, inner):
    path = tmp_path / "ckpt" / "lips.npz"
    make = MAKE[inner]
    whole, sampled, evaluated = run_message(make)

    with pytest.raises(Crash):
        run_message(lambda: make(checkpoint_path=path), crash_at=CRASH_AT)
    assert load_checkpoint(path).round == CRASH_AT - 1
    with np.load(path) as npz:  # the inertia tracker's previous model is the saved model
        assert not [f for f in npz.files if f.startswith("inertia-previous")]

    resumed, sampled_after, evaluated_after = run_message(
        lambda: make(checkpoint_path=path, resume=True), seed=12345)
    # The RNGs' state came from the checkpoint, not from seed 12345: the same nodes are sampled.
    assert sampled_after == [s for s in sampled if s[0] >= CRASH_AT]
    for name, array in to_numpy(whole.arrays).items():
        np.testing.assert_array_equal(to_numpy(resumed.arrays)[name], array, err_msg=name)
    # The Result covers the whole run: rounds before the crash come from the checkpoint.
    for part in ("train_metrics_clientapp", "evaluate_metrics_clientapp", "evaluate_metrics_serverapp"):
        got, expected = getattr(resumed, part), getattr(whole, part)
        assert sorted(got) == sorted(expected), part
        for r in expected:
            assert comparable(got[r]) == comparable(expected[r]), (part, r)
    assert sorted(resumed.train_metrics_clientapp) == list(range(1, ROUNDS + 1))
    assert resumed.train_metrics_clientapp[CRASH_AT]["lips-mask-round"] == 1
    assert "inertia-cos-t0/conv2.weight" in resumed.train_metrics_clientapp[CRASH_AT]
    # The checkpoint's model was evaluated before the crash: the result comes from the checkpoint.
    assert evaluated_after == list(range(CRASH_AT, ROUNDS + 1))
    assert load_checkpoint(path).round == ROUNDS


def test_message_api_checkpoint_is_written_every_round_with_its_cost(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    rounds_seen = []
    strategy = LIPSFedAvg(checkpoint_path=path, fraction_evaluate=0.0, **LIPS_KW)
    original = strategy._save_checkpoint

    def spy(server_round, model):
        original(server_round, model)
        if path.exists():
            rounds_seen.append(load_checkpoint(path).round)

    strategy._save_checkpoint = spy
    random.seed(0)
    result = strategy.start(grid=message_grid([]), initial_arrays=to_record(tiny_model()),
                            num_rounds=ROUNDS)
    assert sorted(set(rounds_seen)) == list(range(1, ROUNDS + 1))
    assert all("lips-checkpoint-seconds" in result.train_metrics_clientapp[r] for r in range(2, ROUNDS + 1))
    final = load_checkpoint(path)
    for name, array in to_numpy(result.arrays).items():
        np.testing.assert_array_equal(final.model[name], array)


def test_message_api_resume_at_the_last_round_runs_nothing(tmp_path, task_identity, caplog):
    path = tmp_path / "lips.npz"
    whole, _, _ = run_message(lambda: LIPS(FedAvg(fraction_evaluate=0.0), checkpoint_path=path, **LIPS_KW))
    sampled: list = []
    g = message_grid(sampled)
    with caplog.at_level(logging.INFO):
        again = LIPS(FedAvg(fraction_evaluate=0.0), checkpoint_path=path, resume="auto", **LIPS_KW).start(
            grid=g, initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    assert sampled == []
    assert sorted(again.train_metrics_clientapp) == sorted(whole.train_metrics_clientapp)
    for name, array in to_numpy(whole.arrays).items():
        np.testing.assert_array_equal(to_numpy(again.arrays)[name], array)
    assert f"all {ROUNDS} rounds are done, nothing to run" in caplog.text


def test_message_api_auto_without_a_file_starts_fresh_and_true_requires_it(tmp_path, task_identity, caplog):
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.INFO):
        run_message(lambda: LIPS(FedAvg(fraction_evaluate=0.0), checkpoint_path=path, resume="auto", **LIPS_KW))
    assert "no checkpoint at" in caplog.text and load_checkpoint(path).round == ROUNDS
    with pytest.raises(FileNotFoundError):
        run_message(lambda: LIPS(FedAvg(), checkpoint_path=tmp_path / "other.npz", resume=True, **LIPS_KW))


def test_message_api_resume_refuses_other_settings_model_or_strategies(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    run_message(lambda: LIPS(INNER["FedAvgM"](), checkpoint_path=path, **LIPS_KW))
    other = dict(LIPS_KW, tau0=0.3)
    with pytest.raises(ValueError, match="tau0: checkpoint 0.5, now 0.3"):
        run_message(lambda: LIPS(INNER["FedAvgM"](), checkpoint_path=path, resume=True, **other))
    with pytest.raises(ValueError, match="num_rounds: checkpoint 8, now 9"):
        LIPS(INNER["FedAvgM"](), checkpoint_path=path, resume=True, **LIPS_KW).start(
            grid=message_grid([]), initial_arrays=to_record(tiny_model()), num_rounds=9)
    with pytest.raises(ValueError, match="another model"):
        bigger = dict(tiny_model(), extra=np.ones((3, 3), dtype=np.float32))
        LIPS(INNER["FedAvgM"](), checkpoint_path=path, resume=True, **LIPS_KW).start(
            grid=message_grid([]), initial_arrays=to_record(bigger), num_rounds=ROUNDS)
    with pytest.raises(ValueError, match="resume with the same strategies"):
        run_message(lambda: LIPS(INNER["FedAdam"](), checkpoint_path=path, resume=True, **LIPS_KW))


# ----- legacy API -----

NAMES = list(tiny_model())


def legacy_proxy(cid: int, sampled: list) -> ClientProxy:
    proxy = Mock(spec=ClientProxy)
    proxy.cid = str(cid)
    proxy.node_id = cid

    def fit(ins, timeout, group_id):
        server_round = int(ins.config["lips-round"])
        sampled.append((server_round, cid))
        model = dict(zip(NAMES, parameters_to_ndarrays(ins.parameters)))
        trained = client_update(model, cid, server_round)
        return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(list(trained.values())), 10 + cid, {})

    def evaluate(ins, timeout, group_id):
        return EvaluateRes(Status(Code.OK, ""), loss=cid / 10, num_examples=5, metrics={})

    def get_parameters(ins, timeout, group_id):  # the legacy server asks a client without initial_parameters
        return GetParametersRes(Status(Code.OK, ""), ndarrays_to_parameters(list(tiny_model().values())))

    proxy.fit.side_effect = fit
    proxy.evaluate.side_effect = evaluate
    proxy.get_parameters.side_effect = get_parameters
    return proxy


SAMPLING = dict(fraction_fit=0.5, min_fit_clients=2, fraction_evaluate=0.5, min_evaluate_clients=2,
                min_available_clients=4)
LEGACY_INNER = {
    "FedAvg": lambda cfg, ev: LegacyFedAvg(on_fit_config_fn=cfg, evaluate_fn=ev, **SAMPLING),
    "FedAvgM": lambda cfg, ev: LegacyFedAvgM(
        server_momentum=0.9, initial_parameters=ndarrays_to_parameters(list(tiny_model().values())),
        on_fit_config_fn=cfg, evaluate_fn=ev, **SAMPLING),
    "FedAdam": lambda cfg, ev: LegacyFedAdam(
        eta=0.05, initial_parameters=ndarrays_to_parameters(list(tiny_model().values())),
        on_fit_config_fn=cfg, evaluate_fn=ev, **SAMPLING),
}
LEGACY_MAKE = {
    name: (lambda cfg, ev, name=name, **kw: LegacyLIPS(
        LEGACY_INNER[name](cfg, ev), param_names=NAMES, num_rounds=ROUNDS, **LIPS_KW, **kw))
    for name in LEGACY_INNER
}
LEGACY_MAKE["LegacyLIPSFedAvg"] = lambda cfg, ev, **kw: LegacyLIPSFedAvg(
    param_names=NAMES, num_rounds=ROUNDS, on_fit_config_fn=cfg, evaluate_fn=ev, **SAMPLING,
    **LIPS_KW, **kw)


def run_legacy(inner, seed=7, crash_at=None, **lips):
    sampled, evaluated, draws = [], [], {}

    def fit_config(server_round):
        if server_round == crash_at:
            raise Crash()
        return {}

    def evaluate_fn(server_round, ndarrays, config):
        evaluated.append(server_round)
        draws[server_round] = random.random() + np.random.random()  # a random test subset, say
        return 0.0, {}

    strategy = LEGACY_MAKE[inner](fit_config, evaluate_fn, **lips)
    manager = SimpleClientManager()
    for cid in range(1, 5):
        manager.register(legacy_proxy(cid, sampled))
    random.seed(seed)
    np.random.seed(seed)
    server = Server(client_manager=manager, strategy=strategy)
    history, _ = server.fit(num_rounds=strategy.rounds_left, timeout=None)
    model = dict(zip(NAMES, parameters_to_ndarrays(server.parameters)))
    return model, history, sampled, (evaluated, draws), strategy


@pytest.mark.parametrize("inner", list(LEGACY_MAKE))
def test_legacy_api_resume_ends_where_the_uninterrupted_run_ends(tmp_path, inner):
    path = tmp_path / "lips.npz"
    whole, history, sampled, (_, draws), _ = run_legacy(inner)
    with pytest.raises(Crash):
        run_legacy(inner, crash_at=CRASH_AT, checkpoint_path=path)
    assert load_checkpoint(path).round == CRASH_AT - 1

    model, history_after, sampled_after, (evaluated_after, draws_after), strategy = run_legacy(
        inner, seed=12345, checkpoint_path=path, resume=True)
    assert strategy.rounds_left == ROUNDS - CRASH_AT + 1
    assert sampled_after == [s for s in sampled if s[0] >= CRASH_AT]
    for name, array in whole.items():
        np.testing.assert_array_equal(model[name], array, err_msg=name)
    # The legacy loop evaluates its initial model (the checkpoint's) again; the wrapped
    # strategy sees the schedule's round numbers, and the RNGs continue where they were.
    assert evaluated_after == list(range(CRASH_AT - 1, ROUNDS + 1))
    assert {r: d for r, d in draws_after.items() if r >= CRASH_AT} == {
        r: d for r, d in draws.items() if r >= CRASH_AT}
    masks = dict(history.metrics_distributed_fit["lips-mask-round"])
    masks_after = dict(history_after.metrics_distributed_fit["lips-mask-round"])
    # Flower's legacy History counts the rounds of this run from 1.
    assert {r + CRASH_AT - 1: v for r, v in masks_after.items()} == {
        r: v for r, v in masks.items() if r >= CRASH_AT}


def test_legacy_list_state_saved_by_position_still_resumes(tmp_path):
    """Before issue 36 a legacy strategy's list state (FedAdam's moments and model) was saved by
    position, its Parameters by ``param_names``; both are the model's names now. A checkpoint
    written the old way resumes to the same end."""
    path = tmp_path / "lips.npz"
    whole = run_legacy("FedAdam")[0]
    with pytest.raises(Crash):
        run_legacy("FedAdam", crash_at=CRASH_AT, checkpoint_path=path)
    lists = ["1.FedAdam.current_weights", "1.FedAdam.m_t", "1.FedAdam.v_t"]
    saved = load_checkpoint(path).strategy
    assert all(saved[key][0] == "list" and list(saved[key][1]) == NAMES for key in lists)

    def by_position(groups, meta):
        for key in lists:
            groups[f"strategy-{key}"] = {str(i): a for i, a in enumerate(groups[f"strategy-{key}"].values())}

    rewrite(path, by_position)
    assert all(list(load_checkpoint(path).strategy[key][1]) == [str(i) for i in range(len(NAMES))]
               for key in lists)
    model = run_legacy("FedAdam", seed=12345, checkpoint_path=path, resume=True)[0]
    for name, array in whole.items():
        np.testing.assert_array_equal(model[name], array, err_msg=name)


def test_legacy_api_refuses_to_run_past_the_schedule_after_resuming(tmp_path):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run_legacy("FedAvgM", crash_at=CRASH_AT, checkpoint_path=path)
    strategy = LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                          checkpoint_path=path, resume=True, **LIPS_KW)
    with pytest.raises(ValueError, match="ServerConfig\\(num_rounds=strategy.rounds_left\\)"):
        strategy.configure_fit(ROUNDS - CRASH_AT + 2, ndarrays_to_parameters([]), Mock())


def test_legacy_api_reads_the_checkpoint_in_the_constructor(tmp_path):
    path = tmp_path / "lips.npz"
    run_legacy("FedAvgM", checkpoint_path=path)
    with pytest.raises(ValueError, match="every: checkpoint 2, now 3"):
        LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                   checkpoint_path=path, resume=True, **dict(LIPS_KW, every=3))
    done = LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                      checkpoint_path=path, resume="auto", **LIPS_KW)
    assert done.rounds_left == 0
    with pytest.raises(ValueError, match="not `param_names`"):
        LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=[n + "x" for n in NAMES],
                   num_rounds=ROUNDS, checkpoint_path=path, resume=True, **LIPS_KW
                   ).initialize_parameters(Mock())


# ----- the run key: names the clients' persisted state across restarts -----

def spy_run_keys(g) -> list:
    answer, seen = g.send_and_receive.side_effect, []

    def spy(messages, timeout):
        messages = list(messages)
        seen.extend((m.metadata.message_type, m.content["config"].get("lips-run-key")) for m in messages)
        return answer(messages, timeout)

    g.send_and_receive.side_effect = spy
    return seen


def test_run_key_is_sent_in_train_and_evaluate_configs_and_kept_on_resume(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    make = lambda **kw: LIPS(INNER["FedAvg"](), checkpoint_path=path, **LIPS_KW, **kw)  # noqa: E731
    g = message_grid([], crash_at=CRASH_AT)
    first = spy_run_keys(g)
    with pytest.raises(Crash):
        make().start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    g = message_grid([])
    second = spy_run_keys(g)
    make(resume=True).start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    keys = {key for _, key in first + second}
    assert len(keys) == 1 and len(keys.pop()) == 32
    assert {kind for kind, _ in first} == {"train", "evaluate"}
    g = message_grid([])
    fresh = spy_run_keys(g)
    make(resume=False).start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=2)
    assert {key for _, key in fresh}.isdisjoint({key for _, key in first})  # a new run, a new key
    g = message_grid([])
    none = spy_run_keys(g)
    LIPS(INNER["FedAvg"](), **LIPS_KW).start(grid=g, initial_arrays=to_record(tiny_model()), num_rounds=2)
    assert {key for _, key in none} == {None}  # no checkpoint: clients keep nothing on disk


def test_legacy_run_key_in_fit_and_evaluate_instructions(tmp_path):
    path = tmp_path / "lips.npz"
    run_legacy("FedAvgM", checkpoint_path=path)
    key = load_checkpoint(path).run_key
    # A strategy resumed from that checkpoint sends the same key.
    strategy = LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                          checkpoint_path=path, resume=True, **LIPS_KW)
    assert strategy._lips_keeper.run_key == key and len(key) == 32
    manager = SimpleClientManager()
    sampled: list = []
    for cid in range(1, 5):
        manager.register(legacy_proxy(cid, sampled))
    params = ndarrays_to_parameters(list(tiny_model().values()))
    fresh = LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), param_names=NAMES, num_rounds=ROUNDS,
                       checkpoint_path=tmp_path / "new.npz", **LIPS_KW)
    fit = fresh.configure_fit(1, params, manager)
    evaluate = fresh.configure_evaluate(1, params, manager)
    keys = {ins.config["lips-run-key"] for _, ins in fit + evaluate}
    assert keys == {fresh._lips_keeper.run_key} and key not in keys


def test_an_unwritable_checkpoint_path_fails_before_any_round(tmp_path, task_identity):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    sampled: list = []
    with pytest.raises(ValueError, match="cannot write the LIPS checkpoint"):
        LIPS(FedAvg(), checkpoint_path=blocker / "lips.npz", **LIPS_KW).start(
            grid=message_grid(sampled), initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    assert sampled == []  # nothing trained
    with pytest.raises(ValueError, match="is a folder"):
        LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), num_rounds=ROUNDS, checkpoint_path=tmp_path)
    with pytest.raises(ValueError, match="cannot write the LIPS checkpoint"):
        LegacyLIPS(LEGACY_INNER["FedAvgM"](None, None), num_rounds=ROUNDS,
                   checkpoint_path=blocker / "lips.npz")


# ----- other strategies, damaged or hostile checkpoints -----

def test_resume_refuses_another_chain_even_without_array_state(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    run_message(lambda: MAKE["FedAvg"](checkpoint_path=path))  # FedAvg keeps no arrays
    with pytest.raises(ValueError, match=r"wrapping \['LIPS', 'FedAvg'\].*wraps \['LIPS', 'FedAdam'\]"):
        run_message(lambda: MAKE["FedAdam"](checkpoint_path=path, resume=True))


def test_resume_warns_about_other_settings_of_the_wrapped_strategy(tmp_path, task_identity, caplog):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run_message(lambda: MAKE["FedAvgM"](checkpoint_path=path), crash_at=CRASH_AT)
    slower = lambda **kw: LIPS(FedAvgM(server_momentum=0.5, fraction_train=0.5,  # noqa: E731
                                       fraction_evaluate=0.5, min_available_nodes=4), **LIPS_KW, **kw)
    with caplog.at_level(logging.WARNING):
        run_message(lambda: slower(checkpoint_path=path, resume=True))
    assert "1.FedAvgM.server_momentum: checkpoint 0.9, now 0.5" in caplog.text


def rewrite(path, edit) -> None:
    """Rewrite a checkpoint's metadata (and arrays) as a damaged or hostile file would have them."""
    groups, meta = read_groups(path, "test")
    edit(groups, meta)
    meta.pop("groups")
    write_groups(path, groups, meta)


@pytest.mark.parametrize("edit, match", [
    (lambda g, m: m.update(round="3"), "expected an integer"),
    (lambda g, m: m.update(run_key="../../etc"), "malformed run key"),
    # The history is in a sidecar file now (test_checkpoint_robustness.py damages that); a
    # checkpoint of version 1 held it inline, and is still read: its metrics are checked too.
    (lambda g, m: m.update(history={"train": {"1": {"x": "NaN text"}}}), "not a number"),
    (lambda g, m: m.update(python_random=[3, [1, 2], None]), "malformed Python random state"),
    (lambda g, m: g.pop("model"), "damaged"),
    (lambda g, m: m.update(inertia={"t0": 2, "reference": ["nope"], "previous": False}), "damaged"),
    (lambda g, m: m.update(strategy={"0.FedAvgM.x": "dict"}), "damaged"),
])
def test_damaged_checkpoints_are_value_errors_before_any_round(tmp_path, task_identity, edit, match):
    path = tmp_path / "lips.npz"
    run_message(lambda: MAKE["FedAvgM"](checkpoint_path=path))
    rewrite(path, edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


@pytest.mark.parametrize("edit, match", [
    # Arrays aimed at an attribute the chain never checkpoints (the LIPS core): not declared state,
    # refused by name before any other check (issue 36; before, "would replace a LIPSCore").
    (lambda g, m: (g.update({"strategy-0.LIPS.core": {"a": np.ones(2)}}),
                   m["strategy"].update({"0.LIPS.core": "dict"})), r"holds 0\.LIPS\.core, which .*declare"),
    # A "scalar" aimed at an object: the same (before, "would replace a").
    (lambda g, m: m["strategy_meta"]["scalars"].update({"0.LIPS.core": 1}), r"holds 0\.LIPS\.core, which"),
    # State for an attribute the chain does not have.
    (lambda g, m: m["strategy_meta"]["scalars"].update({"1.FedAvgM.new_thing": 1}), "does not have"),
])
def test_hostile_strategy_state_is_refused(tmp_path, task_identity, edit, match):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run_message(lambda: MAKE["FedAvgM"](checkpoint_path=path), crash_at=CRASH_AT)
    rewrite(path, edit)
    sampled: list = []
    with pytest.raises(ValueError, match=match):
        MAKE["FedAvgM"](checkpoint_path=path, resume=True).start(
            grid=message_grid(sampled), initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    assert sampled == []


class LedgerFedAvg(FedAvg):
    """A strategy whose state is an object, not arrays or numbers (declared: lips_state)."""

    lips_state = ("ledger",)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ledger = Ledger()

    def aggregate_train(self, server_round, replies):
        self.ledger.events.append(server_round)
        return super().aggregate_train(server_round, replies)


def test_objects_with_a_state_dict_are_saved_and_loaded(tmp_path, task_identity):
    path = tmp_path / "lips.npz"
    make = lambda **kw: LIPS(LedgerFedAvg(fraction_evaluate=0.0), **LIPS_KW, **kw)  # noqa: E731
    with pytest.raises(Crash):
        run_message(lambda: make(checkpoint_path=path), crash_at=CRASH_AT)
    resumed = make(checkpoint_path=path, resume=True)
    run_message(lambda: resumed)
    assert resumed.strategy.ledger.events == list(range(1, ROUNDS + 1))
    rewrite(path, lambda g, m: m["strategy_meta"]["objects"]["1.LedgerFedAvg.ledger"].update(x=1))
    with pytest.raises(ValueError, match="cannot restore '1.LedgerFedAvg.ledger'.*not a ledger state"):
        run_message(lambda: make(checkpoint_path=path, resume=True))


def test_the_privacy_accountant_continues_across_a_resume(tmp_path, task_identity):
    """Flower's fixed-clipping DP wrapper with its RDP accountant: privacy spent is not reset."""
    pytest.importorskip("dp_accounting")
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    def make(**kw):
        accountant = RdpAccountant(PrivacyConfig(
            target_delta=1e-5, population_size=4, sampling_method=SamplingMethod.NO_AMPLIFICATION,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE))
        dp = DifferentialPrivacyServerSideFixedClipping(
            INNER["FedAvg"](), noise_multiplier=1.0, clipping_norm=5.0, num_sampled_clients=2,
            accountant=accountant)
        return LIPS(dp, **LIPS_KW, **kw)

    path = tmp_path / "lips.npz"
    whole_strategy = make()
    whole, _, _ = run_message(lambda: whole_strategy, uniform=True)
    with pytest.raises(Crash):
        run_message(lambda: make(checkpoint_path=path), crash_at=CRASH_AT, uniform=True)
    resumed_strategy = make(checkpoint_path=path, resume=True)
    resumed, _, _ = run_message(lambda: resumed_strategy, seed=12345, uniform=True)
    spent, spent_after = whole_strategy.privacy_spent(), resumed_strategy.privacy_spent()
    assert spent_after.num_releases == spent.num_releases == ROUNDS
    assert spent_after.epsilon == spent.epsilon
    for name, array in to_numpy(whole.arrays).items():  # the noise continues too (numpy's RNG)
        np.testing.assert_array_equal(to_numpy(resumed.arrays)[name], array, err_msg=name)
