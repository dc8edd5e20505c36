"""trigger="inertia": on the schedule's mask rounds, mask only the middle layers that stagnate.

The core is driven with synthetic aggregates whose per-layer relative step
``||w_t - w_{t-1}|| / ||w_{t-1}||`` is set exactly, so the rule
(:mod:`lips_flwr.core.trigger`) can be checked round by round; the strategies
are checked to take the options, and a checkpointed run to resume with the
same masks.
"""

from __future__ import annotations

import json
import logging
import math
import random
from unittest.mock import Mock

import numpy as np
import pytest
from flower_fakes import (  # noqa: F401
    client_manager,
    fit_result,
    grid,
    params_to_model,
    reply,
    task_identity,
    tiny_model,
    to_numpy,
    to_record,
)
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import ndarrays_to_parameters
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from lips_flwr.core.lips import TRIGGER_OPTIONS, LIPSCore
from lips_flwr.core.trigger import InertiaTrigger, check_trigger_state
from lips_flwr.persistence.checkpoint import load_checkpoint
from lips_flwr.persistence.npz_store import read_groups, write_groups
from lips_flwr.strategies import LIPS, LegacyLIPS, LegacyLIPSFedAvg, LIPSFedAvg

NAMES = ["first.weight", "mid_a.weight", "mid_b.weight", "last.weight"]
FIRST, MID_A, MID_B, LAST = NAMES
FAST, SLOW = 0.1, 0.01


def initial_model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    model = {}
    for name in NAMES:
        model[name] = rng.normal(size=(16, 16))
        model[name.replace("weight", "bias")] = rng.normal(size=16)
    return model


def aggregate_from(model: dict, rates: dict[str, float], server_round: int) -> dict[str, np.ndarray]:
    """An aggregate whose weight layer ``l`` moved by the relative step ``rates[l]`` from ``model``."""
    rng = np.random.default_rng(1000 + server_round)
    out = {}
    for name, array in model.items():
        direction = rng.normal(size=array.shape)
        if name in rates:
            out[name] = array + direction * (rates[name] * np.linalg.norm(array) / np.linalg.norm(direction))
        else:
            out[name] = array + 0.01 * direction
    return out


def drive(core: LIPSCore, rate, rounds, model=None):
    """Run ``rounds`` through the core (client_plan, then round); per round: (plan, outcome)."""
    model = initial_model() if model is None else model
    history = {}
    for t in rounds:
        plan = core.client_plan(t, model)
        aggregate = aggregate_from(model, {n: rate(t, n) for n in NAMES}, t)
        outcome = core.round(t, aggregate, model)
        history[t] = (plan, outcome)
        model = outcome.model if outcome.model is not None else aggregate
    return history, model


def masked(outcome) -> list[str]:
    return [k[len("lips-zeros/"):] for k in outcome.metrics if k.startswith("lips-zeros/")]


def collapse_at(start: int, layer: str = MID_A):
    """``layer``'s relative step collapses from round ``start`` on; every other layer keeps moving."""
    return lambda t, name: SLOW if name == layer and t >= start else FAST


def core(**kw) -> LIPSCore:
    return LIPSCore(**{"num_rounds": 20, "every": 2, "tau0": 0.5, "trigger": "inertia", **kw})


# --------------------------------------------------------------------------- the rule
def test_a_stagnating_middle_layer_is_masked_and_a_moving_one_never():
    history, _ = drive(core(), collapse_at(4), range(1, 21))
    masks = {t: masked(o) for t, (_, o) in history.items() if o.metrics["lips-mask-round"]}
    # Mask rounds 1, 3, 5, ...; the baseline (rounds 2..4) is complete after round 4.
    assert masks == {1: [], 3: [], 5: [MID_A], 7: [MID_A], 9: [MID_A], 11: [MID_A], 13: [MID_A],
                     15: [MID_A], 17: [MID_A], 19: [MID_A]}
    metrics = history[5][1].metrics
    baseline = (FAST + FAST + SLOW) / 3
    assert metrics["lips-trigger-stagnant"] == 1
    assert metrics[f"lips-trigger-ratio/{MID_A}"] == pytest.approx(SLOW / baseline, rel=1e-9)
    for name in (FIRST, MID_B, LAST):  # the first and last layers are reported too
        assert metrics[f"lips-trigger-ratio/{name}"] == pytest.approx(1.0, rel=1e-9)
    assert metrics["lips-trigger-edge-ratio"] == pytest.approx(1.0, rel=1e-9)
    assert metrics["lips-layers-masked"] == 1
    assert metrics[f"lips-zeros/{MID_A}"] == math.ceil(256 * 0.5 * (1 - 4 / 20))
    # The first and last layers are never masked, whatever they do.
    assert not any(FIRST in m or LAST in m or MID_B in m for m in masks.values())


