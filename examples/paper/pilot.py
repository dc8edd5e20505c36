"""The inertia pilot (PILOT.md): its runs and its analysis.

    python examples/paper/pilot.py run --jobs 2    # every run not finished yet (stop and re-run at will)
    python examples/paper/pilot.py run --cells resnet8-n100,resnet8-n50 --jobs 2
    python examples/paper/pilot.py report          # docs/results/pilot/: report.md, report.json, heatmaps
    python examples/paper/pilot.py report --results DIR --out OUT

``run`` makes the pilot's FedBN runs through the project's experiment runner
(:func:`lips_flwr.experiments.runner.run_sweep`): one result file per run,
``docs/results/pilot/<cell>/fedbn-seed<k>.json``, with the run's identity and
provenance; a finished run is reused, a stopped one continues from its last
round, a file of other settings is refused. Cells go one model at a time, seed
by seed (PILOT.md: pair the runs of one model), ResNet8's first.

``report`` reads every cell folder of ``--results`` (a folder holding
``<method>-seed<k>.json`` result files) and, from each FedBN run, computes
what PILOT.md fixed before any pilot run: the study's inertia statistic and
rule (``prereg.inertia_rho``, unchanged), the per-layer relative-step heatmap,
and how often the inertia trigger's rule (``lips_flwr.core.trigger``, its
defaults) would have fired, replayed offline on the run's own relative steps.
A cell where inertia arises in every seed (at least two) gets a confirmatory
study proposal with its CPU cost, measured from the cell's own runs.

"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np

APP = Path(__file__).resolve().parent
sys.path.insert(0, str(APP))
from prereg import LAST, endpoint, inertia_rho, load_folder, series  # noqa: E402
from provenance import provenance  # noqa: E402

from lips_flwr.core.schedule import MaskSchedule  # noqa: E402
from lips_flwr.core.trigger import DEFAULT_FACTOR, DEFAULT_WINDOW, InertiaTrigger  # noqa: E402
from lips_flwr.experiments.runner import RunSpec, run_sweep  # noqa: E402
from lips_flwr.experiments.runner.apps import num_supernodes, parse_overrides  # noqa: E402
from lips_flwr.experiments.runner.runs import run_name  # noqa: E402

OUT = APP.parents[1] / "docs" / "results" / "pilot"
BASE = "fedbn"  # the pilot runs FedBN only
CONFIRMATORY_RUNS = 18  # FedBN, LIPS and LIPS-inertia on 6 new paired seeds
STEP = "inertia-rel-step/"
CELLS = ("resnet8-n100", "resnet8-n50", "vgg6-n100", "vgg6-n50")  # PILOT.md's table, in run order
SEEDS = (2000, 2001)


@cache
def weight_layers(model: str, dataset: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(every weight layer in the model's order, the middle ones LIPS masks) of ``model`` for ``dataset``."""
    from lips_flwr.core.layers import candidate_names, select_layers
    from lips_flwr.experiments.task.data import DATASET_INFO
    from lips_flwr.experiments.task.models import build_model

    classes, channels = DATASET_INFO[dataset]
    state = {k: v.numpy() for k, v in build_model(model, classes, channels).state_dict().items()}
    return tuple(candidate_names(state)), tuple(select_layers(state, "middle"))


def layers_of(data: dict) -> tuple[list[str], list[str], list[str]]:
    """(all weight layers in order, the middle ones, the first and last) of a run's model."""
    names, middle = weight_layers(str(data["run_config"]["model"]), str(data["run_config"]["dataset"]))
    return list(names), list(middle), [n for n in names if n not in middle]


