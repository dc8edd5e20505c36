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

Results: ``<out>/select/*.json``, ``<out>/eval/*.json``, ``<out>/selected.json``,
``<out>/table.md``, ``<out>/accuracy.png`` and inertia heatmaps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tomllib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import plot_accuracy, plot_heatmap  # noqa: E402
from run_grid import ROOT, run_one, run_one_batched, table  # noqa: E402

from lips_flwr.experiments.local_flower import local_flower  # noqa: E402

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
    rounds = json.loads(path.read_text())["rounds"]
    series = [m["evaluate"]["val-acc-after"] for _, m in sorted(rounds.items(), key=lambda kv: int(kv[0]))
              if "val-acc-after" in m.get("evaluate", {})]
    return float(np.mean(series[-5:]))


def tag(setting: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in setting.items())


def run_into(flower, conf: dict, federation: str, method: str, seed: int, results: Path,
             timeout: float, nodes: int = 10, engine: str = "auto") -> None:
    """:func:`run_one`, whose results become ``results`` only if the run succeeded.

    The study skips runs whose results exist: a run that failed or was stopped
    half-way must leave none behind, or the next invocation would take it as done.
    """
    partial = results.with_name(f".{results.name}.partial")
    try:
        if flower is None:  # the batched Grid, in this process
            run_one_batched(conf, nodes, method, seed, partial, engine, name=results.parent.name)
        else:
            run_one(flower, conf, federation, method, seed, partial, timeout, name=results.parent.name)
        os.replace(partial, results)
    finally:
        partial.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conf", type=Path, default=Path(__file__).parent / "conf" / "fashion-mnist-study.toml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--select-seed", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--report-only", action="store_true", help="only rebuild table and figures")
    parser.add_argument("--engine", choices=("flwr", "batched"), default="batched",
                        help="flwr: `flwr run` (Ray); batched: the batched Grid in this process (default)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out.resolve()
    conf = tomllib.loads(args.conf.read_text())
    nodes = conf.pop("federation", {}).get("num-supernodes", 10)
    federation = f"num-supernodes={nodes} client-resources-num-cpus=1"
    select_dir, eval_dir = out / "select", out / "eval"
    for folder in (select_dir, eval_dir):
        folder.mkdir(parents=True, exist_ok=True)

    if not args.report_only:
        with contextlib.ExitStack() as stack:
            flower = None if args.engine == "batched" else stack.enter_context(local_flower(
                out / ".flwr_home", pythonpath=[str(ROOT), str(Path(__file__).parent)], cwd=ROOT))
            selected = {}
            for method, settings in GRID.items():
                scores = []
                for setting in settings:
                    results = select_dir / f"{method}-{tag(setting)}.json"
                    if not results.exists():
                        run_into(flower, {**conf, **setting}, federation, method, args.select_seed,
                                 results, args.timeout, nodes)
                    scores.append((validation_score(results), setting))
                best = max(scores, key=lambda s: s[0])
                selected[method] = {"setting": best[1], "validation": {tag(s): v for v, s in scores}}
                print(f"selected for {method}: {best[1]} (validation {best[0]:.4f})", flush=True)
            for variant in LIPS_VARIANTS:
                selected[variant] = {"setting": selected["lips"]["setting"], "validation": "as lips"}
            (out / "selected.json").write_text(json.dumps(selected, indent=2, sort_keys=True))
            for seed in (int(s) for s in args.seeds.split(",")):
                for method in METHODS:
                    setting = selected.get(method, {}).get("setting", {})
                    results = eval_dir / f"{method}-seed{seed}.json"
                    if not results.exists():
                        run_into(flower, {**conf, **setting}, federation, method, seed, results, args.timeout,
                                 nodes)

    text = table(eval_dir)
    selected = json.loads((out / "selected.json").read_text())
    lines = ["```", text, "```", "", "Selected on validation (selection seed, never the test sets):", ""]
    lines += [f"- {m}: {v['setting']}" for m, v in sorted(selected.items())]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print(text)
    print(f"plot: {plot_accuracy(eval_dir, out / 'accuracy.png')}")
    for method in ("fedbn", "lips"):
        run = eval_dir / f"{method}-seed0.json"
        if run.exists():
            print(f"heatmap: {plot_heatmap(run, out / f'heatmap-{method}.png')}")


if __name__ == "__main__":
    main()