def test_the_edge_layers_are_the_reference_never_masked_even_with_layers_all():
    history, _ = drive(core(layers="all"), collapse_at(4, layer=FIRST), range(1, 21))
    assert all(masked(o) == [] for _, o in history.values())  # first collapses: it is the reference
    # mid_a and mid_b now move fast *relative to* the mean of the edges (one slow, one fast).
    metrics = history[5][1].metrics
    assert metrics["lips-trigger-stagnant"] == 0


def test_nothing_is_masked_when_all_layers_slow_down_together():
    def converging(t, name):
        return FAST * 0.7 ** t

    # mask_last_round: round 20, the last, is a mask round here too (every=1: every round decides)
    history, _ = drive(core(every=1, mask_last_round=True), converging, range(1, 21))
    for t, (_, outcome) in history.items():
        assert outcome.model is None, t
        assert outcome.metrics["lips-layers-masked"] == 0
        assert outcome.metrics["lips-trigger-stagnant"] == 0
    ratios = history[20][1].metrics
    assert ratios[f"lips-trigger-ratio/{MID_A}"] < 0.1  # everyone slowed down a lot...
    assert ratios[f"lips-trigger-ratio/{MID_A}"] == pytest.approx(ratios["lips-trigger-edge-ratio"],
                                                                   rel=1e-9)  # ...together


def test_nothing_is_masked_before_the_baseline_exists():
    # every=1: every round is a mask round; the layer collapses from round 2 for window=1
    # (baseline: round 2 alone, complete after it) and from round 4 for the default window=3.
    for window, start in ((3, 4), (1, 3)):
        history, _ = drive(core(every=1, trigger_window=window), collapse_at(start), range(1, 11))
        first = 2 + window
        for t in range(1, first):
            outcome = history[t][1]
            assert outcome.model is None and masked(outcome) == [], (window, t)
            assert outcome.metrics["lips-trigger-stagnant"] == 0
            assert not any(k.startswith("lips-trigger-ratio/") for k in outcome.metrics)
            assert outcome.decision is not None and not outcome.decision.ready
        assert masked(history[first][1]) == [MID_A], window
        assert LIPSCore(trigger="inertia", trigger_window=window).inertia_trigger.first_round == first


def test_every_1_skips_the_inflated_step_after_a_mask_so_a_layer_is_masked_every_other_round():
    history, _ = drive(core(every=1), collapse_at(4), range(1, 12))
    assert [t for t, (_, o) in history.items() if masked(o)] == [5, 7, 9, 11]
    # Round 6: mid_a's only recent step follows its mask: no fresh evidence, no ratio.
    assert f"lips-trigger-ratio/{MID_A}" not in history[6][1].metrics


def test_the_step_after_a_server_mask_is_left_out():
    """Regrowth after a mask inflates the next step: a huge step at round 6 must not unmask mid_a."""
    def rate(t, name):
        if name == MID_A and t == 6:
            return 1.0  # the zeroed weights grow back
        return collapse_at(4)(t, name)

    c = core()
    history, _ = drive(c, rate, range(1, 8))
    assert masked(history[5][1]) == [MID_A]
    assert masked(history[7][1]) == [MID_A]  # s = r(7) only: r(6) is left out
    assert history[7][1].metrics[f"lips-trigger-ratio/{MID_A}"] == pytest.approx(
        SLOW / ((FAST + FAST + SLOW) / 3), rel=1e-9)
    recent = c.inertia_trigger.recent
    assert sorted(recent) == [6, 7]
    assert MID_A not in recent[6] and {FIRST, MID_B, LAST} <= set(recent[6])


def test_after_a_round_without_aggregate_the_next_step_is_still_the_first_from_the_mask():
    c = core()
    history, model = drive(c, collapse_at(4), range(1, 6))
    assert masked(history[5][1]) == [MID_A]
    assert c.round(6, None, model).metrics == {}  # no usable reply: the masked model stays
    aggregate = aggregate_from(model, {n: 1.0 if n == MID_A else FAST for n in NAMES}, 7)
    outcome = c.round(7, aggregate, model)  # mid_a regrows: its step is left out
    assert MID_A not in c.inertia_trigger.recent[7] and MID_B in c.inertia_trigger.recent[7]
    assert masked(outcome) == [] and f"lips-trigger-ratio/{MID_A}" not in outcome.metrics
    history, _ = drive(c, collapse_at(4), range(8, 10), model=aggregate)
    assert masked(history[9][1]) == [MID_A]