def replay_trigger(data: dict, window: int = DEFAULT_WINDOW, factor: float = DEFAULT_FACTOR) -> list[dict]:
    """The inertia trigger's decision on each mask round of the schedule, from the run's recorded steps.

    As LIPS in server mode: for each round in order, the round's
    ``inertia-rel-step/<layer>`` of every weight layer is recorded (but a
    layer's first step after a mask that zeroed it), then on a mask round of
    ``MaskSchedule(T, every=every)`` the trigger decides on the steps up to
    that round. A run that masked (``lips-mask-round`` 1) has its masks noted
    from its ``lips-zeros/<layer>`` metrics; a FedBN run never masks.
    """
    conf = data["run_config"]
    last, every = int(conf["num-server-rounds"]), int(conf["every"])
    names, middle, _ = layers_of(data)
    schedule = MaskSchedule(last, 0.5, every)  # (only which rounds are mask rounds matters here)
    trigger = InertiaTrigger(window, factor, every)
    decisions = []
    for t in range(1, last + 1):
        train = data["rounds"].get(str(t), {}).get("train", {})
        steps = {n: float(train[STEP + n]) for n in names if STEP + n in train}
        if steps:
            trigger.record(t, steps, exclude=trigger.unmeasured_mask())
        if schedule.is_mask_round(t):
            decision = trigger.decide(t, t, names, middle)
            decisions.append({"round": t, "ready": decision.ready, "stagnant": decision.stagnant,
                              "ratios": decision.ratios, "edge": decision.edge})
        if train.get("lips-mask-round"):
            trigger.note_mask(t, [n for n in names if f"lips-zeros/{n}" in train])
    return decisions


def firing(decisions: list[dict], middle: int) -> dict:
    """Mask rounds where the trigger was ready, those where it fired, and the stagnant layer-rounds."""
    ready = [d for d in decisions if d["ready"]]
    fired = [d for d in ready if d["stagnant"]]
    layer_rounds = sum(len(d["stagnant"]) for d in ready)
    return {"ready": len(ready), "fired": len(fired), "fired_rounds": [d["round"] for d in fired],
            "rate": len(fired) / len(ready) if ready else None,
            "stagnant_layer_rounds": layer_rounds, "layer_rounds": len(ready) * middle}


def run_seconds(data: dict) -> float:
    """The run's recorded time: the last round's ``seconds``, summed over the segments of a continued run."""
    total, previous = 0.0, 0.0
    for t in sorted(int(r) for r in data["rounds"]):
        now = float(data["rounds"][str(t)].get("seconds", previous))
        if now < previous:  # a continued run's clock starts again
            total += previous
        previous = now
    return total + previous


def analyse_run(data: dict) -> dict:
    """One FedBN run: its endpoint, every layer's ``rho``, its groups and the rule, the trigger's firing."""
    names, middle, edges = layers_of(data)
    rho = inertia_rho(data, middle, edges)
    out = {"seed": int(data["run_config"]["seed"]), "endpoint": endpoint(data), "seconds": run_seconds(data),
           "inertia": rho, "trigger": firing(replay_trigger(data), len(middle))}
    if rho is not None:
        groups = {"first": rho["rho"][names[0]], "middle": rho["middle"], "last": rho["rho"][names[-1]]}
        out["groups"] = groups
    return out


def analyse_cell(folder: Path) -> dict | None:
    """Every FedBN run of a cell folder, whether inertia arises in the cell, and the trigger pooled."""
    runs = load_folder(folder).get(BASE, {})
    if not runs:
        return None
    results = [analyse_run(runs[s]) for s in sorted(runs)]
    names, _, _ = layers_of(runs[min(runs)])
    rhos = [r["inertia"] for r in results if r["inertia"] is not None]
    arises = sum(r["arises"] for r in rhos)
    ready = sum(r["trigger"]["ready"] for r in results)
    fired = sum(r["trigger"]["fired"] for r in results)
    return {"runs": results, "layers": names, "seeds": len(results), "measured": len(rhos),
            "arises_in": arises,
            "arises": len(rhos) >= 2 and len(rhos) == len(results) and arises == len(rhos),
            "trigger": {"ready": ready, "fired": fired, "rate": fired / ready if ready else None},
            "run_hours": float(np.mean([r["seconds"] for r in results])) / 3600}


def heatmap(folder: Path, out: Path) -> Path | None:
    """``log10 r_l(t)`` per layer (rows, first at the top) and round, one panel per FedBN seed, one scale."""
    runs = load_folder(folder).get(BASE, {})
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(runs)
    names, _, _ = layers_of(runs[seeds[0]])
    last = int(runs[seeds[0]]["run_config"]["num-server-rounds"])
    grids = []
    for seed in seeds:
        rows = [series(runs[seed], "train", STEP + n) for n in names]
        grid = np.array([[row.get(t, np.nan) for t in range(1, last + 1)] for row in rows])
        grids.append(np.log10(np.maximum(grid, 1e-6)))
    found = np.concatenate([g[np.isfinite(g)] for g in grids] + [np.zeros(0)])
    low, high = (found.min(), found.max()) if found.size else (0.0, 1.0)
    fig, axes = plt.subplots(1, len(seeds), figsize=(6 * len(seeds), 0.3 * len(names) + 1.8), squeeze=False)
    for ax, seed, grid in zip(axes[0], seeds, grids):
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=low, vmax=high,
                          extent=(0.5, last + 0.5, len(names) - 0.5, -0.5))
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set(xlabel="round", title=f"{folder.name}, FedBN seed {seed}: log10 relative step")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- report

