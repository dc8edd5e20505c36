"""What a checkpoint holds of the wrapped strategies: their declared state, at this flwr.

Flower's own strategies (both APIs) are run a few rounds inside LIPS with a
checkpoint: it holds exactly the state ``lips_flwr.strategies.flower_state``
lists, and nothing a strategy changes goes unlisted (no "leaves out" warning).
``make test-lowest`` runs these at the lowest supported flwr, the main suite at
the highest. A user's strategy declares its state with ``lips_state`` and
``lips_state_exclude``; anything else a checkpoint could save is named in a
warning and not restored.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.common import ndarrays_to_parameters
from flwr.server import strategy as legacy
from flwr.serverapp import strategy as message

from flower_fakes import (
    Ledger,
    client_manager,
    client_models,
    grid,
    legacy_result,
    message_reply,
    params_to_model,
    task_identity,  # noqa: F401  (fixture)
    tiny_model,
    to_numpy,
    to_record,
)
from lips_flwr.errors import ConfigError, ResultFileError
from lips_flwr.persistence.checkpoint import load_checkpoint
from lips_flwr.strategies import LIPS, LegacyLIPS
from lips_flwr.strategies.chain import declared_state
from lips_flwr.strategies.resume.chain_state import restore_state
from test_resume import rewrite

pytestmark = pytest.mark.usefixtures("task_identity")
CLIENTS, ROUNDS = 7, 3
NAMES = list(tiny_model())
LIPS_KW = dict(num_rounds=10, every=2)


def run_message(strategy, path, rounds=ROUNDS, **metrics) -> None:
    arrays = to_record(tiny_model())
    for rnd in range(1, rounds + 1):
        list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid(CLIENTS)))
        trained = client_models(to_numpy(arrays), CLIENTS, seed=rnd)
        new, _ = strategy.aggregate_train(rnd, [message_reply(m, i + 1, **metrics)
                                                for i, m in enumerate(trained)])
        arrays = arrays if new is None else new
    strategy._save_checkpoint(rounds, arrays)  # what start() does after its last round


def run_legacy(strategy, rounds=ROUNDS, **metrics) -> None:
    params = ndarrays_to_parameters(list(tiny_model().values()))
    for rnd in range(1, rounds + 1):
        strategy.configure_fit(rnd, params, client_manager(CLIENTS))
        trained = client_models(params_to_model(params, NAMES), CLIENTS, seed=rnd)
        new, _ = strategy.aggregate_fit(rnd, [legacy_result(m, str(i + 1), **metrics)
                                              for i, m in enumerate(trained)], [])
        params = params if new is None else new
    strategy.configure_fit(rounds + 1, params, client_manager(CLIENTS))  # saves round `rounds`


def initial():
    return ndarrays_to_parameters(list(tiny_model().values()))


# name -> (the wrapped strategy, metrics its replies need, the keys its checkpoint holds).
# Not run: QFedAvg (Flower's cannot aggregate the integer buffers of a BN model), the XGBoost ones.
MESSAGE = {
    "FedAvg": (message.FedAvg, {}, []),
    "FedProx": (lambda: message.FedProx(proximal_mu=0.1), {}, []),
    "FedAvgM": (lambda: message.FedAvgM(server_momentum=0.9), {},
                ["1.FedAvgM.current_arrays", "1.FedAvgM.momentum_vector"]),
    "FedAdam": (message.FedAdam, {}, ["1.FedAdam.m_t", "1.FedAdam.v_t"]),
    "FedYogi": (message.FedYogi, {}, ["1.FedYogi.m_t", "1.FedYogi.v_t"]),
    "FedAdagrad": (message.FedAdagrad, {}, ["1.FedAdagrad.m_t", "1.FedAdagrad.v_t"]),
    "FedMedian": (message.FedMedian, {}, []),
    "FedTrimmedAvg": (lambda: message.FedTrimmedAvg(beta=0.2), {}, []),
    "Krum": (lambda: message.Krum(num_malicious_nodes=1), {}, []),
    "MultiKrum": (lambda: message.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=3), {}, []),
    "Bulyan": (lambda: message.Bulyan(num_malicious_nodes=1), {}, []),
    "DP-server-fixed": (lambda: message.DifferentialPrivacyServerSideFixedClipping(
        message.FedAvg(), 0.1, 1.0, CLIENTS), {},
        ["1.DifferentialPrivacyServerSideFixedClipping.accountant"]),
    "DP-client-fixed": (lambda: message.DifferentialPrivacyClientSideFixedClipping(
        message.FedAvg(), 0.1, 1.0, CLIENTS), {},
        ["1.DifferentialPrivacyClientSideFixedClipping.accountant"]),
    "DP-server-adaptive(FedAvgM)": (lambda: message.DifferentialPrivacyServerSideAdaptiveClipping(
        message.FedAvgM(server_momentum=0.9), 0.1, CLIENTS), {},
        ["1.DifferentialPrivacyServerSideAdaptiveClipping.clipping_norm", "2.FedAvgM.current_arrays",
         "2.FedAvgM.momentum_vector"]),
    "DP-client-adaptive": (lambda: message.DifferentialPrivacyClientSideAdaptiveClipping(
        message.FedAvg(), 0.1, CLIENTS), {"norm_bit": 1},
        ["1.DifferentialPrivacyClientSideAdaptiveClipping.clipping_norm"]),
}
LEGACY = {
    "FedAvg": (legacy.FedAvg, {}, ["1.FedAvg.initial_parameters"]),
    "FedProx": (lambda: legacy.FedProx(proximal_mu=0.1), {}, ["1.FedProx.initial_parameters"]),
    "FedAvgM": (lambda: legacy.FedAvgM(server_momentum=0.9, initial_parameters=initial()), {},
                ["1.FedAvgM.initial_parameters", "1.FedAvgM.momentum_vector"]),
    "FedAdam": (lambda: legacy.FedAdam(initial_parameters=initial()), {},
                ["1.FedAdam.current_weights", "1.FedAdam.initial_parameters", "1.FedAdam.m_t", "1.FedAdam.v_t"]),
    "FedYogi": (lambda: legacy.FedYogi(initial_parameters=initial()), {},
                ["1.FedYogi.current_weights", "1.FedYogi.initial_parameters", "1.FedYogi.m_t", "1.FedYogi.v_t"]),
    "FedAdagrad": (lambda: legacy.FedAdagrad(initial_parameters=initial()), {},
                   ["1.FedAdagrad.current_weights", "1.FedAdagrad.initial_parameters",
                    "1.FedAdagrad.m_t", "1.FedAdagrad.v_t"]),
    "FedMedian": (legacy.FedMedian, {}, ["1.FedMedian.initial_parameters"]),
    "FedTrimmedAvg": (lambda: legacy.FedTrimmedAvg(beta=0.2), {}, ["1.FedTrimmedAvg.initial_parameters"]),
    "Krum": (lambda: legacy.Krum(num_malicious_clients=1), {}, ["1.Krum.initial_parameters"]),
    "Bulyan": (lambda: legacy.Bulyan(num_malicious_clients=1, to_keep=0), {}, ["1.Bulyan.initial_parameters"]),
    "FaultTolerantFedAvg": (legacy.FaultTolerantFedAvg, {}, ["1.FaultTolerantFedAvg.initial_parameters"]),
    "DP-server-fixed": (lambda: legacy.DifferentialPrivacyServerSideFixedClipping(
        legacy.FedAvg(), 0.1, 1.0, CLIENTS), {}, ["2.FedAvg.initial_parameters"]),
    "DP-client-fixed": (lambda: legacy.DifferentialPrivacyClientSideFixedClipping(
        legacy.FedAvg(), 0.1, 1.0, CLIENTS), {}, ["2.FedAvg.initial_parameters"]),
    "DP-server-adaptive": (lambda: legacy.DifferentialPrivacyServerSideAdaptiveClipping(
        legacy.FedAvg(), 0.1, CLIENTS), {},
        ["1.DifferentialPrivacyServerSideAdaptiveClipping.clipping_norm", "2.FedAvg.initial_parameters"]),
    "DP-client-adaptive": (lambda: legacy.DifferentialPrivacyClientSideAdaptiveClipping(
        legacy.FedAvg(), 0.1, CLIENTS), {"norm_bit": True},
        ["1.DifferentialPrivacyClientSideAdaptiveClipping.clipping_norm", "2.FedAvg.initial_parameters"]),
}


def held(path) -> list[str]:
    checkpoint = load_checkpoint(path)
    meta = checkpoint.strategy_meta or {}
    return sorted({*checkpoint.strategy, *meta.get("scalars", {}), *meta.get("objects", {})})


@pytest.mark.parametrize("name", list(MESSAGE))
def test_message_api_strategies_keep_their_declared_state_and_nothing_else(name, tmp_path, caplog):
    make, metrics, keys = MESSAGE[name]
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.WARNING):
        run_message(LIPS(make(), checkpoint_path=path, **LIPS_KW), path, **metrics)
    assert held(path) == sorted(keys)
    assert "leaves out" not in caplog.text and "cannot save" not in caplog.text


@pytest.mark.parametrize("name", list(LEGACY))
def test_legacy_api_strategies_keep_their_declared_state_and_nothing_else(name, tmp_path, caplog):
    make, metrics, keys = LEGACY[name]
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.WARNING):
        run_legacy(LegacyLIPS(make(), param_names=NAMES, checkpoint_path=path, **LIPS_KW), **metrics)
    assert held(path) == sorted(keys)
    assert "leaves out" not in caplog.text and "cannot save" not in caplog.text


# ----- a user's strategy -----

class Counting(message.FedAvg):
    """Counts its rounds (declared), keeps a scratch copy (left out) and a best model (undeclared)."""

    lips_state = ("rounds_seen",)
    lips_state_exclude = ("scratch",)

    def __init__(self) -> None:
        super().__init__()
        self.rounds_seen = 0
        self.scratch: dict | None = None
        self.best: dict | None = None

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        self.rounds_seen += 1
        self.scratch = self.best = to_numpy(arrays)
        return arrays, metrics


def test_a_strategy_declares_what_a_checkpoint_saves_and_leaves_out(tmp_path, caplog):
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.WARNING):
        run_message(LIPS(Counting(), checkpoint_path=path, **LIPS_KW), path)
    assert held(path) == ["1.Counting.rounds_seen"]
    assert load_checkpoint(path).strategy_meta["scalars"] == {"1.Counting.rounds_seen": ROUNDS}
    named = [r.getMessage() for r in caplog.records if "leaves out" in r.getMessage()]
    assert len(named) == 1 and "1.Counting.best" in named[0] and "scratch" not in named[0]


def test_a_subclass_adds_to_or_takes_from_the_row_of_its_flower_base():
    class Lighter(message.FedAvgM):
        lips_state = ("extra",)
        lips_state_exclude = ("momentum_vector",)

    class Heavier(Lighter):
        lips_state = ("momentum_vector",)

    assert declared_state(message.FedAvgM()) == (("current_arrays", "momentum_vector"), frozenset())
    assert declared_state(Lighter()) == (("current_arrays", "extra"), frozenset({"momentum_vector"}))
    assert declared_state(Heavier())[0] == ("current_arrays", "extra", "momentum_vector")
    assert declared_state(message.FedAdam()) == (("m_t", "v_t"), frozenset({"current_arrays"}))


def test_a_declaration_that_is_not_a_tuple_of_names_fails_before_any_round(tmp_path):
    class OneString(message.FedAvg):
        lips_state = "rounds_seen"  # a tuple was meant: ("rounds_seen",)

    with pytest.raises(TypeError, match=r"OneString\.lips_state must be a tuple of attribute names"):
        LIPS(OneString(), checkpoint_path=tmp_path / "lips.npz", **LIPS_KW).start(
            grid=grid(CLIENTS), initial_arrays=to_record(tiny_model()), num_rounds=10)


class Bookkeeping(LIPS):
    """Like the paper app's RecordingLIPS once was: plain attributes that are not the chain's state."""

    def __init__(self, strategy, **kwargs) -> None:
        super().__init__(strategy, **kwargs)
        self.first_round: int | None = None

    def aggregate_train(self, server_round, replies):
        if self.first_round is None:
            self.first_round = server_round
        return super().aggregate_train(server_round, replies)


def test_undeclared_bookkeeping_is_named_and_not_restored(tmp_path, caplog):
    path = tmp_path / "lips.npz"
    with caplog.at_level(logging.WARNING):
        run_message(Bookkeeping(message.FedAvg(), checkpoint_path=path, **LIPS_KW), path)
    assert "0.Bookkeeping.first_round" in caplog.text and "leaves out" in caplog.text
    resumed = Bookkeeping(message.FedAvg(), checkpoint_path=path, resume=True, **LIPS_KW)
    checkpoint = resumed._lips_keeper.begin(resumed, resumed.core)
    codec = resumed._lips_codec
    resumed._lips_keeper.restore(resumed, checkpoint, None, codec.to_arrays, codec.from_arrays)
    assert resumed.first_round is None  # a resumed run's bookkeeping is its own
    np.testing.assert_array_equal(list(checkpoint.model), NAMES)


class Sub(message.FedAvg):
    """A FedAvg subclass with a counter it does not declare (the issue-36 example)."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds_seen = 0

    def aggregate_train(self, server_round, replies):
        self.rounds_seen += 1
        return super().aggregate_train(server_round, replies)