def test_round_one_is_left_out():
    c = core()
    drive(c, collapse_at(4), range(1, 3))
    assert sorted(c.inertia_trigger.baseline) == [2]


def test_trigger_factor_sets_the_threshold():
    # mid_a slows to 0.4 of its baseline pace: stagnant for factor 0.5, not for 0.3.
    def rate(t, name):
        return 0.04 if name == MID_A and t >= 5 else FAST

    for factor, expected in ((0.5, [MID_A]), (0.3, [])):
        history, _ = drive(core(trigger_factor=factor), rate, range(1, 8))
        assert masked(history[7][1]) == expected, factor


def test_client_mode_sends_the_decision_and_reports_it():
    c = core(mode="client")
    history, _ = drive(c, collapse_at(4), range(1, 12))
    position = list(initial_model()).index(MID_A)
    plans = {t: plan for t, (plan, _) in history.items() if t % 2 == 1}
    # Decided before the round's aggregate: round 5 sees steps up to round 4, (r(3) + r(4)) / 2.
    assert plans[1] == plans[3] == plans[5] == {"tau": 0.0}
    for t in (7, 9, 11):
        assert plans[t]["layers"] == [position]
        assert plans[t]["tau"] == pytest.approx(0.5 * (1 - (t - 1) / 20))
    for t, (plan, outcome) in history.items():
        assert outcome.model is None  # clients mask, the global model stays dense
        if t % 2 == 1:
            assert outcome.metrics["lips-trigger-stagnant"] == len(plan.get("layers", []))
    assert history[5][1].metrics[f"lips-trigger-ratio/{MID_A}"] == pytest.approx(
        (FAST + SLOW) / 2 / ((FAST + FAST + SLOW) / 3), rel=1e-9)
    # The mask round's own step (trained from the masked copies) is left out.
    assert MID_A not in c.inertia_trigger.recent[11] and MID_A in c.inertia_trigger.recent[10]


def test_schedule_trigger_is_the_paper_schedule_bit_for_bit():
    plain = LIPSCore(num_rounds=20, every=2)
    explicit = LIPSCore(num_rounds=20, every=2, trigger="schedule", trigger_window=7, trigger_factor=0.2)
    a, model_a = drive(plain, collapse_at(4), range(1, 21))
    b, model_b = drive(explicit, collapse_at(4), range(1, 21))
    for t in a:
        assert a[t][0] == b[t][0]
        ma = {k: v for k, v in a[t][1].metrics.items() if k != "lips-seconds"}
        mb = {k: v for k, v in b[t][1].metrics.items() if k != "lips-seconds"}
        assert ma == mb
        assert not any(k.startswith("lips-trigger") for k in mb)
        assert b[t][1].decision is None
    for name in model_a:
        np.testing.assert_array_equal(model_a[name], model_b[name])
    assert masked(a[5][1]) == [MID_A, MID_B]  # the paper masks every middle layer
    assert plain.settings() == explicit.settings()
    assert "trigger" not in plain.settings() and explicit.state()["trigger"] is None
    assert plain.describe() == explicit.describe()


# --------------------------------------------------------------------------- options
def test_options_and_settings():
    assert TRIGGER_OPTIONS == ("trigger", "trigger_window", "trigger_factor")
    c = LIPSCore(num_rounds=10, trigger="inertia")
    assert (c.trigger, c.trigger_window, c.trigger_factor) == ("inertia", 3, 0.5)
    assert c.settings()["trigger"] == "inertia"
    assert (c.settings()["trigger_window"], c.settings()["trigger_factor"]) == (3, 0.5)
    assert "window=3, factor=0.5" in dict(c.describe())["Trigger"]


MAKERS = {
    "LIPS": lambda **kw: LIPS(FedAvg(), **kw),
    "LIPSFedAvg": lambda **kw: LIPSFedAvg(**kw),
    "LegacyLIPS": lambda **kw: LegacyLIPS(LegacyFedAvg(), num_rounds=10, **kw),
    "LegacyLIPSFedAvg": lambda **kw: LegacyLIPSFedAvg(num_rounds=10, **kw),
}


