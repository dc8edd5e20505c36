"""The controlled study: LIPS against its controls, tuned on validation only.

1. Selection: every tunable method runs with a validation split carved from
   each client's training data (``val-fraction``) on a *selection seed* that
   the evaluation never uses; the setting with the best validation accuracy
   (client mean after aggregation, averaged over the last 5 evaluated rounds)
   is kept. The test sets are not looked at.
2. Evaluation: each method, with its selected setting, on the evaluation
   seeds (paired: the same partition, initial model and batch order for every
   method of a seed); the table reports test accuracy of those runs only.

    python examples/paper/study.py --out docs/results/fmnist-study        # runs everything
    python examples/paper/study.py --out docs/results/fmnist-study --report-only

Results: ``<out>/select/*.json``, ``<out>/eval/*.json`` (result files of the
one experiment runner, :func:`lips_flwr.experiments.runner.sweep.run_sweep`: a run
of the same identity is reused, a file of other settings, e.g. another conf
file, stops the study before anything runs, naming the keys, unless
``--recompute``), ``<out>/selected.json``, ``<out>/table.md``,
``<out>/accuracy.png`` and inertia heatmaps.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import plot_accuracy, plot_heatmap  # noqa: E402
from run_grid import APP, table  # noqa: E402

from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides  # noqa: E402
from lips_flwr.experiments.runner.runs import RunSpec, run_name  # noqa: E402
from lips_flwr.experiments.runner.store import read_result  # noqa: E402
from lips_flwr.experiments.runner.sweep import SweepFailed, run_sweep  # noqa: E402

# Candidate settings per method; methods absent here have nothing to tune, and
# the LIPS variants reuse the (tau0, every) selected for LIPS.
GRID = {
    "lips": [{"tau0": t, "every": k} for t, k in ((0.3, 5), (0.5, 5), (0.7, 5), (0.5, 3))],
    "fedbn-dropout": [{"dropout": p} for p in (0.1, 0.3)],
    "fedbn-wd": [{"weight-decay": w} for w in (5e-4, 5e-3)],
    "freeze": [{"freeze-round": r} for r in (5, 10)],
}
LIPS_VARIANTS = ("lips-random", "lips-magnitude", "lips-all")
METHODS = ("fedavg", "fedbn", "lips", *LIPS_VARIANTS, "fedbn-dropout", "fedbn-wd", "freeze")


def validation_score(path: Path) -> float:
    """Client-mean validation accuracy after aggregation, mean of the last 5 evaluated rounds."""
    rounds = (read_result(path).app or {})["rounds"]
    series = [m["evaluate"]["val-acc-after"] for _, m in sorted(rounds.items(), key=lambda kv: int(kv[0]))
              if "val-acc-after" in m.get("evaluate", {})]
    return float(np.mean(series[-5:]))


def tag(setting: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in setting.items())


def selection_specs(conf: dict, nodes: int, seed: int, engine: str, **options) -> list[RunSpec]:
    """Every candidate setting of every tunable method, on the selection seed (``<method>-<setting>``)."""
    return [RunSpec(APP, f"{method}-{tag(setting)}", seed, {**conf, **setting, "algorithm": method},
                    num_nodes=nodes, engine=engine, **options)
            for method, settings in GRID.items() for setting in settings]


def evaluation_specs(conf: dict, nodes: int, seeds: list[int], selected: dict, engine: str,
                     **options) -> list[RunSpec]:
    """Each method with its selected setting on each evaluation seed (``<method>-seed<k>``)."""
    return [RunSpec(APP, run_name(method, seed), seed,
                    {**conf, **selected.get(method, {}).get("setting", {}), "algorithm": method},
                    num_nodes=nodes, engine=engine, **options)
            for seed in seeds for method in METHODS]


def select(scores: dict[str, list[tuple[float, dict]]]) -> dict:
    """The best setting per method by validation score; the LIPS variants take LIPS's."""
    selected = {}
    for method, found in scores.items():
        best = max(found, key=lambda s: s[0])
        selected[method] = {"setting": best[1], "validation": {tag(s): v for v, s in found}}
        print(f"selected for {method}: {best[1]} (validation {best[0]:.4f})", flush=True)
    for variant in LIPS_VARIANTS:
        selected[variant] = {"setting": selected["lips"]["setting"], "validation": "as lips"}
    return selected


def run_study(args: argparse.Namespace, out: Path) -> list[Path]:
    """Selection, then evaluation, through the runner; the evaluation's result files."""
    conf, federation = parse_overrides([str(args.conf)])
    nodes = num_supernodes(federation)
    engine = "flwr" if args.engine == "flwr" else "auto"
    sweep = {"jobs": args.jobs, "recompute": args.recompute, "flwr_timeout": args.timeout,
             "progress": lambda line: print(line, flush=True)}
    specs = selection_specs(conf, nodes, args.select_seed, engine)
    paths = run_sweep(specs, out / "select", **sweep)
    scores: dict[str, list[tuple[float, dict]]] = {}
    candidates = [(method, setting) for method, settings in GRID.items() for setting in settings]
    for (method, setting), path in zip(candidates, paths):  # (selection_specs' order)
        scores.setdefault(method, []).append((validation_score(path), setting))
    selected = select(scores)
    (out / "selected.json").write_text(json.dumps(selected, indent=2, sort_keys=True))
    seeds = [int(s) for s in args.seeds.split(",")]
    return run_sweep(evaluation_specs(conf, nodes, seeds, selected, engine), out / "eval", **sweep)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, default=Path(__file__).parent / "conf" / "fashion-mnist-study.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--select-seed", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--report-only", action="store_true", help="only rebuild table and figures")
    parser.add_argument("--engine", choices=("flwr", "batched"), default="batched",
                        help="flwr: `flwr run` (Ray); batched: the batched Grid, a process per run (default)")
    parser.add_argument("--jobs", type=int, default=1, help="with --engine batched: runs at once")
    parser.add_argument("--recompute", action="store_true",
                        help="run again (and replace) result files computed with other settings")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out.resolve()
    eval_dir = out / "eval"
    runs: list[Path] | None = None
    if not args.report_only:
        try:
            runs = run_study(args, out)
        except (SweepFailed, ValueError) as err:
            raise SystemExit(str(err)) from None
    text = table(runs if runs is not None else eval_dir)
    selected = json.loads((out / "selected.json").read_text())
    lines = ["```", text, "```", "", "Selected on validation (selection seed, never the test sets):", ""]
    lines += [f"- {m}: {v['setting']}" for m, v in sorted(selected.items())]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print(text)
    print(f"plot: {plot_accuracy(eval_dir, out / 'accuracy.png', runs=runs)}")
    for method in ("fedbn", "lips"):
        run = eval_dir / f"{method}-seed0.json"
        if run.exists():
            print(f"heatmap: {plot_heatmap(run, out / f'heatmap-{method}.png')}")


if __name__ == "__main__":
    main()
