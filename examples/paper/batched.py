"""Run the paper app in this process on the batched Grid: the same ServerApp and ClientApp as ``flwr run``.

    python examples/paper/batched.py examples/paper/conf/fashion-mnist-quick.toml \
        --set algorithm=lips seed=0 results-path=/tmp/lips-seed0.json

The run config is what ``flwr run`` would give the app: the defaults of
``pyproject.toml`` (``[tool.flwr.app.config]``), then the conf file, then the
overrides. ``run_grid.py --engine batched`` and ``study.py --engine batched``
call :func:`run_paper`.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

APP = Path(__file__).resolve().parent
if str(APP) not in sys.path:  # the app's own package, as `flwr run` puts it on the path
    sys.path.insert(0, str(APP))


def app_defaults() -> dict:
    """The app's run config defaults, ``[tool.flwr.app.config]`` of its ``pyproject.toml``."""
    return dict(tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def run_config(values: dict) -> dict:
    """Defaults updated by ``values``; a key the app does not know is a ``ValueError`` (as ``flwr run``)."""
    config = app_defaults()
    unknown = sorted(set(values) - set(config))
    if unknown:
        raise ValueError(f"unknown run-config keys {unknown}; the app knows {sorted(config)}")
    for key, value in values.items():  # flwr run: an int where the default is a float is that float
        config[key] = float(value) if isinstance(config[key], float) and isinstance(value, int) else value
    return config


def run_paper(values: dict, num_nodes: int, engine: str = "auto", chunk_size: int | None = None) -> str | None:
    """One run of the paper app with run config ``values``; the first client error, if any.

    A ServerApp error propagates. A client that raises gives an error reply
    (the round goes on without it, as under ``flwr run``); the first such
    error is returned, so that a caller can report it when no client trained.
    """
    from lips_paper.client_app import app as client_app
    from lips_paper.server_app import app as server_app

    from lips_flwr.experiments.batched import run_batched

    grid = run_batched(server_app, client_app, run_config=run_config(values), num_nodes=num_nodes,
                       engine=engine, chunk_size=chunk_size)
    return grid.first_error


def main() -> None:
    sys.path.insert(0, str(APP))
    from run_grid import parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("conf", type=Path)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--num-supernodes", type=int, default=None)
    parser.add_argument("--engine", default="auto", choices=("auto", "sequential", "stacked"))
    parser.add_argument("--chunk-size", type=int, default=None)
    args = parser.parse_args()
    conf = tomllib.loads(args.conf.read_text())
    nodes = args.num_supernodes or conf.pop("federation", {}).get("num-supernodes", 10)
    conf.pop("federation", None)
    conf.update(parse_overrides(args.set))
    error = run_paper(conf, nodes, args.engine, args.chunk_size)
    if error:
        print(f"a client failed; the first error:\n{error}", file=sys.stderr)


if __name__ == "__main__":
    main()
