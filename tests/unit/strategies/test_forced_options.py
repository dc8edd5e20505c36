"""forced_options: every LIPS strategy built inside the block takes the forced values (compare's arm A)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from lips_flwr.strategies import LIPS, LegacyLIPS, LegacyLIPSFedAvg, LIPSFedAvg, forced_options
from flower_fakes import task_identity  # noqa: F401  (fixture)
from test_message_strategy import run_rounds


def test_strategies_built_inside_take_the_forced_values_and_log_them(caplog):
    caplog.set_level(logging.INFO)
    with forced_options(tau0=0.0):
        built = [LIPS(FedAvg(), tau0=0.7), LIPSFedAvg(tau0=0.5), LegacyLIPS(LegacyFedAvg(), num_rounds=3),
                 LegacyLIPSFedAvg(num_rounds=3, tau0=0.3)]
    assert [s.core.tau0 for s in built] == [0.0] * 4
    assert "LIPS: LIPS built with forced options {'tau0': 0.0} (the app's: {'tau0': 0.7})" in caplog.text
    assert LIPS(FedAvg(), tau0=0.7).core.tau0 == 0.7  # outside the block: as passed


@pytest.mark.usefixtures("task_identity")
def test_a_forced_tau0_of_zero_is_the_wrapped_strategy_bit_for_bit():
    with forced_options(tau0=0.0):
        lips = LIPS(FedAvg(), num_rounds=4, tau0=0.7, every=1)
    plain = FedAvg()
    for (_, got, metrics), (_, want, _) in zip(run_rounds(lips, 4), run_rounds(plain, 4)):
        assert not metrics.get("lips-mask-round") and not metrics.get("lips-zeros")
        assert all(np.array_equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)


def test_only_lips_options_can_be_forced():
    with pytest.raises(TypeError, match=r"\['lr'\], which are not LIPS options"), forced_options(lr=0.1):
        pass


def test_the_block_counts_the_strategies_built_in_it():
    """compare's LIPS-off arm must know when an app built no LIPS strategy: it would run as written."""
    with forced_options(tau0=0.0) as none_built:
        FedAvg()  # a Flower strategy: nothing to force
    assert none_built.strategies_built == 0 and dict(none_built.options) == {"tau0": 0.0}
    with forced_options(tau0=0.0) as outer:
        LIPS(FedAvg(), tau0=0.7)
        with forced_options(every=3) as inner:
            inner_built = LegacyLIPSFedAvg(num_rounds=3, tau0=0.3, every=1)
    assert (outer.strategies_built, inner.strategies_built) == (2, 1)
    assert (inner_built.core.tau0, inner_built.core.every) == (0.0, 3)  # the outer block's values too
    LIPS(FedAvg())
    assert outer.strategies_built == 2  # outside the block: not counted