@pytest.mark.parametrize("make", list(MAKERS))
def test_both_strategies_accept_the_options(make):
    strategy = MAKERS[make](trigger="inertia", trigger_window=2, trigger_factor=0.25, mode="client")
    assert strategy.core.trigger == "inertia"
    assert (strategy.core.inertia_trigger.window, strategy.core.inertia_trigger.factor) == (2, 0.25)
    assert MAKERS[make]().core.inertia_trigger is None


@pytest.mark.parametrize("kwargs,word", [
    ({"trigger": "sometimes"}, "`trigger` must be one of"),
    ({"trigger": None}, "`trigger` must be one of"),
    ({"trigger_window": 0}, "`trigger_window` must be an integer >= 1"),
    ({"trigger_window": 1.5}, "`trigger_window` must be an integer >= 1"),
    ({"trigger_window": True}, "`trigger_window` must be an integer >= 1"),
    ({"trigger_factor": 0}, r"`trigger_factor` must be a number in \(0, 1\]"),
    ({"trigger_factor": 1.5}, r"`trigger_factor` must be a number in \(0, 1\]"),
    ({"trigger_factor": float("nan")}, r"`trigger_factor` must be a number in \(0, 1\]"),
    ({"trigger_factor": "0.5"}, r"`trigger_factor` must be a number in \(0, 1\]"),
    ({"trigger_factor": True}, r"`trigger_factor` must be a number in \(0, 1\]"),
])
@pytest.mark.parametrize("make", ["core", *MAKERS])
def test_bad_values_raise_value_errors_naming_the_argument(kwargs, word, make):
    with pytest.raises(ValueError, match=word):
        if make == "core":
            LIPSCore(**kwargs)
        else:
            MAKERS[make](**kwargs)


# --------------------------------------------------------------------------- state
@pytest.mark.parametrize("mode", ["server", "client"])
def test_state_round_trip_continues_identically(mode):
    whole = core(mode=mode)
    history, _ = drive(whole, collapse_at(4), range(1, 21))

    first = core(mode=mode)
    _, model = drive(first, collapse_at(4), range(1, 7))  # after round 6 (a mask at 5)
    state = json.loads(json.dumps(first.state()))  # what a checkpoint keeps: JSON
    second = core(mode=mode)
    second.load_state(state, model, 6)
    rest, _ = drive(second, collapse_at(4), range(7, 21), model=model)
    for t in range(7, 21):
        assert rest[t][0] == history[t][0], t
        assert masked(rest[t][1]) == masked(history[t][1]), t
        got = {k: v for k, v in rest[t][1].metrics.items() if k != "lips-seconds"}
        assert got == {k: v for k, v in history[t][1].metrics.items() if k != "lips-seconds"}, t
    assert second.state() == whole.state()


def test_a_state_that_does_not_fit_is_refused():
    c = core()
    _, model = drive(c, collapse_at(4), range(1, 7))
    good = json.loads(json.dumps(c.state()))
    names = [n for n in model if n.endswith("weight")]

    def refused(edit, match, server_round=6, target=None):
        state = json.loads(json.dumps(good))
        edit(state["trigger"])
        with pytest.raises(ValueError, match=match):
            (target or core()).load_state(state, model, server_round)

    refused(lambda s: s.update(window=2), "uses trigger_window=2, this strategy 3")
    refused(lambda s: None, "uses trigger_window=3, this strategy 4", target=core(trigger_window=4))
    refused(lambda s: s["recent"][0][1].update({"nope.weight": 0.1}), r"names \['nope\.weight'\]")
    refused(lambda s: s["baseline"][0][1].update({MID_A: -1.0}), "not finite numbers >= 0")
    refused(lambda s: s["baseline"].append([5, {}]), "round 5 is not one of the rounds 2..4")
    refused(lambda s: s["recent"].append([9, {}]), "span rounds")
    refused(lambda s: None, "steps of round 6, after the checkpoint's round 5", server_round=5)
    refused(lambda s: s.update(last_mask=[5, ["x"]]), r"last mask names \['x'\]")
    refused(lambda s: s.update(recent="no"), "recent is not a list")
    with pytest.raises(ValueError, match="no inertia-trigger series"):
        core().load_state({"layers": None, "inertia": None}, model)
    with pytest.raises(ValueError, match="uses every=2, this strategy 3"):
        check_trigger_state(good["trigger"], 3, 3, names)
    check_trigger_state(good["trigger"], 3, 2, names, 6)  # the good one passes
    trigger = InertiaTrigger(3, 0.5, 2)
    trigger.load_state(good["trigger"], names)
    assert trigger.state() == good["trigger"]