def old_format_checkpoint(path) -> None:
    """A checkpoint as the format before fc635bc wrote it: the undeclared counter among its values."""
    run_message(LIPS(Sub(), checkpoint_path=path, **LIPS_KW), path)
    rewrite(path, lambda groups, meta: meta["strategy_meta"]["scalars"].update({"1.Sub.rounds_seen": 7}))


def resume_chain(path, **options):
    resumed = LIPS(Sub(), checkpoint_path=path, resume=True, **LIPS_KW, **options)
    checkpoint = resumed._lips_keeper.begin(resumed, resumed.core)
    codec = resumed._lips_codec
    try:
        resumed._lips_keeper.restore(resumed, checkpoint, None, codec.to_arrays, codec.from_arrays)
    finally:
        resumed._lips_keeper.release()
    return resumed


def test_undeclared_state_of_an_old_checkpoint_is_refused_or_skipped_never_restored(tmp_path, caplog):
    """Before: ``1.Sub.rounds_seen = 7`` was restored behind one WARNING, as any attribute the live
    strategy has. Only declared state is restored: the rest is an error naming the keys and the
    ``lips_state`` fix, or, with ``skip_undeclared_state=True``, skipped with a WARNING."""
    path = tmp_path / "lips.npz"
    old_format_checkpoint(path)
    with pytest.raises(ResultFileError, match=r"holds 1\.Sub\.rounds_seen, which the wrapped strategies do "
                       r"not declare.*Sub\.lips_state = \(\"attr\", \.\.\.\).*skip_undeclared_state=True"):
        resume_chain(path)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        resumed = resume_chain(path, skip_undeclared_state=True)
    assert resumed.strategy.rounds_seen == 0  # as built
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and "1.Sub.rounds_seen" in skipped[0]
    assert "restoring values" not in caplog.text