def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cell_lines(name: str, cell: dict, figure: Path | None) -> list[str]:
    """Markdown for one cell: per seed the rule and the trigger, then every layer's ``rho``."""
    lines = [f"## {name}", "",
             "| seed | endpoint (acc-after, last 10) | rho first layer | rho middle (median) "
             "| rho last layer | first/last mean | inertia arises | trigger fired (mask rounds) "
             "| stagnant layer-rounds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in cell["runs"]:
        rho, groups, trig = r["inertia"], r.get("groups", {}), r["trigger"]
        arises = "-" if rho is None else "yes" if rho["arises"] else "no"
        lines.append(f"| {r['seed']} | {_num(r['endpoint'])} | {_num(groups.get('first'))} | "
                     f"{_num(groups.get('middle'))} | {_num(groups.get('last'))} | "
                     f"{_num(rho['edges'] if rho else None)} | {arises} | {trig['fired']} of "
                     f"{trig['ready']} | {trig['stagnant_layer_rounds']} of {trig['layer_rounds']} |")
    verdict = "arises" if cell["arises"] else "does not arise"
    rate = "-" if cell["trigger"]["rate"] is None else f"{100 * cell['trigger']['rate']:.1f}%"
    lines += ["", f"Inertia arises in {cell['arises_in']} of {cell['seeds']} seeds ({cell['measured']} "
                  f"measured): it **{verdict}** in this cell (PILOT.md: it must arise in every seed). The "
                  f"inertia trigger would have fired in {cell['trigger']['fired']} of "
                  f"{cell['trigger']['ready']} mask rounds ({rate}), replayed on FedBN's runs.", ""]
    measured = [r for r in cell["runs"] if r["inertia"] is not None]
    if measured:
        lines += ["| layer | " + " | ".join(f"rho, seed {r['seed']}" for r in measured) + " |",
                  "| --- | " + " | ".join("---" for _ in measured) + " |"]
        lines += [f"| `{layer}` | " + " | ".join(f"{r['inertia']['rho'][layer]:.4f}" for r in measured) + " |"
                  for layer in cell["layers"]]
    if figure is not None:
        lines += ["", f"![{name}: log10 relative step per layer and round]({figure.name})"]
    return lines + [""]


def decision_lines(cells: dict, missing: tuple[str, ...] = ()) -> list[str]:
    """PILOT.md's decision rule applied: a proposal per cell with inertia, or the plain conclusion.

    ``missing`` are PILOT.md's cells without result files: the conclusion is then about the measured
    cells only, and says which cells it waits for.
    """
    lines = ["## Decision (PILOT.md)", ""]
    if missing:
        lines += [f"Not run yet: {', '.join(missing)}. What follows is about the measured cells only.", ""]
    with_inertia = [n for n, c in cells.items() if c["arises"]]
    for name in with_inertia:
        hours = CONFIRMATORY_RUNS * cells[name]["run_hours"]
        lines.append(f"- **{name}**: inertia arises in every seed. Proposed: a confirmatory, pre-registered "
                     f"study of FedBN, LIPS and LIPS-inertia on 6 new paired seeds in this cell "
                     f"({CONFIRMATORY_RUNS} runs), about {hours:.1f} run-hours ({hours / 2:.1f} hours at two "
                     "at a time on 2 cores), from this cell's FedBN runs' recorded time.")
    for name, cell in cells.items():
        if not cell["arises"] and cell["arises_in"]:
            lines.append(f"- {name}: inertia arises in {cell['arises_in']} of {cell['seeds']} seeds only; "
                         "no confirmatory study (PILOT.md).")
    if not with_inertia and missing:
        lines.append(f"No measured cell ({', '.join(cells)}) shows inertia by the study's rule; the pilot's "
                     f"decision waits for {', '.join(missing)}.")
    elif not with_inertia:
        lines.append("No cell shows inertia by the study's rule: the paper's premise, layer-wise inertia of "
                     "the middle layers, did not reproduce offline at these scales.")
    return lines + [""]


def report(results: Path, out: Path) -> dict:
    """``report.md``, ``report.json`` and a heatmap per cell into ``out`` from ``results``' cell folders."""
    folders = sorted(f for f in results.iterdir() if f.is_dir() and any(f.glob("*-seed*.json")))
    cells = {f.name: c for f in folders if (c := analyse_cell(f)) is not None}
    if not cells:
        raise SystemExit(f"no FedBN result files in the cell folders of {results}")
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Inertia pilot: results", "",
             "Protocol: [examples/paper/PILOT.md](../../../examples/paper/PILOT.md). Generated by "
             "`examples/paper/pilot.py report`; the numbers and their provenance are in `report.json`. "
             f"`rho` = late (last {LAST} rounds) / early (rounds 2-6) mean relative step of a layer; inertia "
             "arises in a run when the middle layers' median `rho` is below half the first and last layers' "
             "mean.", "", *decision_lines(cells, tuple(c for c in CELLS if c not in cells))]
    figures = []
    for f in folders:
        if f.name in cells:
            figure = heatmap(f, out / f"{f.name}-relative-step.png")
            figures += [figure] if figure else []
            lines += cell_lines(f.name, cells[f.name], figure)
    paths = [out / "report.md", out / "report.json", *figures]
    inputs = sorted(p for f in folders for p in f.glob(f"{BASE}-seed*.json"))
    paths[0].write_text("\n".join(lines) + "\n")
    record = {"cells": cells, "provenance": provenance(inputs, paths, Path(__file__)),
              "rule": {"early": [2, 6], "late_rounds": LAST, "factor": 0.5, "cell": "every seed, at least 2"},
              "trigger": {"window": DEFAULT_WINDOW, "factor": DEFAULT_FACTOR, "mode": "server, replayed"}}
    paths[1].write_text(json.dumps(record, indent=1, sort_keys=True, default=float) + "\n")
    print("\n".join(lines))
    return record