# --------------------------------------------------------------------------- a resumed run
class Crash(Exception):
    """The server process dies."""


def client_update(model: dict, node: int, server_round: int) -> dict:
    """Every layer moves by ~5% a round, but conv2 by ~0.05% from round 4 on."""
    rng = np.random.default_rng(1000 * node + server_round)
    out = {}
    for name, array in model.items():
        if not np.issubdtype(array.dtype, np.floating):
            out[name] = array.copy()
            continue
        scale = 0.0005 if name == "conv2.weight" and server_round >= 4 else 0.05
        noise = rng.normal(size=array.shape)
        out[name] = (array + scale * np.linalg.norm(array) * noise / max(np.linalg.norm(noise), 1e-12)
                     ).astype(array.dtype)
    return out


def message_grid(seen: dict, crash_at: int | None = None):
    g = grid(3)

    def answer(messages, timeout):
        out = []
        for msg in messages:
            config = msg.content["config"]
            server_round = int(config["server-round"])
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == "train":
                if server_round == crash_at:
                    raise Crash()
                seen.setdefault(server_round, {k: v for k, v in config.items() if k.startswith("lips-")
                                               and k != "lips-run-key"})
                out.append(reply(client_update(to_numpy(msg.content["arrays"]), node, server_round),
                                 10 + node, node_id=node))
            else:
                ev = Mock(spec=Message)
                ev.content = RecordDict({"metrics": MetricRecord({"num-examples": 5})})
                ev.has_error.return_value = False
                ev.metadata.src_node_id = node
                out.append(ev)
        return out

    g.send_and_receive.side_effect = answer
    return g


def run(mode: str, crash_at=None, **kw):
    seen: dict = {}
    random.seed(3)
    np.random.seed(3)
    strategy = LIPS(FedAvg(), tau0=0.5, every=2, trigger="inertia", mode=mode, **kw)
    result = strategy.start(grid=message_grid(seen, crash_at), initial_arrays=to_record(tiny_model()),
                            num_rounds=10, train_config=ConfigRecord())
    return result, seen, strategy


def masks_of(result) -> dict[int, dict]:
    return {r: {k: v for k, v in m.items() if k.startswith(("lips-zeros", "lips-trigger", "lips-layers"))}
            for r, m in result.train_metrics_clientapp.items()}


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("mode", ["server", "client"])
def test_a_resumed_run_masks_as_the_uninterrupted_one(tmp_path, mode, caplog):
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.INFO):
        whole, seen, strategy = run(mode)
    masks = masks_of(whole)
    stagnant = {r: m["lips-trigger-stagnant"] for r, m in masks.items() if "lips-trigger-stagnant" in m}
    # conv2 stagnates from round 4: masked on the mask rounds once the baseline exists.
    expected = {1: 0, 3: 0, 5: 1, 7: 1, 9: 1} if mode == "server" else {1: 0, 3: 0, 5: 0, 7: 1, 9: 1}
    assert stagnant == expected
    if mode == "server":
        assert masks[7]["lips-layers-masked"] == 1 and "lips-zeros/conv2.weight" in masks[7]
    else:
        assert json.loads(seen[7]["lips-layers"]) == [list(tiny_model()).index("conv2.weight")]
        assert seen[5]["lips-tau"] == 0.0 and "lips-layers" not in seen[5]
    assert "inertia trigger: 1 stagnating layers ['conv2.weight']" in caplog.text
    assert "inertia trigger: no baseline before round 5, nothing masked" in caplog.text

    with pytest.raises(Crash):  # crashes in round 8: the checkpoint holds round 7, after a mask
        run(mode, crash_at=8, checkpoint_path=path)
    saved = load_checkpoint(path)
    assert saved.round == 7 and saved.trigger is not None and saved.trigger["last_mask"][0] == 7
    resumed, seen_after, strategy_after = run(mode, checkpoint_path=path, resume=True)
    assert masks_of(resumed) == masks
    assert {r: c for r, c in seen_after.items()} == {r: c for r, c in seen.items() if r >= 8}
    for name, array in to_numpy(whole.arrays).items():
        np.testing.assert_array_equal(to_numpy(resumed.arrays)[name], array, err_msg=name)
    assert strategy_after.core.state()["trigger"] == strategy.core.state()["trigger"]