def test_skip_undeclared_state_is_a_bool():
    with pytest.raises(ConfigError, match="`skip_undeclared_state` must be True or False, got 'yes'"):
        LIPS(Sub(), skip_undeclared_state="yes", **LIPS_KW)


class LedgerFedAvg(message.FedAvg):
    """Declared state: two objects, a number and arrays."""

    lips_state = ("ledger", "seen", "kept", "other")

    def __init__(self) -> None:
        super().__init__()
        self.ledger, self.seen, self.kept, self.other = Ledger(), 0, None, Ledger()


def test_a_state_its_object_refuses_sets_nothing():
    """Before: the numbers and arrays were set, then the object's load_state_dict refused its state:
    a strategy half restored (against "everything is checked before anything is set")."""
    owner = LIPS(LedgerFedAvg(), **LIPS_KW)
    good = {"1.LedgerFedAvg.ledger": {"events": [1, 2]}}
    arrays = {"1.LedgerFedAvg.kept": ("dict", {n: np.zeros_like(a) for n, a in tiny_model().items()})}
    meta = {"scalars": {"1.LedgerFedAvg.seen": 5}}
    for objects in ({"1.LedgerFedAvg.ledger": {"x": 1}}, {**good, "1.LedgerFedAvg.other": {"x": 1}}):
        with pytest.raises(ValueError, match=r"cannot restore '1.LedgerFedAvg.(ledger|other)'.*not a ledger"):
            restore_state(owner, arrays, {**meta, "objects": objects}, owner._lips_codec.to_arrays, owner._lips_codec.from_arrays,
                          model=tiny_model())
        assert (owner.strategy.seen, owner.strategy.kept, owner.strategy.ledger.events) == (0, None, [])
    restore_state(owner, arrays, {**meta, "objects": good}, owner._lips_codec.to_arrays, owner._lips_codec.from_arrays, model=tiny_model())
    assert (owner.strategy.seen, owner.strategy.ledger.events) == (5, [1, 2])
    assert list(owner.strategy.kept) == NAMES