def run_specs(cells: tuple[str, ...] = CELLS, seeds: tuple[int, ...] = SEEDS,
              engine: str = "auto") -> list[RunSpec]:
    """The pilot's runs (PILOT.md): FedBN on each cell's conf file, seed by seed, in the cells' order."""
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        raise SystemExit(f"unknown cells {unknown}; the pilot's cells are {list(CELLS)}")
    specs = []
    for cell in cells:
        values, federation = parse_overrides([str(APP / "conf" / f"pilot-{cell}.toml")])
        for seed in seeds:
            specs.append(RunSpec(APP, run_name(f"{cell}/{BASE}", seed), seed, {**values, "algorithm": BASE},
                                 num_nodes=num_supernodes(federation), engine=engine,
                                 location_keys=("dataset-path",)))
    return specs


def run(results: Path, cells: tuple[str, ...], jobs: int, recompute: bool = False) -> list[Path]:
    """Every pilot run of ``cells`` not finished yet into ``results`` (see the module docstring)."""
    specs = run_specs(cells)
    print(f"{len(specs)} pilot runs ({jobs} at a time; finished ones are reused)", flush=True)
    return run_sweep(specs, results, jobs=jobs, recompute=recompute,
                     progress=lambda line: print(line, flush=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("run", "report"))
    parser.add_argument("--results", type=Path, default=OUT, help="the folder of cell folders")
    parser.add_argument("--out", type=Path, default=None, help="where the report goes (default: --results)")
    parser.add_argument("--cells", default=",".join(CELLS), help="run: the cells to run, comma-separated")
    parser.add_argument("--jobs", type=int, default=1, help="run: runs at once")
    parser.add_argument("--recompute", action="store_true",
                        help="run: run again (and replace) result files of other settings")
    args = parser.parse_args()
    if args.what == "run":
        run(args.results.resolve(), tuple(args.cells.split(",")), args.jobs, args.recompute)
    report(args.results.resolve(), (args.out or args.results).resolve())


if __name__ == "__main__":
    main()
