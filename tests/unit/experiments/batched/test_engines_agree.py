"""LIPS masks the same weights whichever engine trained the clients (issue 39's equivalence check).

The paper app in the study's GPU regime (``conf/prereg-fmnist-gpu-dir0.1.toml``:
Fashion-MNIST, FashionCNN, Dir(0.1), tau0 0.5, every 5), cut down to 4 clients,
2 rounds and one training step, on the sequential and the stacked engine. Round
1's aggregate is masked before round 2: the model round 2's instructions carry
shows which weights were zeroed. Today they are the same weights but for a few
near the threshold (the strict xfail below says why).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from lips_flwr.experiments.batched import run_batched
from lips_flwr.experiments.batched.calls import round_of
from test_grid import PAPER, paper_client, paper_server, run_config


def gpu_regime(tmp_path: Path) -> dict:
    """The GPU regime's run config at 4 clients, 2 rounds and a tiny compute."""
    conf = tomllib.loads((PAPER / "conf" / "prereg-fmnist-gpu-dir0.1.toml").read_text())
    conf.pop("federation")
    conf.update({"algorithm": "lips", "seed": 1000, "num-server-rounds": 2, "samples-per-client": 20,
                 "test-samples": 20, "local-epochs": 1, "batch-size": 20, "device": "cpu",
                 "results-path": str(tmp_path / "results.json")})
    return run_config(conf)


class SecondRound:
    """Keeps the model of round 2's first train instruction (all instructions carry the same one)."""

    def __init__(self) -> None:
        self.model: dict[str, np.ndarray] | None = None

    def pushed(self, messages) -> None:
        for msg in messages:
            if self.model is None and msg.metadata.message_type == "train" and round_of(msg) == 2:
                self.model = {name: array.numpy().copy() for name, array in msg.content["arrays"].items()}

    def replied(self, replies) -> None:
        pass


@pytest.fixture(scope="module")
def second_round_models(tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    """Round 2's model (round 1's masked aggregate) of the same seeded run on each engine."""
    models = {}
    for engine in ("sequential", "stacked"):
        seen = SecondRound()
        grid = run_batched(paper_server, paper_client, num_nodes=4, engine=engine, seed=1000,
                           run_config=gpu_regime(tmp_path_factory.mktemp(engine)), observer=seen)
        assert grid.first_error is None and seen.model is not None
        assert engine == "sequential" or grid.stacked_calls > 0  # (the stacked engine did stack)
        models[engine] = seen.model
    return models


def test_lips_masks_as_many_weights_nearly_all_the_same_on_both_engines(second_round_models):
    sequential, stacked = second_round_models["sequential"], second_round_models["stacked"]
    assert list(sequential) == list(stacked)
    zeroed = {name: int((array == 0).sum()) for name, array in sequential.items()}
    assert sum(zeroed.values()) > 1000  # round 1's aggregate was masked
    for name, array in sequential.items():
        assert int((stacked[name] == 0).sum()) == zeroed[name], name  # tau(t) of each layer, on both
        same = float(np.mean((array == 0) == (stacked[name] == 0)))
        assert same >= 0.99, (name, same)  # measured: 10 of 2304 of conv2's positions differ (0.4%)
        kept = (array != 0) & (stacked[name] != 0)  # the weights neither engine zeroed: close
        np.testing.assert_allclose(stacked[name][kept], array[kept], rtol=1e-2, atol=1e-3, err_msg=name)


@pytest.mark.xfail(strict=True, reason=(
    "issue 39 asks for identical masks, but on the same inputs the stacked engine's one training step "
    "differs from the sequential loop's by up to 6e-5 here: vmap rounds the first convolution differently "
    "(2e-7) and sums every weight gradient in another order (1e-7 to 5e-5 relative), and 65% of a "
    "Fashion-MNIST image's pixels are one background value, so whole tied regions move together "
    "(gradients 1e-3 apart; with 1e-4 of noise on the inputs the steps agree to 2e-7); weights near "
    "the threshold of |dw * w| then change places"))
def test_lips_masks_the_same_weights_on_the_sequential_and_the_stacked_engine(second_round_models):
    sequential, stacked = second_round_models["sequential"], second_round_models["stacked"]
    for name, array in sequential.items():
        np.testing.assert_array_equal(array == 0, stacked[name] == 0, err_msg=name)
