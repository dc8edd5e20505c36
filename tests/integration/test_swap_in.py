"""Acceptance: swapping LIPS into someone else's Flower App takes at most 5 changed lines.

``tests/apps/plain-message`` (Message API) and ``tests/apps/plain-legacy``
(legacy ``NumPyClient``) are ordinary Flower Apps in the style of Flower's
``flwr new`` PyTorch templates; they know nothing of LIPS. Each test copies
one to ``tmp_path``, applies the swap the README describes as exact-string
edits (each must match exactly once), counts the changed lines, and
``flwr run``s the patched copy.

Counting (strict): ``difflib.unified_diff`` of every file of the app, before
and after; a line that is modified counts once as removed ('-') and once as
added ('+'). Both the number of '+' lines and the number of '-' lines must
be <= 5.

num-server-rounds=6, every=5, start_round=1 -> LIPS masks round 1 only: the schedule's
round 6 is the final round, which LIPS does not mask (issue 35; it masked 1 and 6 before).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import time
from pathlib import Path

import pytest

APPS = Path(__file__).resolve().parents[1] / "apps"

pytestmark = pytest.mark.integration

NUM_ROUNDS = 6
MASK_ROUNDS = [1]
MAX_CHANGED = 5
FEDERATION = "num-supernodes=3 client-resources-num-cpus=1"
RUN_TIMEOUT_S = float(os.environ.get("LIPS_IT_RUN_TIMEOUT", "240"))

# (file, exact old text, new text): the swaps of README.md "Swap LIPS into your existing project".
SWAPS = {
    "plain-message": [
        ("plain_message/server_app.py",
         "from flwr.serverapp.strategy import FedAvg\n",
         "from flwr.serverapp.strategy import FedAvg\n"
         "from lips_flwr.strategies import LIPS\n"),
        ("plain_message/server_app.py",
         "    strategy = FedAvg(fraction_train=fraction_train)\n",
         "    strategy = FedAvg(fraction_train=fraction_train)\n"
         "    strategy = LIPS(strategy, tau0=0.5, every=5)\n"),
        ("plain_message/client_app.py",
         "from flwr.clientapp import ClientApp\n",
         "from flwr.clientapp import ClientApp\n"
         "from lips_flwr.clients import fedbn_mod, lips_mod\n"),
        ("plain_message/client_app.py",
         "app = ClientApp()\n",
         "app = ClientApp(mods=[fedbn_mod, lips_mod])\n"),
    ],
    "plain-legacy": [
        ("plain_legacy/server_app.py",
         "from flwr.server.strategy import FedAvg\n",
         "from flwr.server.strategy import FedAvg\n"
         "from lips_flwr.strategies import LegacyLIPS\n"),
        ("plain_legacy/server_app.py",
         "    )\n    config = ServerConfig(num_rounds=num_rounds)\n",
         "    )\n    strategy = LegacyLIPS(strategy, num_rounds=num_rounds, tau0=0.5, every=5)\n"
         "    config = ServerConfig(num_rounds=num_rounds)\n"),
        ("plain_legacy/client_app.py",
         "from flwr.common import Context\n",
         "from flwr.common import Context\n"
         "from lips_flwr.clients import LIPSNumPyClient\n"),
        ("plain_legacy/client_app.py",
         "    return FlowerClient(net, trainloader, valloader, local_epochs, lr).to_client()\n",
         "    return LIPSNumPyClient(FlowerClient(net, trainloader, valloader, local_epochs, lr),"
         " context).to_client()\n"),
    ],
}


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _apply(app_dir: Path, swaps: list[tuple[str, str, str]]) -> None:
    for rel, old, new in swaps:
        path = app_dir / rel
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise AssertionError(f"{rel}: swap anchor found {count} times (need exactly 1):\n{old}")
        path.write_text(text.replace(old, new))


def _changed_lines(before: dict[str, str], after: dict[str, str]) -> tuple[int, int, str]:
    """(added, removed, diff) over all files of the app; headers not counted."""
    added = removed = 0
    diff = []
    for rel in sorted(set(before) | set(after)):
        lines = difflib.unified_diff(
            before.get(rel, "").splitlines(keepends=True),
            after.get(rel, "").splitlines(keepends=True),
            fromfile=f"a/{rel}", tofile=f"b/{rel}", n=0,
        )
        for line in lines:
            diff.append(line)
            if line.startswith(("+++", "---")):
                continue
            added += line.startswith("+")
            removed += line.startswith("-")
    return added, removed, "".join(diff)


@pytest.mark.parametrize("app", sorted(SWAPS))
def test_swap_lips_into_plain_app(flwr, tmp_path, app):
    t0 = time.monotonic()
    original = APPS / app
    before = _files(original)
    assert not [rel for rel, text in before.items() if "lips" in text.lower()], \
        "the plain app must know nothing of LIPS"

    patched = tmp_path / app
    shutil.copytree(original, patched, ignore=shutil.ignore_patterns("__pycache__"))
    _apply(patched, SWAPS[app])
    added, removed, diff = _changed_lines(before, _files(patched))
    print(f"\n{app}: {added} lines added, {removed} removed\n{diff}")
    assert 0 < added <= MAX_CHANGED and removed <= MAX_CHANGED, diff

    run_id = flwr.run(patched, f"num-server-rounds={NUM_ROUNDS}", FEDERATION)
    status = flwr.wait(run_id, timeout=RUN_TIMEOUT_S)
    logs = flwr.logs(run_id)
    assert status == "finished:completed", logs[-4000:]

    # LIPS logs each server-side mask round once, from the ServerApp.
    masked = sorted(int(r) for r in re.findall(r"LIPS: round (\d+) masked", logs))
    assert masked == MASK_ROUNDS, logs[-4000:]
    rounds = {int(r) for r in re.findall(r"\[ROUND (\d+)(?:/\d+)?\]", logs)}
    assert rounds == set(range(1, NUM_ROUNDS + 1)), logs[-4000:]
    if app == "plain-message":
        # lips_mod ran on the clients: Message FedAvg logs its update norms.
        # (Legacy FedAvg without fit_metrics_aggregation_fn drops client metrics.)
        assert "'lips-update-norm'" in logs, logs[-4000:]

    print(f"{app}: run {run_id} took {time.monotonic() - t0:.1f}s")
