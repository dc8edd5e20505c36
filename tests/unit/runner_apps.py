"""Tiny Flower Apps written into a test's folder, for the experiment runner's tests (numpy only, fast).

The model is four arrays (``first.weight``, ``mid.weight``, ``last.weight``,
``last.bias``); each client pulls it towards its own target and adds noise
drawn from numpy's *global* generator, which the app never seeds: only the
runner's seeds make a run repeatable. With ``lips=True`` the ServerApp
wraps FedAvg in LIPS (``tau0`` from the run config, a mask every 2 rounds)
and can checkpoint and resume (``checkpoint-path``, ``resume``). With
``state_dir=True`` it declares ``lips-state-dir``; with ``save_model=True``
its ServerApp writes ``final-model.txt`` into its working folder at the end,
and its results file (``results=True``) records that folder (``cwd``).
"""

from __future__ import annotations

from pathlib import Path

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "tests"

[tool.flwr.app.components]
serverapp = "{package}.server_app:app"
clientapp = "{package}.client_app:app"

[tool.flwr.app.config]
num-server-rounds = {rounds}
tau0 = 0.5
lr = 0.3
sleep = 0.0
{extra}"""

SERVER = """\
import json
import os

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

LIPS_ON = {lips}
SAVE_MODEL = {save_model}
app = ServerApp()


def initial() -> ArrayRecord:
    shapes = {{"first.weight": (3, 4), "mid.weight": (4, 4), "last.weight": (4, 2), "last.bias": (2,)}}
    return ArrayRecord({{k: Array(np.random.normal(size=s).astype(np.float32)) for k, s in shapes.items()}})


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=2, min_train_nodes=2,
                      min_evaluate_nodes=2)
    if LIPS_ON:
        from lips_flwr.persistence.checkpoint import resume_option
        from lips_flwr.strategies import LIPS

        strategy = LIPS(strategy, tau0=float(cfg["tau0"]), every=2,
                        checkpoint_path=str(cfg.get("checkpoint-path", "")) or None,
                        resume=resume_option(cfg.get("resume", "no")))
    result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=int(cfg["num-server-rounds"]))
    if SAVE_MODEL:  # a relative path, as apps write their final model: where does it land?
        with open("final-model.txt", "w") as f:
            f.write(repr(result.arrays.to_numpy_ndarrays()[0].tolist()))
    if cfg.get("results-path"):
        with open(str(cfg["results-path"]), "w") as f:
            json.dump({{"run_config": dict(cfg), "rounds": len(result.evaluate_metrics_clientapp),
                        "cwd": os.getcwd()}}, f)
"""

CLIENT = """\
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

FAIL = {fail}
app = ClientApp()


def target(pid: int, arrays: dict) -> dict:
    rng = np.random.default_rng(pid)
    return {{k: rng.normal(size=a.shape).astype(np.float32) for k, a in arrays.items()}}


def distance(arrays: dict, goal: dict) -> float:
    return float(sum(np.linalg.norm(arrays[k] - goal[k]) for k in arrays))


@app.train()
def train(msg: Message, context: Context) -> Message:
    if FAIL:
        raise RuntimeError("tiny app: this ClientApp fails on every call")
    time.sleep(float(context.run_config["sleep"]))
    pid = int(context.node_config["partition-id"])
    arrays = {{k: v.numpy() for k, v in msg.content["arrays"].items()}}
    goal, lr = target(pid, arrays), float(context.run_config["lr"])
    new = {{k: (a + lr * (goal[k] - a) + 0.01 * np.random.normal(size=a.shape)).astype(np.float32)
           for k, a in arrays.items()}}
    metrics = MetricRecord({{"loss": distance(new, goal), "num-examples": 10 + pid}})
    arrays = ArrayRecord({{k: Array(v) for k, v in new.items()}})
    content = RecordDict({{"arrays": arrays, "metrics": metrics}})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    pid = int(context.node_config["partition-id"])
    arrays = {{k: v.numpy() for k, v in msg.content["arrays"].items()}}
    d = distance(arrays, target(pid, arrays))
    metrics = MetricRecord({{"loss": d, "accuracy": 1.0 / (1.0 + d) + 0.001 * np.random.random(),
                             "num-examples": 5 + pid}})
    return Message(content=RecordDict({{"metrics": metrics}}), reply_to=msg)
"""


def make_app(folder: Path, *, package: str = "tinyapp", rounds: int = 3, lips: bool = False,
             resumable: bool = False, results: bool = False, fail: bool = False, state_dir: bool = False,
             save_model: bool = False) -> Path:
    """Write a tiny Flower App into ``folder`` (see the module docstring); returns ``folder``."""
    extra = ""
    if resumable:
        extra += 'checkpoint-path = ""\nresume = "no"\n'
    if results:
        extra += 'results-path = ""\n'
    if state_dir:
        extra += 'lips-state-dir = ""\n'
    (folder / package).mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT.format(name=package, package=package, rounds=rounds,
                                                            extra=extra))
    (folder / package / "__init__.py").write_text("")
    (folder / package / "server_app.py").write_text(SERVER.format(lips=lips, save_model=save_model))
    (folder / package / "client_app.py").write_text(CLIENT.format(fail=fail))
    return folder
