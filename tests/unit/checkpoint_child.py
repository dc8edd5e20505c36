"""A checkpointing run whose saves fail mid-run, in a child process (test_checkpoint_failures).

``python checkpoint_child.py API BASE SCENARIO``: a LIPS strategy (``API``:
``message``, through ``start()`` on a fake grid, or ``legacy``, its methods
driven as Flower's server does) runs 5 rounds with its checkpoint in
``BASE/SCENARIO``. Before round 2 the checkpoint's folder breaks, after
round 3 it works again:

* ``read-only``: the folder turns mode 500 (the parent runs this process
  unprivileged: permission bits do not stop root);
* ``file-size-limit``: ``RLIMIT_FSIZE`` drops to 1,000 bytes (SIGXFSZ ignored).

It prints one JSON object: the rounds that returned a model, the ERRORs
logged, the checkpoint's round on disk, the files left in the folder.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the checkout's lips_flwr, the test helpers
from unit_paths import add_test_folders  # noqa: E402

add_test_folders()  # the test modules whose helpers this script imports, in tests/unit's subfolders

from flwr.app import ConfigRecord  # noqa: E402
from flwr.common import ndarrays_to_parameters  # noqa: E402
from flwr.server.strategy import FedAvg as LegacyFedAvg  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from client_state_child import Warnings  # noqa: E402
from flower_fakes import (  # noqa: E402
    TaskIdentity,
    client_manager,
    client_models,
    fit_result,
    params_to_model,
    tiny_model,
    to_record,
)
from lips_flwr.persistence.checkpoint import load_checkpoint  # noqa: E402
from lips_flwr.strategies import LIPS, LegacyLIPS  # noqa: E402
from test_reply_robustness import fake_grid  # noqa: E402

ROUNDS = 5


def breaks(scenario: str, folder: Path, server_round: int) -> None:
    """The folder fails from round 2 (the save after round 1 is the last good one) to round 3."""
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    if server_round == 2:
        if scenario == "read-only":
            os.chmod(folder, 0o500)
        else:
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    elif server_round == 4:
        os.chmod(folder, 0o700)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))


def run_message(scenario: str, folder: Path) -> list[int]:
    grid = fake_grid()
    answer = grid.send_and_receive.side_effect

    def breaking(messages, timeout):
        messages = list(messages)
        config = messages[0].content["config"]
        if messages[0].metadata.message_type == "train":
            breaks(scenario, folder, int(config["server-round"]))
        return answer(messages, timeout)

    grid.send_and_receive.side_effect = breaking
    strategy = LIPS(FedAvg(), tau0=0.5, every=2, checkpoint_path=str(folder / "ck.npz"))
    result = strategy.start(grid=grid, initial_arrays=to_record(tiny_model()), num_rounds=ROUNDS)
    return sorted(result.train_metrics_clientapp)


def run_legacy(scenario: str, folder: Path) -> list[int]:
    names = list(tiny_model())
    strategy = LegacyLIPS(LegacyFedAvg(), param_names=names, num_rounds=ROUNDS, tau0=0.5, every=2,
                          checkpoint_path=str(folder / "ck.npz"))
    current, done = tiny_model(), []
    for rnd in range(1, ROUNDS + 1):
        strategy.configure_fit(rnd, ndarrays_to_parameters(list(current.values())), client_manager(3))
        breaks(scenario, folder, rnd)  # after configure, which saved the previous round: as in start()
        trained = client_models(current, 3, seed=rnd)
        new, _ = strategy.aggregate_fit(rnd, [fit_result(m, 10, str(i + 1)) for i, m in enumerate(trained)], [])
        if new is not None:
            current = params_to_model(new, names)
            done.append(rnd)
    return done


def main() -> None:
    api, base, scenario = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if TaskIdentity is not None:  # real Messages need the identity of a running task
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    folder = base / scenario
    folder.mkdir(parents=True)
    errors = Warnings()
    errors.setLevel(logging.ERROR)
    logging.getLogger("flwr").addHandler(errors)
    try:
        rounds = (run_message if api == "message" else run_legacy)(scenario, folder)
    finally:
        os.chmod(folder, 0o700)
    print(json.dumps({"rounds": rounds, "errors": errors.texts, "saved": load_checkpoint(folder / "ck.npz").round,
                      "files": sorted(p.name for p in folder.iterdir()), "path": str(folder / "ck.npz")}))


if __name__ == "__main__":
    main()
