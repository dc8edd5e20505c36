"""A client's rounds against a state folder that fails, in a child process (test_client_state_failures).

Permission bits do not stop root (``CAP_DAC_OVERRIDE``), so the test runs this
module as an unprivileged process: ``python client_state_child.py API BASE
SCENARIO...``. For each scenario it builds a state folder under
``BASE/SCENARIO`` (``BASE`` is a folder this process may write), trains three
rounds (the last two client-mode mask rounds) and evaluates once through the
Message API mods (``API=message``) or ``LIPSNumPyClient`` (``API=numpy``).
It prints one JSON object, scenario -> per call the error (``None`` when the
reply went out) and the metrics, the WARNINGs logged, the state file's path.

Scenarios (the folder breaks before round 1, so loading fails too, unless said):

* ``mode-600``, ``mode-000``: the folder has no search permission;
* ``inside-000``: the folder is inside a folder of mode 000;
* ``read-only``: mode 500, with a state file from an earlier run in it;
* ``breaks-mid-run``: a good folder becomes mode 000 after round 1; a new
  Flower run (the server resumed) then trains round 2 from an empty context;
* ``file-size-limit``: ``RLIMIT_FSIZE`` (set by the parent) refuses the file.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the checkout's lips_flwr, the test helpers
from unit_paths import add_test_folders  # noqa: E402

add_test_folders()  # the test modules whose helpers this script imports, in tests/unit's subfolders

from flwr.app import Context, MessageType, RecordDict  # noqa: E402

from flower_fakes import TaskIdentity, tiny_model  # noqa: E402
from lips_flwr.clients import LIPSNumPyClient, fedbn_mod, lips_mod, persistent_state_mod  # noqa: E402
from lips_flwr.clients.persist import state_path  # noqa: E402
from test_clients import NAMES, FakeApp, UserClient, lips_config, message  # noqa: E402

KEY = "0123456789abcdef0123456789abcdef"


class Warnings(logging.Handler):
    """Keeps the text of each WARNING (and worse) that Flower's logger emits."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(record.getMessage())


def context(folder: Path) -> Context:
    """A new Flower run's context: empty state, this state folder."""
    return Context(run_id=7, node_id=42, node_config={"partition-id": 0, "lips-state-dir": str(folder)},
                   state=RecordDict(), run_config={})


def call(api: str, ctx: Context, app: FakeApp, rnd: int, train: bool = True) -> dict:
    """One train (or evaluate) call of round ``rnd``: its error, or its metrics."""
    config = {**lips_config(rnd, tau=0.3 if rnd > 1 else 0.0), "lips-run-key": KEY}
    if not train:
        config = {"lips-run-key": KEY, "lips-round": rnd}
    try:
        if api == "numpy":
            client = LIPSNumPyClient(UserClient(app), ctx, param_names=NAMES, keep_local="batchnorm")
            params = list(tiny_model(rnd).values())
            if train:
                _, _, metrics = client.fit(params, config)
            else:
                _, _, metrics = client.evaluate(params, config)
            return {"error": None, "metrics": dict(metrics)}
        kind = MessageType.TRAIN if train else MessageType.EVALUATE
        reply = persistent_state_mod(
            message(tiny_model(rnd), config, kind), ctx,
            lambda m, c: fedbn_mod(m, c, lambda m2, c2: lips_mod(m2, c2, app)))
        if reply.has_error():
            return {"error": reply.error.reason, "metrics": {}}
        return {"error": None, "metrics": dict(reply.content["metrics"])}
    except Exception as err:  # what the test looks for: no call may raise
        return {"error": f"raised {type(err).__name__}: {err}", "metrics": {}}


def run(scenario: str, api: str, base: Path) -> dict:
    folder = base / "state"
    if scenario == "inside-000":
        folder = base / "outer" / "state"
    folder.mkdir(parents=True)
    app, ctx = FakeApp(), context(folder)
    calls = []
    if scenario == "read-only":  # an earlier run's file, then the folder turns read-only
        call(api, context(folder), FakeApp(), 1)
        os.chmod(folder, 0o500)
    elif scenario in ("mode-600", "mode-000"):
        os.chmod(folder, 0o600 if scenario == "mode-600" else 0o000)
    elif scenario == "inside-000":
        os.chmod(folder.parent, 0o000)
    try:
        calls.append(call(api, ctx, app, 1))
        if scenario == "breaks-mid-run":
            os.chmod(folder, 0o000)
            ctx = context(folder)  # the server resumed: a new Flower run, empty contexts
        calls.append(call(api, ctx, app, 2))
        calls.append(call(api, ctx, app, 3))
        calls.append(call(api, context(folder), app, 3, train=False))  # an evaluation, empty context
    finally:
        for path in (folder.parent, folder):
            os.chmod(path, 0o700)  # so that the parent can remove it
    path = state_path(ctx, {"lips-run-key": KEY})
    return {"calls": calls, "path": str(path), "folder": str(folder)}


def main() -> None:
    api, base, scenarios = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if TaskIdentity is not None:  # real Messages need the identity of a running task
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    results = {}
    for scenario in scenarios:
        warnings = Warnings()
        logging.getLogger("flwr").addHandler(warnings)
        results[scenario] = run(scenario, api, base / scenario)
        results[scenario]["warnings"] = warnings.texts
        logging.getLogger("flwr").removeHandler(warnings)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