# Undeclared state that the checks on what may be restored would refuse: text other than the live
# setting, a value of another kind, arrays of another shape, arrays in place of a number.
UNDECLARED = {
    "differing text": ({}, {"1.LedgerFedAvg.weighted_by_key": "num-samples"}),
    "wrong type": ({}, {"1.LedgerFedAvg.fraction_train": "all"}),
    "wrong shape": ({"1.LedgerFedAvg.scratch": ("dict", {n: np.zeros(3) for n in NAMES})}, {}),
    "arrays for a number": ({"1.LedgerFedAvg.fraction_evaluate": ("dict", tiny_model())}, {}),
}


def restore_with_undeclared(case, **options):
    """A LedgerFedAvg chain given declared ``seen = 5`` and the undeclared state of ``case``."""
    owner = LIPS(LedgerFedAvg(), **LIPS_KW)
    owner.strategy.scratch = None  # undeclared, holds arrays once it has any
    arrays, scalars = UNDECLARED[case]
    codec = owner._lips_codec
    restore_state(owner, arrays, {"scalars": {"1.LedgerFedAvg.seen": 5, **scalars}}, codec.to_arrays,
                  codec.from_arrays, model=tiny_model(), **options)
    return owner


@pytest.mark.parametrize("case", list(UNDECLARED))
def test_undeclared_state_is_refused_by_name_before_any_other_check(case):
    """Before: such state was checked before it was known to be undeclared, so it raised the generic
    "not written by this strategy chain" error, without the key's ``lips_state`` fix."""
    key = next(iter({**UNDECLARED[case][0], **UNDECLARED[case][1]}))
    with pytest.raises(ResultFileError, match=rf"holds {re.escape(key)}, which the wrapped strategies do "
                       r"not declare.*LedgerFedAvg\.lips_state = \(\"attr\", \.\.\.\)"):
        restore_with_undeclared(case)


