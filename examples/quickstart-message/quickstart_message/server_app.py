"""ServerApp (Message API): FedAvg wrapped by LIPS."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from lips_flwr.persistence.checkpoint import resume_option
from lips_flwr.experiments.task.models import DigitsCNN
from lips_flwr.experiments.results import write_json_atomic
from lips_flwr.strategies import LIPS

app = ServerApp()


def _per_round(metrics: dict) -> dict:
    return {str(rnd): dict(record) for rnd, record in sorted(metrics.items())}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    num_rounds = int(cfg["num-server-rounds"])

    # Seeded: a restarted server builds the same initial model, which a resume checks.
    torch.manual_seed(int(cfg["seed"]))
    net = DigitsCNN()
    fedavg = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=1.0,
        min_train_nodes=2,
        min_evaluate_nodes=2,
        min_available_nodes=2,
    )
    # LIPS wraps any Message API strategy; num_rounds comes from start().
    strategy = LIPS(
        fedavg,
        tau0=float(cfg["tau0"]),
        every=int(cfg["every"]),
        score=str(cfg["score"]),
        mode=str(cfg["mode"]),
        seed=int(cfg["seed"]),
        mask_last_round=bool(cfg["mask-last-round"]),
        # A restarted server continues the run: see docs/restart.md.
        checkpoint_path=str(cfg["checkpoint-path"]) or None,
        resume=resume_option(cfg["resume"]),
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=num_rounds,
        train_config=ConfigRecord({"local-epochs": int(cfg["local-epochs"])}),
    )

    if cfg["results-path"]:
        write_json_atomic(
            str(cfg["results-path"]),
            {
                "run_config": dict(cfg),
                "train_metrics": _per_round(result.train_metrics_clientapp),
                "evaluate_metrics": _per_round(result.evaluate_metrics_clientapp),
            },
        )