@pytest.mark.usefixtures("task_identity")
def test_a_checkpoint_of_another_trigger_is_refused(tmp_path):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run("server", crash_at=8, checkpoint_path=path)
    with pytest.raises(ValueError, match="trigger: checkpoint 'inertia', now None"):
        LIPS(FedAvg(), tau0=0.5, every=2, checkpoint_path=path, resume=True).start(
            grid=message_grid({}), initial_arrays=to_record(tiny_model()), num_rounds=10)
    with pytest.raises(ValueError, match="trigger_window: checkpoint 3, now 4"):
        run("server", checkpoint_path=path, resume=True, trigger_window=4)


def _rewrite(path, edit) -> None:
    groups, meta = read_groups(path, "test")
    edit(meta)
    meta.pop("groups")
    write_groups(path, groups, meta)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["trigger"]["recent"][0][1].update({"nope.weight": 0.1}),
     r"inertia-trigger series does not fit .*names \['nope\.weight'\], which are not weight layers"),
    (lambda m: m["trigger"].update(recent=[[9, {}]]),
     "inertia-trigger series does not fit .*steps of round 9, after the checkpoint's round 7"),
    (lambda m: m.pop("trigger"), "no inertia-trigger series"),
    (lambda m: m.update(trigger=[1, 2]), "damaged.*malformed inertia-trigger state"),
])
@pytest.mark.usefixtures("task_identity")
def test_a_checkpointed_trigger_series_that_does_not_fit_is_refused(tmp_path, edit, match):
    path = tmp_path / "lips.npz"
    with pytest.raises(Crash):
        run("server", crash_at=8, checkpoint_path=path)
    _rewrite(path, edit)
    with pytest.raises(ValueError, match=match):
        run("server", checkpoint_path=path, resume=True)


LEGACY_NAMES = list(tiny_model())


def run_legacy(mode: str, rounds: int, **kw):
    """Drive a LegacyLIPS by hand for ``rounds`` loop rounds (Flower's loop counts from 1 in every run)."""
    initial = ndarrays_to_parameters(list(tiny_model().values()))
    strategy = LegacyLIPS(LegacyFedAvg(initial_parameters=initial), param_names=LEGACY_NAMES, num_rounds=10,
                          tau0=0.5, every=2, trigger="inertia", mode=mode, **kw)
    manager = client_manager(3)
    params = strategy.initialize_parameters(manager)
    metrics, configs = {}, {}
    for loop_round in range(1, rounds + 1):
        instructions = strategy.configure_fit(loop_round, params, manager)
        server_round = int(instructions[0][1].config["lips-round"])
        configs[server_round] = {k: v for k, v in instructions[0][1].config.items()
                                 if k.startswith("lips-") and k != "lips-run-key"}
        model = params_to_model(params, LEGACY_NAMES)
        results = [fit_result(client_update(model, node, server_round), 10 + node, cid=str(node))
                   for node in (1, 2, 3)]
        params, round_metrics = strategy.aggregate_fit(loop_round, results, [])
        metrics[server_round] = {k: v for k, v in round_metrics.items()
                                 if k.startswith(("lips-zeros", "lips-trigger", "lips-layers"))}
    return params_to_model(params, LEGACY_NAMES), metrics, configs, strategy


@pytest.mark.parametrize("mode", ["server", "client"])
def test_a_resumed_legacy_run_masks_as_the_uninterrupted_one(tmp_path, mode):
    path = tmp_path / "lips.npz"
    whole, metrics, configs, strategy = run_legacy(mode, 10)
    assert metrics[9]["lips-trigger-stagnant"] == 1
    after7, _, _, crashed = run_legacy(mode, 7, checkpoint_path=path)
    # The checkpoint after round 7 is written as round 8 starts; then the server dies.
    crashed.configure_fit(8, ndarrays_to_parameters(list(after7.values())), client_manager(3))
    assert load_checkpoint(path).round == 7
    model, metrics_after, configs_after, strategy_after = run_legacy(
        mode, 3, checkpoint_path=path, resume=True)
    assert metrics_after == {r: m for r, m in metrics.items() if r >= 8}
    assert configs_after == {r: c for r, c in configs.items() if r >= 8}
    for name, array in whole.items():
        np.testing.assert_array_equal(model[name], array, err_msg=name)
    assert strategy_after.core.state()["trigger"] == strategy.core.state()["trigger"]