@pytest.mark.parametrize("case", list(UNDECLARED))
def test_skip_undeclared_state_skips_it_before_any_other_check(case, caplog):
    """Before: ``skip_undeclared=True`` still raised for such state: it was checked, then skipped."""
    key = next(iter({**UNDECLARED[case][0], **UNDECLARED[case][1]}))
    with caplog.at_level(logging.WARNING):
        owner = restore_with_undeclared(case, skip_undeclared=True)
    built, settings = LedgerFedAvg(), ("weighted_by_key", "fraction_train", "fraction_evaluate")
    assert owner.strategy.seen == 5  # declared state is restored
    assert owner.strategy.scratch is None
    assert [getattr(owner.strategy, a) for a in settings] == [getattr(built, a) for a in settings]
    skipped = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1 and key in skipped[0] and "skip_undeclared_state=True" in skipped[0]


@pytest.mark.parametrize("arrays, scalars, match", [
    ({"1.LedgerFedAvg.ledger": ("dict", tiny_model())}, {}, "'1.LedgerFedAvg.ledger' would replace a Ledger"),
    ({"1.LedgerFedAvg.kept": ("dict", {n: np.zeros(3) for n in NAMES})}, {}, "kept' does not fit"),
    ({}, {"1.LedgerFedAvg.ledger": 1}, "value for '1.LedgerFedAvg.ledger' would replace a Ledger"),
    ({}, {"1.LedgerFedAvg.seen": "five"}, "'1.LedgerFedAvg.seen' is a str"),
])
def test_declared_state_is_still_checked_with_skip_undeclared_state(arrays, scalars, match):
    """The flag skips only undeclared state: declared state that does not fit is refused, nothing set."""
    owner = LIPS(LedgerFedAvg(), **LIPS_KW)
    codec = owner._lips_codec
    with pytest.raises(ValueError, match=match):
        restore_state(owner, arrays, {"scalars": {"1.LedgerFedAvg.fraction_train": "all", **scalars}},
                      codec.to_arrays, codec.from_arrays, model=tiny_model(), skip_undeclared=True)
    assert (owner.strategy.seen, owner.strategy.kept, owner.strategy.fraction_train) == (0, None, 1.0)
