"""The base install without torch or Ray: the plugin imports and runs a round (``make test-no-torch``).

Run with the Python of a venv that holds ``lips-flwr``'s wheel and its base
dependencies only (``flwr``, ``numpy``), from outside the checkout. Checks
that torch and Ray are absent, that ``lips_flwr``, ``lips_flwr.strategies``
and ``lips_flwr.clients`` import from that install, that one LIPS(FedAvg)
mask round runs on mocked replies, and that what needs the
``[examples]`` extra says so in one line. Exits non-zero, with the failed
check, otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from unittest.mock import Mock

import numpy as np

INSTALL_HINT = 'pip install "lips-flwr[examples]"'


def check_absent(*names: str) -> None:
    present = [name for name in names if find_spec(name) is not None]
    assert not present, f"this venv should lack {present}: the check would prove nothing"


def check_imports() -> None:
    import lips_flwr
    import lips_flwr.clients
    import lips_flwr.strategies  # noqa: F401

    where = Path(lips_flwr.__file__).resolve()
    assert "site-packages" in where.parts, f"lips_flwr imported from {where}, not from the install"
    leaked = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "ray", "scipy", "matplotlib"})
    assert not leaked, f"importing the plugin loaded {leaked}"


def check_a_mask_round() -> None:
    """One LIPS(FedAvg) round on two mocked replies: the middle layer is masked as scheduled."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import FedAvg
    from flwr.supercore.task_identity import TaskIdentity

    from lips_flwr.strategies import LIPS

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0  # real Messages need it
    rng = np.random.default_rng(0)
    shapes = {"first.weight": (4, 3), "middle.weight": (8, 4), "last.weight": (2, 8)}
    model = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    grid = Mock(spec=Grid)
    grid.get_node_ids.return_value = [1, 2]
    strategy = LIPS(FedAvg(), num_rounds=2, tau0=0.5, every=1)
    arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    assert len(list(strategy.configure_train(1, arrays, ConfigRecord(), grid))) == 2
    replies = []
    for node in (1, 2):
        reply = Mock(spec=Message)
        trained = {k: v + rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in model.items()}
        reply.content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in trained.items()}),
                                    "metrics": MetricRecord({"num-examples": 10})})
        reply.has_error.return_value = False
        reply.metadata.src_node_id = node
        replies.append(reply)
    new, metrics = strategy.aggregate_train(1, replies)
    assert new is not None and metrics is not None
    zeros = {k: int((a.numpy() == 0).sum()) for k, a in new.items()}
    assert zeros == {"first.weight": 0, "middle.weight": 16, "last.weight": 0}, zeros
    assert metrics["lips-mask-round"] == 1 and metrics["lips-zeros"] == 16, dict(metrics)


def check_the_extra_is_named() -> None:
    """``import lips_flwr.experiments`` and the ``lips-flwr`` command: one line naming the extra."""
    try:
        import lips_flwr.experiments  # noqa: F401
    except ImportError as err:
        assert str(err).endswith(INSTALL_HINT) and "\n" not in str(err), str(err)
    else:
        raise AssertionError("lips_flwr.experiments imported without torch")
    command = Path(sys.executable).parent / "lips-flwr"
    done = subprocess.run([str(command), "compare", "app", "--seeds", "1", "--out", "out"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and INSTALL_HINT in done.stderr, done.stderr


def main() -> None:
    check_absent("torch", "ray")
    check_imports()
    check_a_mask_round()
    check_the_extra_is_named()
    print("no-torch install: the plugin imports and masks a round; torch and ray absent; "
          "the [examples] extra is named")


if __name__ == "__main__":
    main()
