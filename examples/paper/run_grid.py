"""Run the paper app over experiments x algorithms x seeds, then print a table and plot.

    python examples/paper/run_grid.py examples/paper/conf/fashion-mnist-quick.toml \
        --algorithms fedbn,lips --seeds 0

Each conf file is a run config plus a ``[federation]`` table (its
``num-supernodes`` is the node count). The runs go through the one
experiment runner (:func:`lips_flwr.experiments.runner.sweep.run_sweep`): each is
``<out>/<conf>/<algorithm>-seed<k>.json``, written when the run has finished,
with its identity (app, run config, seed, nodes, engine, code) and
provenance. A finished run of the same identity is reused; a file of other
settings stops the grid before anything runs, naming the keys that differ
(``--recompute`` runs those again and replaces them); two conf files with
one name are an error. A stopped grid continues each stopped run from its
last round next time; a run whose clients all failed (e.g. no dataset) stops
the grid with a non-zero exit and the clients' first error.

The table gives the client-mean test accuracy, mean +- std over seeds, of the
last and the best round, after aggregation (the model clients receive) and
before (the model right after local training), and each algorithm's paired
difference to FedBN on the same seeds, for this grid's runs.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import plot_accuracy  # noqa: E402

from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides  # noqa: E402
from lips_flwr.experiments.runner.runs import RunSpec, run_name  # noqa: E402
from lips_flwr.experiments.runner.store import read_result  # noqa: E402
from lips_flwr.experiments.runner.sweep import SweepFailed, run_sweep  # noqa: E402

APP = Path(__file__).resolve().parent
ROOT = APP.parents[1]


def grid_specs(confs: list[Path], algorithms: list[str], seeds: list[int], overrides: list[str],
               num_nodes: int | None = None, engine: str = "sequential", **options) -> list[RunSpec]:
    """One :class:`RunSpec` per conf file, seed and algorithm (``options``: RunSpec's other fields)."""
    specs = []
    for conf in confs:
        values, federation = parse_overrides([str(conf), *overrides])
        nodes = num_nodes or num_supernodes(federation)
        for seed in seeds:
            for algorithm in algorithms:
                specs.append(RunSpec(APP, run_name(f"{conf.stem}/{algorithm}", seed), seed,
                                     {**values, "algorithm": algorithm}, num_nodes=nodes, engine=engine, **options))
    return specs


def table(results: Path | list[Path]) -> str:
    """Mean +- std over seeds per algorithm, and paired differences to FedBN (a folder, or result files)."""
    paths = sorted(results.glob("*.json")) if isinstance(results, Path) else results
    rows: dict[str, dict[int, dict]] = {}
    for path in paths:
        record = read_result(path).app or {}
        cfg = record["run_config"]
        rows.setdefault(str(cfg["algorithm"]), {})[int(cfg["seed"])] = record["summary"]
    keys = ("acc-after-last", "acc-after-best", "acc-before-last", "acc-before-best")
    lines = [f"{'algorithm':<16}{'seeds':>6}" + "".join(f"{k:>20}" for k in keys)
             + f"{'after-last - fedbn':>22}"]
    base = rows.get("fedbn", {})
    for name, by_seed in sorted(rows.items()):
        cells = []
        for key in keys:
            values = np.array([s[key] for s in by_seed.values() if key in s])
            cells.append(f"{values.mean():.4f} +- {values.std():.4f}" if values.size else "-")
        paired = [by_seed[s]["acc-after-last"] - base[s]["acc-after-last"]
                  for s in by_seed if s in base and name != "fedbn"]
        diff = f"{np.mean(paired):+.4f} (n={len(paired)})" if paired else "-"
        lines.append(f"{name:<16}{len(by_seed):>6}" + "".join(f"{c:>20}" for c in cells) + f"{diff:>22}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("confs", nargs="+", type=Path)
    parser.add_argument("--algorithms", default="fedbn,lips")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides, e.g. num-server-rounds=10")
    parser.add_argument("--cpus-per-client", type=int, default=1)
    parser.add_argument("--gpus-per-client", type=float, default=0.0)
    parser.add_argument("--num-supernodes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "paper")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--engine", choices=("flwr", "batched"), default="batched",
                        help="flwr: `flwr run` (Ray); batched: the batched Grid, a process per run (default)")
    parser.add_argument("--batched-engine", choices=("auto", "sequential", "stacked"), default="auto",
                        help="with --engine batched: clients one after another, or stacked (default: "
                             "stacked on CUDA, else sequential)")
    parser.add_argument("--jobs", type=int, default=1, help="with --engine batched: runs at once")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="with --engine batched: the most clients trained at once")
    parser.add_argument("--recompute", action="store_true",
                        help="run again (and replace) result files computed with other settings")
    args = parser.parse_args()
    # A terminated grid must still stop its SuperLink (the runner's `with` does on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out.resolve()
    engine = "flwr" if args.engine == "flwr" else args.batched_engine
    resources = {"num-cpus": args.cpus_per_client, "num-gpus": args.gpus_per_client}
    try:
        specs = grid_specs(args.confs, args.algorithms.split(","), [int(s) for s in args.seeds.split(",")],
                           args.set, args.num_supernodes, engine, chunk_size=args.chunk_size,
                           client_resources=resources if engine == "flwr" else {})
        paths = run_sweep(specs, out, jobs=args.jobs, recompute=args.recompute, flwr_timeout=args.timeout,
                          progress=lambda line: print(line, flush=True))
    except (SweepFailed, ValueError) as err:
        raise SystemExit(str(err)) from None
    for conf in args.confs:
        mine = [p for p, s in zip(paths, specs) if s.name.startswith(f"{conf.stem}/")]
        print(f"\n{conf.stem}: client-mean test accuracy")
        print(table(mine))
        print(f"plot: {plot_accuracy(out / conf.stem, runs=mine)}")


if __name__ == "__main__":
    main()
